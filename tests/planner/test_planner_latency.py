"""Depth and latency along the flow-carrying paths; the progress callback."""

import pytest

from planner import solve
from planner.flowgraph import max_flow
from planner.latency import decompose, path_stats
from planner.problem import COORDINATOR
from planner.reference import reference_single24_70b
from planner_factories import make_node, make_problem


def test_chain_depth_and_latency_add_up():
    nodes = [make_node("a", (100, 100)), make_node("b", (100, 100)), make_node("c", (100, 100))]
    p = make_problem(nodes, 6)  # every link 1 ms, every layer 1 ms (factory defaults)
    placement = {"a": (0, 2), "b": (2, 4), "c": (4, 6)}
    flows = max_flow(p, placement)
    paths = decompose(flows)
    assert [path for path, _ in paths] == [[COORDINATOR, "a", "b", "c", COORDINATOR]]
    stats = path_stats(p, placement, flows)
    assert stats.depth_max == 3
    assert stats.latency_mean_s == pytest.approx(4 * 1e-3 + 6 * 1e-3)  # 4 links + 6 layers


def test_partial_inference_counts_only_layers_run():
    nodes = [make_node("a", (100, 100, 100)), make_node("b", (100, 100, 100))]
    p = make_problem(nodes, 4)
    placement = {"a": (0, 3), "b": (1, 4)}  # b runs only layer 3 after a
    stats = path_stats(p, placement, max_flow(p, placement))
    assert stats.latency_mean_s == pytest.approx(3 * 1e-3 + 4 * 1e-3)


def test_paths_carry_the_whole_flow():
    plan = solve(reference_single24_70b(), "petals", seed=2)
    flows = max_flow(reference_single24_70b(), {p.node: (p.start, p.end) for p in plan.placements})
    total = sum(f for _, f in decompose(flows))
    assert total == pytest.approx(flows.value_tokens_per_s, rel=1e-6)


def test_progress_reports_incumbent_below_bound():
    seen = []
    solve(reference_single24_70b(), "milp", warm_starts=False, threads=1,
          progress=lambda t, inc, bound: seen.append((t, inc, bound)))
    assert seen
    assert all(inc <= bound * (1 + 1e-6) for _, inc, bound in seen if inc == inc and inc > 0)
