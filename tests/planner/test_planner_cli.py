"""``helix plan`` from the command line: table, -o, --json, --draw, --compare, one-line errors."""

import json
from pathlib import Path

import pytest

from helix.cli import main
from helix.core.plan import Plan

REPO = Path(__file__).resolve().parents[2]
REFERENCE = str(REPO / "cluster_specs" / "reference" / "helix-single24-70b.yaml")


def test_plan_writes_yaml_json_and_png(tmp_path, capsys):
    out, png = tmp_path / "plan.yaml", tmp_path / "plan.png"
    assert main(["plan", REFERENCE, "-o", str(out), "--draw", str(png), "--json", "--threads", "1",
                 "--gap", "0.02"]) == 0
    data = json.loads(capsys.readouterr().out)
    plan = Plan.load(out)
    assert data["max_flow_tokens_per_s"] == plan.max_flow_tokens_per_s >= 2000
    assert plan.gap <= 0.02 and plan.spec_hash
    assert png.stat().st_size > 10_000


def test_plan_draws_html_with_kv_capacity(tmp_path, capsys):
    page = tmp_path / "plan.html"
    assert main(["plan", REFERENCE, "--method", "uniform", "--draw", str(page), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    text = page.read_text(encoding="utf-8")
    for node, tokens in plan["serving"]["kv_capacity_tokens"].items():
        assert f'data-node="{node}"' in text and f"{tokens:,} tokens" in text


def test_plan_table_and_compare(capsys):
    assert main(["plan", REFERENCE, "--method", "petals", "--threads", "1"]) == 0
    text = capsys.readouterr().out
    assert "max flow" in text and "a100-0" in text
    assert main(["plan", REFERENCE, "--compare", "--time-limit", "2", "--threads", "1"]) == 0
    text = capsys.readouterr().out
    for method in ("milp", "milp-paper", "petals", "swarm", "separate", "uniform"):
        assert method in text
    assert "infeasible" in text  # separate: no GPU kind holds 80 layers alone


def test_bad_method_is_one_line(capsys):
    assert main(["plan", REFERENCE, "--method", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown method 'nope'" in err[0] and "petals" in err[0]


def test_compare_with_two_threads_after_one(capsys):
    """The CLI's default --threads is the core count (2 here); HiGHS runs with 1 thread first (the
    warm-start LP) must not break the later 2-thread MILPs (they used to report a bound of 0)."""
    local3 = str(REPO / "cluster_specs" / "local3.yaml")
    assert main(["plan", local3, "--threads", "1", "--time-limit", "5", "--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert main(["plan", local3, "--compare", "--threads", "2", "--time-limit", "5", "--json"]) == 0
    plans = {p["method"]: p for p in json.loads(capsys.readouterr().out) if p}
    best = max(p["max_flow_tokens_per_s"] for p in plans.values())
    assert best == pytest.approx(one["max_flow_tokens_per_s"], rel=0.02)
    for p in plans.values():
        assert p["upper_bound_tokens_per_s"] >= best * (1 - 1e-6), p["method"]
    assert plans["milp"]["extras"]["status"] in ("optimal", "gap", "feasible")


@pytest.mark.parametrize("args, message", [
    (["--gap", "-1"], "--gap must be >= 0"),
    (["--time-limit", "-1"], "--time-limit must be > 0"),
    (["--threads", "-2"], "--threads must be >= 0"),
    (["-o", "/nonexistent-helix-dir/sub/p.yaml"], "folder /nonexistent-helix-dir/sub does not exist"),
    (["--draw", "/tmp/helix-plan.txt"], "must end in .png"),
    (["--draw", "/nonexistent-helix-dir/p.png"], "folder /nonexistent-helix-dir does not exist"),
])
def test_bad_options_are_one_line_before_solving(args, message, capsys):
    assert main(["plan", REFERENCE, *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_max_depth_bound_is_labelled_as_restricted(capsys):
    assert main(["plan", REFERENCE, "--max-depth", "20", "--time-limit", "3", "--threads", "1"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "proven only for placements with every node >= 4 layers and no partial inference" in text
