"""``helix plan --from``: evaluate an existing placement (a plan.yaml or a reference *_sol.ini
layout) and improve on it; a layout that does not match the cluster is a one-line error."""

from pathlib import Path

import pytest

from helix.cli import main
from helix.core.errors import HelixUserError
from helix.core.plan import Plan
from planner.flowgraph import max_flow
from planner.search.baselines import swarm
from planner.reference import reference_single24_70b
from planner.solve import solve

REPO = Path(__file__).resolve().parents[2]
REFERENCE = str(REPO / "cluster_specs" / "reference" / "helix-single24-70b.yaml")


def _sol_ini(path: Path, ranges: dict[int, tuple[int, int]], offset: int = 2) -> Path:
    lines = ["[Settings]", f"offset={offset}", "", "[Solution]"]
    lines += [f"compute_node_{i + offset}={list(range(s, e))}" for i, (s, e) in ranges.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_solve_never_returns_less_than_its_start():
    p = reference_single24_70b()
    start = swarm(p, 0)
    plan = solve(p, "milp", start=start, warm_starts=False, time_limit_s=2.0, threads=1)
    assert plan.max_flow_tokens_per_s >= max_flow(p, start).value_tokens_per_s - 1e-6
    with pytest.raises(HelixUserError, match="unknown node 'h100-0'"):
        solve(p, "milp", start={"h100-0": (0, 80)}, time_limit_s=1.0, threads=1)


def test_from_plan_yaml_and_from_ini_layout(tmp_path, capsys):
    out = tmp_path / "petals.yaml"
    assert main(["plan", REFERENCE, "--method", "petals", "-o", str(out), "--threads", "1"]) == 0
    petals_flow = Plan.load(out).max_flow_tokens_per_s
    capsys.readouterr()
    assert main(["plan", REFERENCE, "--from", str(out), "--time-limit", "2", "--threads", "1",
                 "--gap", "0.5", "-o", str(tmp_path / "better.yaml")]) == 0
    text = capsys.readouterr().out
    assert f"max flow {petals_flow:,.1f} tokens/s on this cluster" in text
    assert Plan.load(tmp_path / "better.yaml").max_flow_tokens_per_s >= petals_flow - 1e-6
    # The same cluster's nodes by position: 4 A100s (0-3) then 8 L4s then 12 T4s. One A100 chain
    # is not enough for 80 layers; 0-3 hold 12 each, 4-7 (L4s) 7 each and 8 (a T4) 4: 80.
    ranges, s = {}, 0
    for i, k in [(0, 12), (1, 12), (2, 12), (3, 12), (4, 7), (5, 7), (6, 7), (7, 7), (12, 4)]:
        ranges[i] = (s, s + k)
        s += k
    layout = _sol_ini(tmp_path / "chain_sol.ini", ranges)
    assert main(["plan", REFERENCE, "--from", str(layout), "--method", "swarm",
                 "--threads", "1"]) == 0
    text = capsys.readouterr().out
    assert "9 nodes hold layers; max flow 532.0 tokens/s" in text  # the L4s' T(7) = 532
    assert "swarm is a baseline heuristic" in text


@pytest.mark.parametrize("ranges,offset,message", [
    ({30: (0, 80)}, 2, "node index 30 is outside the cluster's 24 nodes"),
    ({0: (0, 12)}, 0, None),  # fine: a placement need not serve (max flow 0)
    ({0: (75, 87)}, 2, r"holds layers \[75, 87\), outside the model's \[0, 80\)"),
    ({0: (0, 13)}, 2, r"a100-0 \(A100-40G.*\) cannot hold 13 layers \[0, 13\): it holds at most 12"),
])
def test_a_layout_that_does_not_match_is_one_line(tmp_path, capsys, ranges, offset, message):
    layout = _sol_ini(tmp_path / "sol.ini", ranges, offset)
    code = main(["plan", REFERENCE, "--from", str(layout), "--method", "petals", "--threads", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    if message is None:
        assert code == 0
        return
    assert code != 0 and len(err) == 1, err
    assert pytest.importorskip("re").search(message, err[0]), err[0]


def test_a_plan_for_other_nodes_is_one_line(tmp_path, capsys):
    out = tmp_path / "petals.yaml"
    assert main(["plan", REFERENCE, "--method", "petals", "-o", str(out), "--threads", "1"]) == 0
    out.write_text(out.read_text().replace("node: a100-0", "node: a100-77"))
    capsys.readouterr()
    assert main(["plan", REFERENCE, "--from", str(out), "--method", "petals"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown node 'a100-77'" in err[0]
    assert main(["plan", REFERENCE, "--from", str(tmp_path / "none.ini")]) != 0
    assert "no such file" in capsys.readouterr().err


def test_reference_ilp_layout_as_a_start(shared_data, tmp_path, capsys):
    """The reference ILP's 3cluster24 layout scores its published 1212.18 on the converted
    cluster, and the planner started from it returns at least that."""
    ref = shared_data / "reference_cases"
    cluster = tmp_path / "3cluster24.yaml"
    assert main(["convert", str(ref / "3cluster24.ini"), str(ref / "machine_profiles_3cluster24.ini"),
                 "-o", str(cluster), "--throughput-tables", str(ref / "throughput_tables.yaml")]) == 0
    capsys.readouterr()
    assert main(["plan", str(cluster), "--from", str(ref / "3cluster24_ilp_sol.ini"),
                 "--time-limit", "3", "--threads", "1", "-o", str(tmp_path / "plan.yaml")]) == 0
    assert "max flow 1,212.2 tokens/s on this cluster" in capsys.readouterr().out
    assert Plan.load(tmp_path / "plan.yaml").max_flow_tokens_per_s >= 1212.17
