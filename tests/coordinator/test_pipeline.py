from collections import Counter

import pytest

from coordinator.kv_estimator import KVEstimator
from coordinator.pipeline import Pipeline, RequestInfo, Topology
from coordinator.schedulers import make_scheduler
from helix.core.plan import COORDINATOR
from helix.core.slices import LayerSlice
from tests.builders.plans import diamond_plan


def _kv(plan, cap=1e12, high_water=0.9):
    return KVEstimator({p.node: cap for p in plan.placements}, high_water=high_water)


def test_overlap_runs_only_missing_layers():
    topo = Topology.from_plan(diamond_plan())
    assert topo.stage("b", "c") == LayerSlice("c", 6, 8)
    assert topo.stage("a", "c") == LayerSlice("c", 4, 8)
    assert topo.stage(COORDINATOR, "b") == LayerSlice("b", 0, 6)


def test_has_path_needs_a_whole_pipeline_of_allowed_nodes():
    topo = Topology.from_plan(diamond_plan())   # pipelines a-c, b-c, b-d
    for nodes, want in ((("a", "b", "c", "d"), True), (("a", "c"), True), (("b", "d"), True),
                        (("a", "d"), False), (("c", "d"), False), (("a", "b"), False), ((), False)):
        assert topo.has_path(topo.mask_of(nodes)) is want, nodes


def test_pipelines_follow_flows_and_cover_every_layer_once():
    plan = diamond_plan()
    sched = make_scheduler("helix", plan, _kv(plan))
    seen = Counter()
    for rid in range(4000):
        p = sched.schedule(RequestInfo(rid, 10, 10))
        p.check(plan.num_layers)
        seen[p.nodes] += 1
    # Source splits 300:100; b splits 40:60.
    assert seen[("a", "c")] == 3000
    assert seen[("b", "c")] == 400
    assert seen[("b", "d")] == 600


def test_kv_mask_reroutes_then_queues_then_resumes():
    plan = diamond_plan()
    # 'a' holds 4 layers: room for 100 tokens there = 400 token-layers; others huge.
    caps = {"a": 400.0, "b": 1e9, "c": 1e9, "d": 1e9}
    kv = KVEstimator(caps, high_water=1.0)
    sched = make_scheduler("helix", plan, kv)
    first = sched.schedule(RequestInfo(0, 60, 40))
    assert first.nodes[0] == "a"
    # 'a' is now full: everything goes through 'b'.
    assert all(sched.schedule(RequestInfo(i, 60, 40)).nodes[0] == "b" for i in range(1, 6))
    # Mask b too: no pipeline, the request must wait (None), never an exception.
    kv.observe("b", 1e9)
    assert sched.schedule(RequestInfo(99, 60, 40)) is None
    sched.release(0)
    p = sched.schedule(RequestInfo(99, 60, 40))
    assert p is not None and p.nodes[0] == "a"


def test_dead_end_is_avoided_by_reachability():
    plan = diamond_plan()
    caps = {"a": 1e9, "b": 1e9, "c": 1.0, "d": 1e9}  # c can never take anything
    sched = make_scheduler("helix", plan, KVEstimator(caps))
    for rid in range(50):
        assert sched.schedule(RequestInfo(rid, 5, 5)).nodes == ("b", "d")


def test_baselines_build_valid_pipelines():
    plan = diamond_plan()
    for name in ("swarm", "random", "shortest-queue"):
        sched = make_scheduler(name, plan, _kv(plan), seed=3)
        firsts = Counter()
        for rid in range(200):
            p = sched.schedule(RequestInfo(rid, 5, 5))
            p.check(plan.num_layers)
            firsts[p.nodes[0]] += 1
            if name == "swarm":
                for a, b in zip((COORDINATOR,) + p.nodes, p.nodes):
                    sched.observe_hop(a, b, 1.0 if b == "a" else 0.1)
        assert set(firsts) == {"a", "b"}, (name, firsts)
    # partial inference off: b -> c is no longer usable (c does not start at 6).
    topo = Topology.from_plan(diamond_plan(), flows_only=False)
    assert "c" in topo.arcs["b"]
    no_partial = Topology(8, topo.ranges, topo.arcs, partial_inference=False)
    assert "c" not in no_partial.arcs["b"] and "c" in no_partial.arcs["a"]


def test_swarm_picks_hops_in_inverse_proportion_to_their_delay():
    # The Helix artifact's Swarm: IWRR where a hop's priority grows by its delay average per pick.
    plan = diamond_plan()
    sched = make_scheduler("swarm", plan, _kv(plan, cap=1e9))
    for _ in range(10):   # averages move 0.8 of the way per observation: converged
        sched.observe_hop(COORDINATOR, "a", 0.5)
        sched.observe_hop(COORDINATOR, "b", 0.1)
    firsts = Counter()
    for rid in range(600):
        firsts[sched.schedule(RequestInfo(rid, 1, 1)).nodes[0]] += 1
        sched.release(rid)
    assert 4.5 < firsts["b"] / firsts["a"] < 5.5, firsts


def test_swarm_averages_start_at_50_ms_and_move_80_percent():
    plan = diamond_plan()
    sched = make_scheduler("swarm", plan, _kv(plan, cap=1e9))
    # No observation yet: both hops equal, ties to the first candidate, then alternation.
    got = [sched.schedule(RequestInfo(rid, 1, 1)).nodes[0] for rid in range(4)]
    assert got in (["a", "b", "a", "b"], ["b", "a", "b", "a"])
    sched.observe_hop(COORDINATOR, "a", 1.05)
    assert sched._delay_s[(COORDINATOR, "a")] == pytest.approx(0.05 + 0.8 * 1.0)


def test_release_returns_kv_to_zero():
    plan = diamond_plan()
    kv = _kv(plan, cap=1e6)
    sched = make_scheduler("helix", plan, kv)
    for rid in range(100):
        sched.schedule(RequestInfo(rid, 7, 3))
    for rid in range(100):
        sched.release(rid)
    assert all(kv.used(n) == 0.0 for n in ("a", "b", "c", "d"))
    assert all(v == 0 for v in sched.assigned.values())
    assert isinstance(Pipeline((LayerSlice("a", 0, 8),)), Pipeline)


def test_helix_falls_back_to_zero_flow_hops_when_flow_paths_are_masked():
    from tests.builders.plans import make_plan
    plan = make_plan(8, {"x": (0, 4), "y": (4, 8), "u": (0, 4), "v": (4, 8)},
                     {(COORDINATOR, "x"): 10.0, ("x", "y"): 10.0, ("y", COORDINATOR): 10.0,
                      (COORDINATOR, "u"): 10.0, ("u", "v"): 10.0, ("v", COORDINATOR): 10.0})
    caps = {"x": 1e9, "y": 1e9, "u": 1e9, "v": 1e9}
    for fallback, expected in ((True, ("x", "v")), (False, None)):
        kv = KVEstimator(caps)
        sched = make_scheduler("helix", plan, kv, helix_fallback=fallback)
        kv.observe("y", 1e9)  # both flow paths blocked: y full, u full
        kv.observe("u", 1e9)
        p = sched.schedule(RequestInfo(0, 10, 10))
        assert (p.nodes if p else None) == expected
    # With nothing masked the fallback never changes the flow split.
    sched = make_scheduler("helix", plan, KVEstimator(caps))
    seen = Counter(sched.schedule(RequestInfo(i, 1, 1)).nodes for i in range(100))
    assert seen == {("x", "y"): 50, ("u", "v"): 50}


def test_no_scheduler_enters_a_layer0_node_mid_pipeline():
    """A node holding layer 0 embeds token ids: the worker engine can only run it as a first stage,
    so no topology (hence neither the simulator nor the live coordinator) hops into it later."""
    from tests.builders.plans import make_plan
    ranges = {"whole": (0, 8), "tail": (4, 8), "head": (0, 4)}
    flows = {(COORDINATOR, "head"): 1.0, ("head", "tail"): 1.0, ("tail", COORDINATOR): 1.0,
             ("head", "whole"): 1.0, (COORDINATOR, "whole"): 1.0, ("whole", COORDINATOR): 2.0}
    plan = make_plan(8, ranges, flows)
    assert Topology.from_plan(plan, flows_only=False).arcs["head"] == ("tail",)
    for name in ("helix", "swarm", "random", "shortest-queue"):
        kv = _kv(plan)
        sched = make_scheduler(name, plan, kv)
        seen = {sched.schedule(RequestInfo(i, 10, 10)).nodes for i in range(20)}
        assert seen <= {("head", "tail"), ("whole",)} and seen, (name, seen)
        kv.observe("whole", 1e13)   # the whole-model node full: only head -> tail remains
        assert sched.schedule(RequestInfo(99, 10, 10)).nodes == ("head", "tail"), name
        kv.observe("tail", 1e13)    # and never head -> whole (entering at layer 4)
        assert sched.schedule(RequestInfo(100, 10, 10)) is None, name
