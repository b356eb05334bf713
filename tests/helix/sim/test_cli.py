import dataclasses
import json
from pathlib import Path

import pytest

from helix.cli import main
from helix.core.spec import load_cluster
from tests.builders.sims import single24_plan

REPO = Path(__file__).resolve().parents[3]
SINGLE24 = REPO / "cluster_specs" / "single24.yaml"


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("plan") / "plan.yaml"
    single24_plan(load_cluster(SINGLE24)).save(path)
    return path


def test_simulate_writes_json_and_plots(plan_file, tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = main(["simulate", str(SINGLE24), "--plan", str(plan_file), "--duration", "20",
               "--json", str(out), "--plot", str(tmp_path / "png")])
    assert rc == 0
    d = json.loads(out.read_text())
    assert d["mode"] == "offline" and d["scheduler"] == "helix" and d["duration_s"] == 20
    assert d["decode_throughput_tokens_per_s"] > 0 and d["tokens_generated"] > 0
    assert set(d["node_utilization"]) == {f"a100-{i}" for i in range(4)} | {f"l4-{i}" for i in range(8)}
    assert any(0 < u <= 1 for u in d["node_utilization"].values())
    for name in ("throughput.png", "latency_cdf.png", "node_utilization.png"):
        assert (tmp_path / "png" / name).stat().st_size > 1000
    # The default offline replay draws lengths from the whole trace; the steady state is the
    # second half's rate, beside the whole run's.
    assert d["offline_replay"] == "stationary" and d["steady_from_s"] == 10
    assert 0 < d["steady_decode_throughput_tokens_per_s"] <= max(d["throughput_timeline_tokens_per_s"])
    text = " ".join(capsys.readouterr().out.replace("│", " ").replace("┃", " ").split())
    for words in ("decode tok/s decode tok/s", "whole run steady", "lengths drawn at random from "
                  "the whole conv trace (--seed 0;", "steady: decode tok/s over 10-20 s"):
        assert words in text


def test_offline_in_order_and_seeds(plan_file, tmp_path, capsys):
    runs = {}
    for name, extra in (("in-order", ["--in-order"]), ("seed0", []), ("seed0-again", []),
                        ("seed5", ["--seed", "5"])):
        out = tmp_path / f"{name}.json"
        assert main(["simulate", str(SINGLE24), "--plan", str(plan_file), "--duration", "8",
                     "--json", str(out), *extra]) == 0
        runs[name] = json.loads(out.read_text())
    text = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "replay: the conv trace in its order (--in-order)" in text
    assert runs["in-order"]["offline_replay"] == "in-order"
    same = ("tokens_generated", "throughput_timeline_tokens_per_s", "ttft")
    assert all(runs["seed0"][k] == runs["seed0-again"][k] for k in same)
    assert runs["seed0"]["ttft"] != runs["seed5"]["ttft"]
    assert runs["seed0"]["ttft"] != runs["in-order"]["ttft"]


def test_offline_help_says_which_replay(capsys):
    assert main(["simulate", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "--in-order" in text and "replay the trace as it is, in its order" in text
    assert "lengths drawn at random (with --seed) from the whole trace" in text
    assert "steady state over the run's second half" in text


def test_online_with_poisson_and_swarm(plan_file, tmp_path):
    out = tmp_path / "r.json"
    rc = main(["simulate", str(SINGLE24), "--plan", str(plan_file), "--mode", "online",
               "--rate", "0.5", "--poisson", "--num-requests", "8", "--scheduler", "swarm",
               "--duration", "0", "--chunk-tokens", "256", "--json", str(out),
               "--event-log", str(tmp_path / "events.csv")])
    assert rc == 0
    lines = (tmp_path / "events.csv").read_text().splitlines()
    assert lines[0] == "time_s,event,subject" and lines[1].endswith(",RequestArrival,request 0")
    d = json.loads(out.read_text())
    assert d["requests_arrived"] == 8 and d["requests_completed"] == 8
    assert d["tokens_generated"] == d["tokens_requested_completed"]


def test_online_rate_holds_over_the_simulated_window(plan_file, tmp_path):
    # Issue #12: the trace's start runs below its mean; at --rate 0.93 for 120 s the old rescale
    # delivered 34 arrivals where 112 are expected.
    out = tmp_path / "r.json"
    rc = main(["simulate", str(SINGLE24), "--plan", str(plan_file), "--mode", "online",
               "--rate", "0.93", "--duration", "120", "--json", str(out)])
    assert rc == 0
    d = json.loads(out.read_text())
    assert d["requests_arrived"] == round(0.93 * 120)


@pytest.mark.parametrize("args, message", [
    (["--mode", "sideways"], "--mode"),
    (["--scheduler", "fastest"], "--scheduler"),
    (["--trace", "/no/such.csv"], "no such file"),
    (["--high-water", "1.5"], "--high-water"),
    (["--mode", "online", "--in-order"], "--in-order is for --mode offline"),
])
def test_bad_options_are_one_line_errors(plan_file, capsys, args, message):
    rc = main(["simulate", str(SINGLE24), "--plan", str(plan_file), "--duration", "1", *args])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("args, message", [
    (["--num-requests", "0"], "--num-requests must be >= 1, got 0"),
    (["--num-requests", "-3"], "--num-requests must be >= 1, got -3"),
    (["--duration", "-1"], "--duration must be"),
    (["--duration", "nan"], "--duration must be"),
    (["--mode", "online", "--load", "0"], "--load must be > 0"),
    (["--mode", "online", "--load", "-0.5"], "--load must be > 0"),
    (["--load", "inf"], "--load must be > 0"),
    (["--mode", "online", "--rate", "0"], "--rate must be > 0"),
    (["--mode", "online", "--rate", "-2"], "--rate must be > 0"),
    (["--chunk-tokens", "-1"], "--chunk-tokens must be >= 0 (0 = off), got -1"),
    (["--high-water", "0"], "--high-water must be in (0, 1], got 0"),
    (["--high-water", "nan"], "--high-water must be in (0, 1]"),
    (["--max-prompt", "0"], "--max-prompt must be >= 1"),
    (["--max-output", "-5"], "--max-output must be >= 1"),
    (["--time-limit", "-1"], "--time-limit must be > 0"),
])
def test_out_of_range_numbers_are_one_line_errors(plan_file, capsys, args, message):
    # Each of these used to run (0 requests meant "all", rate 0 meant "use --load") or failed
    # with a message that did not name the option and its value.
    rc = main(["simulate", str(SINGLE24), "--plan", str(plan_file), "--duration", "1", *args])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_make_workload_rejects_zero_requests_and_zero_rate():
    from helix.core.errors import HelixUserError
    from helix.sim.run import WorkloadOptions, make_workload
    plan = single24_plan(load_cluster(SINGLE24))
    with pytest.raises(HelixUserError, match="num-requests must be >= 1, got 0"):
        make_workload(WorkloadOptions(num_requests=0), "offline", plan)
    with pytest.raises(HelixUserError, match="--rate must be > 0 requests/s and finite, got 0$"):
        make_workload(WorkloadOptions(num_requests=5, rate_per_s=0.0), "online", plan)
    assert len(make_workload(WorkloadOptions(num_requests=5), "offline", plan)) == 5


def _saved(plan, path):
    plan.save(path)
    return path


@pytest.mark.parametrize("compare", [False, True])
def test_plan_for_another_version_of_the_spec_warns(tmp_path, capsys, compare):
    spec = load_cluster(SINGLE24)
    plan = dataclasses.replace(single24_plan(spec), spec_hash="0123456789abcdef")
    extra = ["--compare", "--time-limit", "1"] if compare else []
    rc = main(["simulate", str(SINGLE24), "--plan", str(_saved(plan, tmp_path / "p.yaml")),
               "--duration", "0.5", "--num-requests", "4", *extra])
    assert rc == 0
    err = capsys.readouterr().err.strip().splitlines()
    warnings = [line for line in err if "spec hash" in line]
    assert len(warnings) == 1 and warnings[0].startswith("warning:")
    assert "0123456789abcdef" in warnings[0] and spec.content_hash() in warnings[0]


def test_plan_for_this_spec_does_not_warn(tmp_path, capsys):
    spec = load_cluster(SINGLE24)
    plan = dataclasses.replace(single24_plan(spec), spec_hash=spec.content_hash())
    rc = main(["simulate", str(SINGLE24), "--plan", str(_saved(plan, tmp_path / "p.yaml")),
               "--duration", "0.5"])
    assert rc == 0
    assert "warning" not in capsys.readouterr().err


def test_plan_with_another_layer_count_is_refused(tmp_path, capsys):
    plan = dataclasses.replace(single24_plan(load_cluster(SINGLE24)), num_layers=40)
    rc = main(["simulate", str(SINGLE24), "--plan", str(_saved(plan, tmp_path / "p.yaml")),
               "--duration", "1"])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert "40 layers" in err and len(err.splitlines()) == 1


def test_plan_for_another_cluster_is_refused(plan_file, capsys):
    rc = main(["simulate", str(REPO / "cluster_specs" / "geo24.yaml"), "--plan", str(plan_file),
               "--duration", "1"])
    assert rc == 2
    assert "lacks" in capsys.readouterr().err


@pytest.mark.slow
def test_compare_runs_every_method_and_scheduler(tmp_path, capsys):
    out = tmp_path / "cmp.json"
    rc = main(["simulate", str(REPO / "cluster_specs" / "geo24.yaml"), "--compare",
               "--time-limit", "2", "--duration", "5", "--json", str(out), "--plot", str(tmp_path)])
    assert rc == 0
    rows = json.loads(out.read_text())
    from helix.sim.run import COMPARE_METHODS, COMPARE_SCHEDULERS
    assert {(r["method"], r["scheduler"]) for r in rows} == \
        {(m, s) for m in COMPARE_METHODS for s in COMPARE_SCHEDULERS}
    assert all(r["max_flow_tokens_per_s"] > 0 for r in rows)
    assert all(r["offline_replay"] == "stationary" and "steady_decode_throughput_tokens_per_s" in r
               for r in rows)
    assert (tmp_path / "compare.png").stat().st_size > 1000
    text = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "milp+helix" in text and "lengths drawn at random from the whole conv trace" in text


def test_plan_over_a_missing_link_is_refused(plan_file, tmp_path, capsys):
    # Same nodes as single24, but the A100s sit in a region with no link to the rest.
    spec_path = tmp_path / "split.yaml"
    spec_path.write_text("""
model: llama-2-70b
regions:
  us-central: {bandwidth: 10Gbps, latency: 1ms}
  island: {bandwidth: 10Gbps, latency: 1ms}
coordinator: {region: us-central}
nodes:
  - {name: "a100-{i}", gpu: A100-40G, count: 4, region: island}
  - {name: "l4-{i}", gpu: L4, count: 8, region: us-central}
  - {name: "t4-{i}", gpu: T4, count: 12, region: us-central}
""")
    rc = main(["simulate", str(spec_path), "--plan", str(plan_file), "--duration", "1"])
    assert rc == 2
    assert "no link" in capsys.readouterr().err


def test_load_help_says_what_the_rate_is_based_on(capsys):
    # --load is a fraction of what the plan predicts users get, not of the max flow (which
    # overstates it several times and made the default 0.75 overload every run).
    assert main(["simulate", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "LOAD x the plan's predicted request rate at saturation" in text
    assert "a plan without a prediction: LOAD x its max flow" in text


def test_online_rate_follows_the_prediction():
    from helix.core.plan import Plan, Prediction
    from helix.sim.run import online_rate_per_s
    from helix.sim.workload import TraceRequest
    plan = Plan(model="m", num_layers=2, placements=(), arc_flows=(), max_flow_tokens_per_s=1000.0)
    requests = (TraceRequest(0.0, 80, 20),)
    assert online_rate_per_s(plan, requests, 0.5) == pytest.approx(5.0)   # 0.5 x 1000 / 100
    predicted = dataclasses.replace(plan, prediction=Prediction(
        prompt_decode_tokens_per_s=200.0, decode_tokens_per_s=40.0, requests_per_s=2.0,
        pipelines=1, requests_in_flight=10.0, online_load=0.75, ttft_p50_s=1.0, tpot_p50_s=0.1))
    assert online_rate_per_s(predicted, requests, 0.5) == pytest.approx(1.0)


def test_drain_and_join_print_the_phases_and_write_them(plan_file, tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = main(["simulate", str(SINGLE24), "--plan", str(plan_file), "--mode", "online", "--rate", "2",
               "--duration", "60", "--drain", "l4-0@20", "--join", "a100-1@30", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "before drain l4-0 (0-20 s):" in text and "after join a100-1 (30-" in text
    d = json.loads(out.read_text())
    assert [p["label"] for p in d["phases"]][:3] == ["before drain l4-0", "after drain l4-0",
                                                     "after join a100-1"]
    assert d["node_requests"]["a100-1"] > 0 and d["node_requests"]["l4-0"] > 0


@pytest.mark.parametrize("args, message", [
    (["--drain", "l4-0"], "--drain 'l4-0': expected NODE@SECONDS"),
    (["--drain", "l4-0@-1"], "--drain 'l4-0@-1': expected NODE@SECONDS"),
    (["--join", "gpu-9@3"], "--join 'gpu-9@3': no node 'gpu-9' in the cluster"),
    (["--drain", "t4-0@3"], "--drain: node 't4-0' holds no layers in plan"),
    (["--fail", "t4-0@3"], "--fail: node 't4-0' holds no layers in plan"),
    (["--drain", "l4-0@3", "--compare"], "--drain and --join run with one plan"),
    (["--jobs", "2"], "--jobs sets how many --compare runs go at once"),
    (["--jobs", "0", "--compare"], "--jobs must be >= 1, got 0"),
])
def test_bad_drains_joins_and_jobs_are_one_line_errors(plan_file, capsys, args, message):
    rc = main(["simulate", str(SINGLE24), "--plan", str(plan_file), "--duration", "1", *args])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_compare_in_processes_gives_the_rows_of_one_after_another():
    from helix.sim import run as simrun
    from helix.sim.engine import SimConfig
    spec = load_cluster(REPO / "cluster_specs" / "local3.yaml")
    plans = {m: simrun.make_plan(spec, m, 5.0) for m in ("milp", "swarm")}
    kwargs = dict(methods=("milp", "swarm"), schedulers=("helix", "random"), plans=plans)
    config = SimConfig(mode="offline", duration_s=20.0)
    seen = []
    rows = [simrun.compare(spec, config, simrun.WorkloadOptions(), jobs=jobs,
                           progress=seen.append, **kwargs) for jobs in (1, 3)]

    def strip(row):
        d = dataclasses.asdict(row.result)
        d.pop("wall_s")
        return row.method, row.scheduler, row.max_flow_tokens_per_s, d
    assert [strip(r) for r in rows[0]] == [strip(r) for r in rows[1]]
    assert [(r.method, r.scheduler) for r in rows[1]] == \
        [("milp", "helix"), ("milp", "random"), ("swarm", "helix"), ("swarm", "random")]
    assert "simulating 4 runs in 3 processes" in seen and rows[1][0].result.tokens_generated > 0


def test_offline_run_sets_the_plan_s_prediction_beside_its_steady_state_unless_nodes_change(
        tmp_path, capsys):
    spec, plan = REPO / "cluster_specs" / "local3.yaml", tmp_path / "p.json"
    assert main(["plan", str(spec), "--time-limit", "5", "-o", str(plan)]) == 0   # with a prediction
    base = ["simulate", str(spec), "--plan", str(plan), "--duration", "30"]
    capsys.readouterr()
    assert main(base) == 0
    assert "helix plan predicts" in capsys.readouterr().out
    # A failure changes the cluster the prediction was made for: no comparison is printed.
    assert main([*base, "--fail", "cpu-1@5"]) == 0
    assert "helix plan predicts" not in capsys.readouterr().out
