"""Re-planning in the simulator (``SimConfig.replan`` / ``helix simulate
--replan``): the live trigger (planner.trigger) on the simulated clock; an adopted plan is applied
drain-first (nodes that cannot hold both slices stop, empty, then load over their link), the new
plan serves from the switch; nothing is lost."""

import dataclasses

import pytest

from helix.cli import main
from helix.sim.build import build_simulator
from helix.sim.elastic import NodeDrain, NodeJoin
from helix.sim.engine import SimConfig
from helix.sim.replan import ReplanConfig
from helix.sim.workload import TraceRequest
from helix.core.slices import as_placement
from helix.core.spec import parse_cluster
from planner import PlanOptions, plan
from planner.trigger import TriggerConfig, respec
from tests.builders.sims import burst
from tests.helix.sim.test_failures import _conserved

REGION = {"east": {"bandwidth": "10Gbps", "latency": "1ms"}}
FAST = TriggerConfig(time_limit_s=3, window_s=60, min_requests=20)


def _spec(model: str, count: int):
    return parse_cluster({"model": model, "regions": REGION,
                          "nodes": [{"name": "l4-{i}", "gpu": "L4", "count": count, "region": "east"}]})


def _plan(spec):
    return plan(spec, PlanOptions(time_limit_s=3, threads=1))


def _join_run(n=400, gap_s=0.25):
    """4 L4s (LLaMA-2 7B) running the plan of three; l4-3 joins at 20 s."""
    spec = _spec("llama-2-7b", 4)
    three = respec(spec, list(spec.nodes[:3]), spec.workload)
    workload = burst(n, 500, 120, gap_s)
    config = SimConfig(mode="online", duration_s=None, joins=(NodeJoin("l4-3", 20.0),),
                       replan=ReplanConfig(FAST))
    sim = build_simulator(spec, _plan(three), workload, config)
    return sim, sim.run(), workload


def test_a_join_replans_and_the_node_serves_from_the_switch():
    sim, r, workload = _join_run()
    _conserved(r, workload)
    first = r.replans[0]
    assert first["cause"] == "join l4-3" and first["adopt"] and first["at_s"] == 20.0
    assert "l4-3" in first["moved_nodes"] and first["stopped_nodes"] == {}   # all load beside
    # The switch comes when the slowest load is done: its weights over 10 Gb/s, as predicted.
    assert first["switched_s"] - first["at_s"] == pytest.approx(first["switch_s"])
    assert 0 < first["switch_s"] < 20 and first["stopped_node_s"] == 0
    w = sim.workers["l4-3"]
    assert w.end > w.start and w.routed > 50 and w.first_routed_s >= first["switched_s"]
    labels = [p["label"] for p in r.phases]
    assert labels[:3] == ["before join l4-3",
                          f"after re-plan 1: {first['moves']} node(s) move",
                          "after switch to re-plan 1"]


def test_the_run_is_deterministic():
    runs = [_join_run(n=200)[1] for _ in range(2)]
    a, b = (dataclasses.replace(r, wall_s=0.0, samples={}) for r in runs)
    assert a.replans == b.replans and a.throughput_timeline_tokens_per_s == \
        b.throughput_timeline_tokens_per_s and a == b


def test_a_node_that_cannot_hold_both_slices_drains_then_loads():
    """LLaMA-2 70B on a chain of 11 L4s; one is drained for good: its layers are held nowhere
    else, so the re-plan is adopted whatever it moves; a node whose new range does not fit beside
    its old one stops at once, empties, then loads; the switch waits for it."""
    spec = _spec("llama-2-70b", 11)
    plan = _plan(spec)
    held = [p.node for p in plan.placements if p.end > p.start]
    assert len(held) == 11
    workload = burst(60, 300, 60, 0.5)
    config = SimConfig(mode="online", duration_s=None, drains=(NodeDrain(held[3], 10.0),),
                       replan=ReplanConfig(FAST))
    sim = build_simulator(spec, plan, workload, config)
    r = sim.run()
    _conserved(r, workload)
    first = r.replans[0]
    assert first["cause"] == f"leave {held[3]}" and first["adopt"]
    assert first["current_tokens_per_s"] == 0 and first["proposed_tokens_per_s"] > 0
    stopped = first["stopped_nodes"]
    assert stopped and held[3] not in first["moved_nodes"]
    for node, s in stopped.items():
        assert s["stopped_s"] == 10.0 and s["empty_s"] >= 10.0 and s["load_s"] > 0
        assert first["switched_s"] >= s["empty_s"] + s["load_s"] - 1e-9
    assert first["stopped_node_s"] == pytest.approx(
        sum(first["switched_s"] - s["stopped_s"] for s in stopped.values()))
    # The drained node stays out; every other node serves its new slice with its new KV pool.
    after = as_placement(sim._flow_plan.placements, skip_empty=True)
    assert held[3] in sim.draining and held[3] not in after and len(after) == 10
    for node in after:
        w = sim.workers[node]
        assert (w.start, w.end) == after[node] and node not in sim.draining
        assert sim.scheduler.kv.capacity(node) == w.kv_capacity_tokens * (w.end - w.start)


def test_a_drift_in_the_mix_is_seen_from_completed_requests():
    """Short outputs, then long ones: the trigger, fed each completed request, re-plans for the
    new mix once its window holds it (not before the change)."""
    spec = _spec("llama-2-7b", 3)
    early = burst(300, 700, 200, 0.2)
    late = tuple(TraceRequest(60.0 + i * 0.2, 150, 900) for i in range(300))
    config = SimConfig(mode="online", duration_s=400.0,
                       replan=ReplanConfig(FAST, poll_s=30.0))
    r = build_simulator(spec, _plan(spec), early + late, config).run()
    drifts = [x for x in r.replans if x["cause"].startswith("drift")]
    assert drifts and all(x["at_s"] > 60.0 for x in drifts)
    assert drifts[0]["drift"] > 0.15 and drifts[0]["mean_output_tokens"] > 500


def _write(tmp_path, count):
    path = tmp_path / f"l4x{count}.yaml"
    path.write_text(f"model: llama-2-7b\nregions: {{east: {{bandwidth: 10Gbps, latency: 1ms}}}}\n"
                    f"nodes: [{{name: 'l4-{{i}}', gpu: L4, count: {count}, region: east}}]\n")
    return path


def _trace(tmp_path):
    path = tmp_path / "trace.csv"
    rows = [f"2023-11-16 18:{15 + i // 60:02d}:{i % 60:02d}.0000000,{300 + 7 * (i % 5)},{40 + i % 7}"
            for i in range(240)]
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    return path


def test_cli_replans_a_join_and_says_so(tmp_path, capsys):
    three, four = _write(tmp_path, 3), _write(tmp_path, 4)
    plan = tmp_path / "plan.yaml"
    assert main(["plan", str(three), "--time-limit", "3", "--threads", "1", "-o", str(plan)]) == 0
    capsys.readouterr()
    assert main(["simulate", str(four), "--plan", str(plan), "--trace", str(_trace(tmp_path)),
                 "--mode", "online", "--rate", "2", "--duration", "0", "--join", "l4-3@30",
                 "--replan", "--replan-time-limit", "3"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "re-plan 1 at 30 s (join l4-3): ADOPT" in out and "switched" in out
    assert "after switch to re-plan 1" in out


def test_cli_refuses_bad_replan_options(tmp_path, capsys):
    four, plan = _write(tmp_path, 4), tmp_path / "plan.yaml"
    trace = _trace(tmp_path)
    assert main(["plan", str(four), "--method", "separate", "-o", str(plan)]) == 0
    capsys.readouterr()
    base = ["simulate", str(four), "--plan", str(plan), "--trace", str(trace), "--replan"]
    assert main([*base, "--scheduler", "swarm"]) != 0
    assert "--replan needs --scheduler helix" in capsys.readouterr().err
    assert main([*base, "--horizon", "0"]) != 0
    assert "--horizon must be > 0 and finite, got 0" in capsys.readouterr().err
