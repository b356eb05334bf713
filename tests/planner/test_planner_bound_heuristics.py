"""The bound is never below a found flow; every heuristic yields a valid placement."""

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.search.bounds import fixed_point_bound
from planner.search.construct import regional, stages, sweep
from planner.flowgraph import max_flow
from planner.search.baselines import HEURISTICS, WARM_STARTS
from planner.reference import reference_single24_70b
from planner.verify import check_placement
from tests.builders.problems import brute_force, random_problem


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), n=st.integers(2, 6), L=st.integers(2, 10),
       regions=st.integers(1, 3), inter=st.floats(1.0, 500.0), partial=st.booleans())
def test_bound_never_below_any_found_flow(seed, n, L, regions, inter, partial):
    rng = random.Random(seed)
    p = random_problem(rng, n, L, kmax=4, regions=regions, inter_region_cap=inter)
    bound = fixed_point_bound(p)
    placements = [h(p, seed) for h in WARM_STARTS.values()] + [
        sweep(p, seed, partial), regional(p, seed, partial), stages(p, seed, partial)]
    for _ in range(20):  # random placements too
        pl = {}
        for node in p.nodes:
            k = rng.randint(1, min(L, len(node.throughput_tokens_per_s)))
            s = rng.randint(0, L - k)
            pl[node.name] = (s, s + k)
        placements.append(pl)
    for pl in placements:
        assert max_flow(p, pl, partial).value_tokens_per_s <= bound * (1 + 1e-9) + 1e-9


@pytest.mark.parametrize("seed", range(4))
def test_bound_at_least_brute_force_optimum(seed):
    p = random_problem(random.Random(seed), 3, 6, 3, regions=2, inter_region_cap=30.0)
    assert brute_force(p, True) <= fixed_point_bound(p) * (1 + 1e-9)


def test_reference_bound_is_the_tight_fixed_point():
    # The reference's own bound sum_i max_k k T_i(k) / L is 2803.85; the fixed point is 2046.
    assert fixed_point_bound(reference_single24_70b()) == pytest.approx(2046.0, rel=1e-6)


@pytest.mark.parametrize("name", sorted(WARM_STARTS) + ["sweep", "regional", "stages"])
@pytest.mark.parametrize("seed", range(5))
def test_each_heuristic_yields_a_valid_placement(name, seed):
    p = random_problem(random.Random(seed), 8, 12, kmax=6, regions=2, inter_region_cap=50.0)
    fn = {"sweep": sweep, "regional": regional, "stages": stages}.get(name) or WARM_STARTS[name]
    placement = fn(p, seed)
    check_placement(p, placement)  # raises on any memory / range violation
    for partial in (False, True):
        flow = max_flow(p, placement, partial).value_tokens_per_s
        assert flow == pytest.approx(_oracle_max_flow(p, placement, partial), rel=1e-9, abs=1e-9)
        # Every factory node serves tokens and every link has capacity: it serves iff stages chain.
        assert (flow > 0) == _chain_covers(p, placement, partial)


def _oracle_max_flow(p, placement, partial) -> float:
    """The issue's flow graph written out again here, solved by networkx's Edmonds-Karp."""
    import networkx as nx
    from networkx.algorithms.flow import edmonds_karp
    L, g = p.num_layers, nx.DiGraph()
    g.add_nodes_from(["src", "sink"])
    for a, (s, e) in placement.items():
        g.add_edge((a, "in"), (a, "out"), capacity=p.node(a).throughput(e - s))
        if s == 0 and p.link("coordinator", a):
            g.add_edge("src", (a, "in"), capacity=p.link("coordinator", a).capacity_tokens_per_s)
        if e == L and p.link(a, "coordinator"):
            g.add_edge((a, "out"), "sink", capacity=p.link(a, "coordinator").capacity_tokens_per_s)
        for b, (s2, e2) in placement.items():
            meets = s2 == e or (partial and s2 <= e < e2)
            if b != a and meets and p.link(a, b):
                g.add_edge((a, "out"), (b, "in"), capacity=p.link(a, b).capacity_tokens_per_s)
    return nx.maximum_flow_value(g, "src", "sink", flow_func=edmonds_karp)


def _chain_covers(p, placement, partial) -> bool:
    """Some chain of ranges, each continuing where the last stopped, runs from layer 0 to the end."""
    reach, grew = {0}, True
    while grew:
        grew = False
        for s, e in placement.values():
            if e not in reach and any(b == s or (partial and s <= b < e) for b in reach):
                reach.add(e)
                grew = True
    return p.num_layers in reach


@pytest.mark.parametrize("name", sorted(HEURISTICS))
def test_heuristics_on_the_reference_case(name):
    p = reference_single24_70b()
    placement = HEURISTICS[name](p, 0)
    check_placement(p, placement)
    flow = max_flow(p, placement).value_tokens_per_s
    if name == "separate":  # no GPU kind can hold 80 layers alone (48, 56, 48)
        assert placement == {} and flow == 0
    else:
        assert 0 < flow <= 2046 + 1e-6


def test_local_search_never_worsens_and_keeps_placements_valid():
    import time

    from planner.search.baselines import petals
    from planner.search.local_search import improve
    p = reference_single24_70b()
    start = petals(p, 0)
    flows = max_flow(p, start)
    placement, better = improve(p, start, flows, True, time.perf_counter() + 3.0, seed=1)
    check_placement(p, placement)
    assert better.value_tokens_per_s >= flows.value_tokens_per_s
    assert max_flow(p, placement).value_tokens_per_s == pytest.approx(better.value_tokens_per_s)


@pytest.mark.parametrize("threads", [1, 2])
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), n=st.integers(2, 4), L=st.integers(2, 6),
       regions=st.integers(1, 2), inter=st.floats(1.0, 300.0), partial=st.booleans())
def test_solve_reports_a_bound_above_every_heuristic_flow(threads, seed, n, L, regions, inter,
                                                          partial):
    """The bound solve() prints (not just the fixed point) is never below a flow anyone found,
    and the MILP never returns less than the best heuristic."""
    from hypothesis import assume

    from helix.core.errors import InfeasibleError
    from planner import solve
    p = random_problem(random.Random(seed), n, L, kmax=4, regions=regions, inter_region_cap=inter)
    try:
        plan = solve(p, "milp", threads=threads, time_limit_s=3, gap=0.0, partial_inference=partial,
                     seed=seed)
    except InfeasibleError:
        assume(False)
    flows = [max_flow(p, h(p, seed), partial).value_tokens_per_s for h in WARM_STARTS.values()]
    flows += [max_flow(p, f(p, seed, partial), partial).value_tokens_per_s
              for f in (sweep, regional, stages)]
    assert plan.upper_bound_tokens_per_s >= max(flows) * (1 - 1e-6)
    assert plan.upper_bound_tokens_per_s >= plan.max_flow_tokens_per_s * (1 - 1e-6)
    assert plan.max_flow_tokens_per_s >= max(flows) * (1 - 1e-6)
