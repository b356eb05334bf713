"""Max flow of a placement: against an LP max flow solved by HiGHS (an independent oracle)."""

import random

import highspy
import pytest

from planner.flowgraph import SINK, SOURCE, arc_valid, build_graph, max_flow
from planner.problem import COORDINATOR
from planner.search.baselines import fits
from planner.verify import check_flow
from tests.builders.problems import make_node, make_problem, random_problem


def lp_max_flow(g) -> float:
    """Max flow as a linear program (arc flows, conservation, capacities) solved by HiGHS."""
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    edges = list(g.edges(data="capacity"))
    x = [h.addVariable(lb=0, ub=cap) for _, _, cap in edges]
    for v in g.nodes:
        if v in (SOURCE, SINK):
            continue
        inflow = [x[i] for i, (a, b, _) in enumerate(edges) if b == v]
        outflow = [x[i] for i, (a, b, _) in enumerate(edges) if a == v]
        if inflow or outflow:
            h.addConstr(sum(inflow, 0.0 * x[0]) - sum(outflow, 0.0 * x[0]) == 0)
    h.maximize(sum((x[i] for i, (a, _, _) in enumerate(edges) if a == SOURCE), 0.0 * x[0]))
    return h.getInfo().objective_function_value


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("partial", [True, False])
def test_max_flow_matches_lp_on_random_placements(seed, partial):
    rng = random.Random(seed)
    p = random_problem(rng, num_nodes=rng.randint(3, 7), num_layers=rng.randint(4, 9), kmax=5,
                       regions=2, inter_region_cap=rng.uniform(20, 200))
    L = p.num_layers
    placement = {}
    for n in p.nodes:
        if rng.random() < 0.85:
            k = rng.randint(1, min(L, len(n.throughput_tokens_per_s)))
            s = rng.randint(0, L - k)
            placement[n.name] = (s, s + k)
    res = max_flow(p, placement, partial)
    g = build_graph(p, placement, partial)
    assert res.value_tokens_per_s == pytest.approx(lp_max_flow(g), rel=1e-6, abs=1e-6)
    check_flow(p, placement, res, partial)


def test_arc_validity_rules():
    assert arc_valid(4, 4, 8, partial_inference=False)
    assert not arc_valid(4, 3, 8, partial_inference=False)
    assert arc_valid(4, 3, 8, partial_inference=True)  # j runs only layers 4..7
    assert not arc_valid(8, 3, 8, partial_inference=True)  # nothing left for j
    assert not arc_valid(2, 3, 8, partial_inference=True)  # gap: layer 2 never runs


def test_chain_flow_is_its_slowest_stage_and_link():
    nodes = [make_node("a", (100, 60)), make_node("b", (90, 50)), make_node("c", (300,))]
    p = make_problem(nodes, 5, node_cap=55)
    res = max_flow(p, {"a": (0, 2), "b": (2, 4), "c": (4, 5)})
    assert res.value_tokens_per_s == pytest.approx(50)  # b holds 2 layers: T_b(2) = 50
    assert res.arc_flows[(COORDINATOR, "a")] == pytest.approx(50)
    p2 = make_problem(nodes, 5, node_cap=40)
    assert max_flow(p2, {"a": (0, 2), "b": (2, 4), "c": (4, 5)}).value_tokens_per_s == pytest.approx(40)


def test_partial_inference_lets_overlapping_ranges_serve():
    nodes = [make_node("a", (100, 100, 100)), make_node("b", (100, 100, 100))]
    p = make_problem(nodes, 4)
    placement = {"a": (0, 3), "b": (1, 4)}
    assert max_flow(p, placement, partial_inference=False).value_tokens_per_s == 0
    assert max_flow(p, placement, partial_inference=True).value_tokens_per_s == pytest.approx(100)


def test_float_residue_that_breaks_preflow_push_still_gives_the_max_flow():
    """networkx's preflow-push raises IndexError on this graph (float residue, networkx#7775);
    max_flow must still answer, equal to the LP."""
    p = random_problem(random.Random(335), 5, 4, kmax=4, regions=1, inter_region_cap=1.0)
    placement = {"n0": (2, 4), "n1": (1, 2), "n2": (0, 1), "n3": (0, 2), "n4": (2, 3)}
    res = max_flow(p, placement, partial_inference=False)
    g = build_graph(p, placement, partial_inference=False)
    assert res.value_tokens_per_s == pytest.approx(lp_max_flow(g), rel=1e-6, abs=1e-6)
    check_flow(p, placement, res, partial_inference=False)


def _random_placement(rng, p, share=0.9):
    L = p.num_layers
    placement = {}
    for n in p.nodes:
        if rng.random() < share:
            k = rng.randint(1, min(L, len(n.throughput_tokens_per_s)))
            s = rng.randint(0, L - k)
            placement[n.name] = (s, s + k)
    return placement


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("partial", [True, False])
def test_hubs_keep_the_max_flow_and_give_a_feasible_pair_flow(seed, partial):
    """Arcs merged through hubs (where no link of a block can bind) give the max flow of the full
    graph (HiGHS LP on the graph without hubs), and the pair flows they are split back into
    pass the independent flow check (link and node capacities, conservation)."""
    rng = random.Random(seed)
    nodes = random_problem(rng, num_nodes=rng.randint(6, 18), num_layers=rng.randint(4, 9), kmax=5,
                           regions=rng.randint(1, 3)).nodes
    names = [n.name for n in nodes]
    drop = {(a, b) for a in names for b in names if rng.random() < 0.05}
    p = make_problem(nodes, rng.randint(4, 9), inter_region_cap=rng.uniform(20, 300),
                     drop=drop)
    placement = _random_placement(rng, p)
    with_hubs = max_flow(p, placement, partial, hubs=True)
    full = build_graph(p, placement, partial, hubs=False)
    assert with_hubs.value_tokens_per_s == pytest.approx(lp_max_flow(full), rel=1e-6, abs=1e-6)
    assert with_hubs.value_tokens_per_s == pytest.approx(
        max_flow(p, placement, partial, hubs=False).value_tokens_per_s, rel=1e-9, abs=1e-9)
    check_flow(p, placement, with_hubs, partial)
    assert all(len(u) <= 2 for u in build_graph(p, placement, partial, hubs=False))


def test_hubs_shrink_large_graphs_and_are_the_default_there():
    rng = random.Random(5)
    p = random_problem(rng, num_nodes=400, num_layers=12, kmax=6, regions=3,
                       inter_region_cap=150.0)
    placement = _random_placement(rng, p, share=1.0)
    full = build_graph(p, placement, True, hubs=False)
    merged = build_graph(p, placement, True)   # the default at this size
    assert full.number_of_edges() > 20_000
    assert merged.number_of_edges() < full.number_of_edges() / 5
    assert any(len(v) > 2 for v in merged)  # hubs
    res = max_flow(p, placement, True)
    assert res.value_tokens_per_s == pytest.approx(
        max_flow(p, placement, True, hubs=False).value_tokens_per_s, rel=1e-9)
    check_flow(p, placement, res, True)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("hubs", [False, True])
def test_verify_checks_large_graphs_with_a_min_cut(seed, hubs, monkeypatch):
    """Above verify.CUT_MIN_ARCS arcs the flow must leave a cut of its own value: true for the max
    flows of random placements (with and without hubs), false for a flow that is not maximal."""
    import dataclasses

    from planner import verify as verify_mod
    monkeypatch.setattr(verify_mod, "CUT_MIN_ARCS", 0)
    monkeypatch.setattr(verify_mod, "build_graph",
                        lambda *a: build_graph(*a, hubs=hubs))
    rng = random.Random(seed)
    p = random_problem(rng, num_nodes=rng.randint(4, 10), num_layers=rng.randint(4, 8), kmax=4,
                       regions=2, inter_region_cap=rng.uniform(20, 200))
    placement = {n: r for n, r in _random_placement(rng, p).items()
                 if fits(p.node(n), *r, p.num_layers)}
    res = max_flow(p, placement, True, hubs=hubs)
    assert verify_mod.cut_capacity(build_graph(p, placement, True, hubs=hubs), res) == \
        pytest.approx(lp_max_flow(build_graph(p, placement, True, hubs=False)), rel=1e-7, abs=1e-7)
    verify_mod.verify(p, placement, res, True)
    if res.value_tokens_per_s > 1:   # half of every flow: feasible, but not the max
        half = dataclasses.replace(
            res, value_tokens_per_s=res.value_tokens_per_s / 2,
            arc_flows={a: f / 2 for a, f in res.arc_flows.items()},
            node_flows={n: f / 2 for n, f in res.node_flows.items()})
        with pytest.raises(verify_mod.PlannerBug, match="not maximal"):
            verify_mod.verify(p, placement, half, True)
