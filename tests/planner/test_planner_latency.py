"""Depth and latency along the flow-carrying paths; the progress callback."""

from pathlib import Path

import pytest

from helix.core.slices import as_placement
from planner import solve
from planner.flowgraph import max_flow
from planner.latency import decompose, path_stats
from planner.problem import COORDINATOR
from planner.reference import reference_single24_70b
from tests.builders.problems import make_node, make_problem

REPO = Path(__file__).resolve().parents[2]


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
    flows = max_flow(reference_single24_70b(), as_placement(plan.placements))
    total = sum(f for _, f in decompose(flows))
    assert total == pytest.approx(flows.value_tokens_per_s, rel=1e-6)


def test_progress_reports_incumbent_below_bound():
    seen = []
    solve(reference_single24_70b(), "milp", warm_starts=False, threads=1,
          progress=lambda t, inc, bound: seen.append((t, inc, bound)))
    assert seen
    assert all(inc <= bound * (1 + 1e-6) for _, inc, bound in seen if inc == inc and inc > 0)


def test_latency_uses_the_layer_count_each_node_holds():
    """The cost model's per-layer latency depends on k (a T4's batch shrinks as its layers grow):
    a chain of ten T4s with 8 layers each costs 8 * latency(k=8) per node, not 8 * latency(k=4)."""
    from helix.core.costmodel import CostModel
    from helix.core.spec import load_cluster
    from planner.build import build_problem
    spec = load_cluster(REPO / "cluster_specs" / "single24.yaml")
    p = build_problem(spec)
    cost = CostModel.for_cluster(spec)
    t4s = [n for n in spec.nodes if n.gpu == "T4"][:10]
    placement = {n.name: (8 * i, 8 * i + 8) for i, n in enumerate(t4s)}
    stats = path_stats(p, placement, max_flow(p, placement))
    links = [(COORDINATOR, t4s[0].name), *zip([n.name for n in t4s], [n.name for n in t4s[1:]]),
             (t4s[-1].name, COORDINATOR)]
    expected = sum(p.link(a, b).latency_s for a, b in links) + \
        sum(8 * cost.decode_layer_latency_s(n, 8) for n in t4s)
    assert stats.depth_max == 10
    assert stats.latency_mean_s == pytest.approx(expected, rel=1e-9)
    # The two differ, so the check above tells k = 8 from k = 4 (0.63x at the default 256-token
    # step budget, which caps both batches; under 0.5x at 512).
    assert cost.decode_layer_latency_s(t4s[0], 8) < 0.75 * cost.decode_layer_latency_s(t4s[0], 4)


def test_per_k_latency_falls_back_to_the_scalar():
    from dataclasses import replace
    node = replace(make_node("a", (100, 100, 100)), layer_latency_s_by_k=(1.0, 2.0))
    assert [node.layer_latency(k) for k in (1, 2, 3)] == [1.0, 2.0, 1e-3]
    p = make_problem([node], 2)
    stats = path_stats(p, {"a": (0, 2)}, max_flow(p, {"a": (0, 2)}))
    assert stats.latency_mean_s == pytest.approx(2e-3 + 2 * 2.0)
