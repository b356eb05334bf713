"""Re-solving the max flow on the nodes still alive (coordinator/reflow.py): equal to the planner's own
max flow of the surviving placement, and a rebuilt scheduler keeps the requests in flight."""

from __future__ import annotations

import random

import pytest

from coordinator.kv_estimator import KVEstimator
from coordinator.pipeline import RequestInfo
from coordinator.reflow import rebuilt, surviving_flows
from coordinator.schedulers import make_scheduler
from helix.core.plan import COORDINATOR, ArcFlow, Plan
from helix.core.slices import as_slices
from planner.flowgraph import capacity_table, max_flow, with_flow_capacities
from tests.builders.problems import make_node, make_problem


def _plan(problem, placement) -> Plan:
    res = max_flow(problem, placement)
    flows = tuple(ArcFlow(a, b, f) for (a, b), f in sorted(res.arc_flows.items()) if f > 0)
    plan = Plan("tiny", problem.num_layers, as_slices(placement),
                flows, res.value_tokens_per_s, method="test")
    return with_flow_capacities(plan, problem)


@pytest.mark.parametrize("seed", range(6))
def test_surviving_flow_equals_the_planners_max_flow_without_the_dead(seed):
    rng = random.Random(seed)
    nodes = [make_node(f"n{i}", (rng.uniform(50, 400), rng.uniform(30, 200)), region=f"r{i % 2}")
             for i in range(6)]
    problem = make_problem(nodes, 4, inter_region_cap=rng.uniform(20, 200))
    placement = {f"n{i}": ((0, 2) if i < 3 else (2, 4)) for i in range(6)}
    plan = _plan(problem, placement)
    for dead in ({"n0"}, {"n4"}, {"n1", "n5"}):
        alive = set(placement) - dead
        flows = surviving_flows(plan, alive)
        want = max_flow(problem, {n: r for n, r in placement.items() if n in alive}).value_tokens_per_s
        got = sum(a.flow_tokens_per_s for a in flows if a.src == COORDINATOR) if flows else 0.0
        assert got == pytest.approx(want, rel=1e-9, abs=1e-9)
        assert flows is None or not any({a.src, a.dst} & dead for a in flows)


def test_no_capacities_or_no_path_means_no_reflow():
    nodes = [make_node("a", (100.0, 50.0)), make_node("b", (100.0, 50.0))]
    problem = make_problem(nodes, 2)
    plan = _plan(problem, {"a": (0, 1), "b": (1, 2)})
    assert surviving_flows(plan, {"a"}) is None                      # b held the last layer
    bare = Plan(plan.model, 2, plan.placements, plan.arc_flows, plan.max_flow_tokens_per_s)
    assert surviving_flows(bare, {"a", "b"}) is None


def test_capacities_survive_the_plan_file(tmp_path):
    nodes = [make_node("a", (100.0, 50.0)), make_node("b", (80.0, 40.0))]
    problem = make_problem(nodes, 2)
    plan = _plan(problem, {"a": (0, 1), "b": (1, 2)})
    plan.save(tmp_path / "p.yaml")
    assert Plan.load(tmp_path / "p.yaml").extras["flow_capacities"] == \
        capacity_table(problem, {"a": (0, 1), "b": (1, 2)})


def test_a_rebuilt_scheduler_keeps_requests_in_flight_and_avoids_the_dead():
    nodes = [make_node(n, (300.0, 150.0)) for n in ("a", "b", "c", "d")]
    problem = make_problem(nodes, 2)
    plan = _plan(problem, {"a": (0, 1), "b": (0, 1), "c": (1, 2), "d": (1, 2)})
    kv = KVEstimator({n: 1e6 for n in "abcd"}, high_water=1.0)
    old = make_scheduler("helix", plan, kv)
    live = [old.schedule(RequestInfo(i, 10, 10)) for i in range(8)]
    assert all(live) and any("c" in p.nodes for p in live)
    flows = surviving_flows(plan, {"a", "b", "d"})
    new = rebuilt(old, plan, flows, kv, lambda p, k: make_scheduler("helix", p, k))
    assert new.num_admitted == 8 and new.assigned == old.assigned
    fresh = [new.schedule(RequestInfo(100 + i, 10, 10)) for i in range(20)]
    assert all(p is not None and "c" not in p.nodes for p in fresh)
    for i in range(8):
        new.release(i)
    for i in range(20):
        new.release(100 + i)
    assert new.num_admitted == 0 and kv.num_reserved() == 0
