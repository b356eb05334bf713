"""MILP optima against brute force over every placement of tiny clusters."""

import random

import pytest

from planner import solve
from planner.milp import class_model, paper_model
from planner.search.bounds import fixed_point_bound
from planner.flowgraph import max_flow
from planner.milp.solvers import HighsAdapter, SolveOptions
from tests.builders.problems import brute_force, make_node, make_problem, random_problem

EXACT = SolveOptions(time_limit_s=60, threads=1, rel_gap=0.0)

CASES = [(seed, n, L, kmax) for seed, (n, L, kmax) in enumerate(
    [(3, 6, 3), (3, 8, 3), (4, 6, 2), (3, 7, 3), (4, 6, 2), (3, 8, 3)])]


def _class_optimum(problem, partial):
    model = class_model.build_class_model(problem, partial, flow_bound=fixed_point_bound(problem))
    res = HighsAdapter().solve(model.lp, EXACT)
    assert res.status == "optimal"
    placement = class_model.extract(model, res.values)
    return res.objective, max_flow(problem, placement, partial).value_tokens_per_s


def _paper_optimum(problem, partial):
    lp, v = paper_model.build_paper_model(problem, partial)
    res = HighsAdapter().solve(lp, EXACT)
    assert res.status == "optimal"
    placement = paper_model.extract(problem, v, res.values)
    return res.objective, max_flow(problem, placement, partial).value_tokens_per_s


@pytest.mark.parametrize("partial", [True, False])
@pytest.mark.parametrize("seed,n,L,kmax", CASES)
def test_both_milps_match_brute_force(seed, n, L, kmax, partial):
    problem = random_problem(random.Random(seed), n, L, kmax)
    best = brute_force(problem, partial)
    objective, flow = _class_optimum(problem, partial)
    assert objective == pytest.approx(best, rel=1e-6, abs=1e-6)
    assert flow == pytest.approx(best, rel=1e-6, abs=1e-6)
    objective, flow = _paper_optimum(problem, partial)
    assert objective == pytest.approx(best, rel=1e-6, abs=1e-6)
    assert flow == pytest.approx(best, rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("seed", [103, 105, 108, 110])
def test_binding_network_class_model_bounds_and_paper_model_matches(seed):
    problem = random_problem(random.Random(seed), 4, 6, 2, regions=2, inter_region_cap=15.0)
    best = brute_force(problem, True)
    objective, flow = _class_optimum(problem, True)
    assert objective >= best * (1 - 1e-6)  # a relaxation where links bind
    assert flow <= best * (1 + 1e-6)
    objective, flow = _paper_optimum(problem, True)
    assert objective == pytest.approx(best, rel=1e-6, abs=1e-6)
    plan = solve(problem, "milp", gap=0.0, time_limit_s=30)
    assert plan.upper_bound_tokens_per_s >= best * (1 - 1e-6)
    assert plan.max_flow_tokens_per_s <= best * (1 + 1e-6)


def test_memory_limits_for_embedding_and_head_are_respected():
    # 'big' can hold 4 layers in the middle but only 2 with the embedding or the LM head.
    big = make_node("big", (100, 100, 100, 100), first=2, last=2, both=0)
    small = make_node("small", (100, 100), first=2, last=2, both=0)
    problem = make_problem([big, small], 6)
    best = brute_force(problem, True)
    assert best == 0  # 6 layers need 2 + 4 with 'big' in the middle: impossible with two nodes
    problem = make_problem([big, small, make_node("s2", (100, 100))], 6)
    assert brute_force(problem, True) == pytest.approx(100)
    plan = solve(problem, "milp", gap=0.0, time_limit_s=30)
    assert plan.max_flow_tokens_per_s == pytest.approx(100)
    for placement in plan.placements:
        if placement.node == "big" and (placement.start == 0 or placement.end == 6):
            assert placement.num_layers <= 2
