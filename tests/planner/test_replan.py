"""Re-planning a changed cluster: the moves a proposal needs, what they cost, and
whether it pays; ``helix plan --from running.yaml`` as the dry run."""

from pathlib import Path

import pytest
import yaml

from helix.cli import main
from helix.core.plan import Plan
from helix.core.spec import load_cluster
from planner import predicted, replan
from planner.build import build_problem


def _cluster(tmp_path: Path, name: str, count: int, model: str = "llama-2-7b", gpu: str = "L4"):
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "model": model, "regions": {"east": {"bandwidth": "10Gbps", "latency": "1ms"}},
        "nodes": [{"name": f"{gpu.lower()}-{{i}}", "gpu": gpu, "count": count, "region": "east"}]}))
    return path


def _chain(names, num_layers):
    """Consecutive equal slices over ``names`` (the last takes the rest)."""
    k = num_layers // len(names)
    return {n: (i * k, num_layers if i == len(names) - 1 else (i + 1) * k) for i, n in enumerate(names)}


def test_join_moves_layers_onto_the_new_node_and_pays(tmp_path, capsys):
    three, four = _cluster(tmp_path, "three", 3), _cluster(tmp_path, "four", 4)
    running = tmp_path / "running.yaml"
    assert main(["plan", str(three), "--time-limit", "3", "--threads", "1", "-o", str(running)]) == 0
    capsys.readouterr()
    assert main(["plan", str(four), "--from", str(running), "--time-limit", "3", "--threads", "1",
                 "--json"]) == 0
    d = yaml.safe_load(capsys.readouterr().out)["extras"]["replan"]
    assert d["adopt"] and d["proposed_tokens_per_s"] > d["current_tokens_per_s"] > 0
    new = [m for m in d["moves"] if m["node"] == "l4-3"]
    assert len(new) == 1 and new[0]["old"] is None and new[0]["beside"]
    # Its layers over its 10 Gb/s link: bytes / 1.25e9 seconds.
    assert new[0]["load_s"] == pytest.approx(new[0]["load_bytes"] / 1.25e9)
    assert d["switch_s"] == pytest.approx(max(m["load_s"] for m in d["moves"]))


def test_leave_drops_the_node_and_adopts_a_placement_that_serves(tmp_path, capsys):
    four, three = _cluster(tmp_path, "four", 4), _cluster(tmp_path, "three", 3)
    running = tmp_path / "running.yaml"
    assert main(["plan", str(four), "--method", "separate", "-o", str(running), "--threads", "1"]) == 0
    held = {p.node for p in Plan.load(running).placements if p.end > p.start}
    assert "l4-3" in held   # the node that leaves holds layers
    capsys.readouterr()
    assert main(["plan", str(three), "--from", str(running), "--time-limit", "3", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "l4-3 is no longer in the cluster: its layers are dropped" in out
    assert "ADOPT" in out and "no longer serves every layer" in " ".join(out.split())


def test_the_running_placement_is_kept_and_near_equal_ones_never_alternate(tmp_path):
    spec = load_cluster(_cluster(tmp_path, "three", 3))
    problem = build_problem(spec)
    names = [n.name for n in problem.nodes]
    a = _chain(names, problem.num_layers)
    b = dict(a)   # one boundary moved by a layer: nearly the same throughput
    (s0, e0), (s1, e1) = a[names[0]], a[names[1]]
    b[names[0]], b[names[1]] = (s0, e0 + 1), (s1 + 1, e1)
    pa, pb = (predicted.evaluate(spec, p, problem=problem) for p in (a, b))
    same = replan.decide(spec, problem, pa, pa)
    assert not same.adopt and same.moves == () and "is the running placement" in same.reason
    ab, ba = replan.decide(spec, problem, pa, pb), replan.decide(spec, problem, pb, pa)
    ta, tb = pa.prediction.prompt_decode_tokens_per_s, pb.prediction.prompt_decode_tokens_per_s
    assert ta != tb and abs(ta - tb) < 0.05 * min(ta, tb)
    assert not ab.adopt and not ba.adopt            # inside the 5 % margin: no flapping
    # Without the margin (and with free moves) the better one is taken, in one direction only.
    loose = [replan.decide(spec, problem, x, y, hysteresis=0.0) for x, y in ((pa, pb), (pb, pa))]
    assert [d.adopt for d in loose] == ([True, False] if tb > ta else [False, True])


def test_a_node_that_cannot_hold_both_slices_stops_serving_while_it_loads(tmp_path):
    spec = load_cluster(_cluster(tmp_path, "ten", 10, model="llama-2-70b"))
    problem = build_problem(spec)
    names = [n.name for n in problem.nodes]
    cur = _chain(names, problem.num_layers)            # 8 layers a node, one chain
    swapped = dict(cur)
    swapped[names[3]], swapped[names[4]] = cur[names[4]], cur[names[3]]
    room = problem.node(names[3]).max_layers
    assert room < 16   # [24, 40) does not fit beside: an L4 holds fewer 70B layers
    ms = replan.moves(spec, problem, cur, swapped)
    assert [m.node for m in ms] == [names[3], names[4]] and not any(m.beside for m in ms)
    layer_bytes = spec.model.layer_bytes(2)
    assert ms[0].load_bytes == pytest.approx(8 * layer_bytes)   # 8 layers it did not hold
    pc, ps = (predicted.evaluate(spec, p, problem=problem) for p in (cur, swapped))
    d = replan.decide(spec, problem, pc, ps)
    # One chain: each moved node carries the whole flow, so the service stops for the longest load.
    assert d.cost_tokens == pytest.approx(d.current_tokens_per_s * max(m.load_s for m in ms))
    assert not d.adopt


def test_bad_horizon_is_one_line(tmp_path, capsys):
    three = _cluster(tmp_path, "three", 3)
    assert main(["plan", str(three), "--horizon", "0"]) != 0
    assert "--horizon must be > 0" in capsys.readouterr().err


def test_lost_service_counts_each_pipeline_once(tmp_path):
    """Two stopped nodes on one pipeline stop it once, for the longer load: two disjoint chains
    (no partial inference, boundaries that never meet), two nodes of chain A swap slices they
    cannot hold side by side; only chain A's share stops. The sum of per-node shares counted
    chain A twice (capped at the whole flow: the cost was the whole service for the load)."""
    spec = load_cluster(_cluster(tmp_path, "two", 18, model="llama-2-70b"))
    problem = build_problem(spec)
    names = [n.name for n in problem.nodes]
    a_cuts = [0, 9, 17, 25, 33, 41, 49, 57, 65, 73, 80]
    a = {n: (a_cuts[i], a_cuts[i + 1]) for i, n in enumerate(names[:10])}
    b = {n: (10 * i, 10 * (i + 1)) for i, n in enumerate(names[10:])}
    assert all(problem.node(n).max_layers >= 10 for n in names)
    cur = {**a, **b}
    swapped = dict(cur)
    swapped[names[2]], swapped[names[3]] = cur[names[3]], cur[names[2]]
    pc, ps = (predicted.evaluate(spec, p, problem=problem, partial_inference=False)
              for p in (cur, swapped))
    d = replan.decide(spec, problem, pc, ps)
    ms = {m.node: m for m in d.moves}
    assert set(ms) == {names[2], names[3]} and not any(m.beside for m in ms.values())
    into = {}
    for arc in pc.arc_flows:
        into[arc.dst] = into.get(arc.dst, 0.0) + arc.flow_tokens_per_s
    share_a = into[names[0]] / pc.max_flow_tokens_per_s     # chain A's first node: its whole flow
    assert 0.2 < share_a < 0.8 and into[names[0]] == pytest.approx(into[names[2]])
    assert d.cost_tokens == pytest.approx(
        d.current_tokens_per_s * share_a * max(m.load_s for m in ms.values()), rel=1e-6)


def test_the_dry_run_says_a_joining_node_has_nothing_to_serve_yet(tmp_path, capsys):
    """The table's 'meanwhile' for a node that held no layers: it joins (it said 'serves its old
    layers', which it has none of)."""
    three, four = _cluster(tmp_path, "three", 3), _cluster(tmp_path, "four", 4)
    running = tmp_path / "running.yaml"
    assert main(["plan", str(three), "--time-limit", "3", "--threads", "1", "-o", str(running)]) == 0
    capsys.readouterr()
    assert main(["plan", str(four), "--from", str(running), "--time-limit", "3", "--threads", "1"]) == 0
    row = [line for line in capsys.readouterr().out.splitlines() if "l4-3" in line][-1]   # re-plan table
    assert "joins" in row and "old layers" not in row


def test_keep_writes_the_running_placement(tmp_path, capsys):
    """--from with a KEEP verdict: -o gets the placement to keep running, not the proposal."""
    three = _cluster(tmp_path, "three", 3)
    running = tmp_path / "running.yaml"
    assert main(["plan", str(three), "--method", "petals", "-o", str(running), "--threads", "1"]) == 0
    capsys.readouterr()
    out = tmp_path / "next.yaml"
    assert main(["plan", str(three), "--from", str(running), "--time-limit", "2", "--threads", "1",
                 "--hysteresis", "10", "-o", str(out)]) == 0   # a margin no proposal can pay
    text = " ".join(capsys.readouterr().out.split())
    assert "KEEP" in text and "(the running placement: the verdict is KEEP)" in text
    kept, was = Plan.load(out), Plan.load(running)
    assert [(p.node, p.start, p.end) for p in kept.placements if p.end > p.start] == \
        [(p.node, p.start, p.end) for p in was.placements if p.end > p.start]
    assert kept.serving is not None and kept.extras["replan"]["adopt"] is False
    assert kept.extras["replan"]["moves"]   # the proposal differed: it was not written
