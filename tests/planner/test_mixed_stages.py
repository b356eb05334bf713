"""Mixed-kind stages (``planner.search.mixed_stages``): a warm start where one-kind stages leave
layers over; measured by the exact max flow, checked against brute force and the reference's
42-node case."""

from __future__ import annotations

import dataclasses

import pytest

from helix.helix_ini import convert_ini, load_throughput_tables
from planner import solve
from planner.build import build_problem
from planner.flowgraph import max_flow
from planner.problem import COORDINATOR, Link, NodeCapacity, PlacementProblem
from planner.search import construct
from planner.search.mixed_stages import mixed_stages
from tests.planner.test_planner_honesty import true_optimum


def _two_kinds() -> PlacementProblem:
    """Two nodes of different kinds, 2 layers, fast links: one holding both layers each, side by
    side, serves 6 + 4 = 10; a chain of one-kind stages serves min(10, 7) = 7."""
    nodes = tuple(NodeCapacity(name=n, gpu=n, region="r", throughput_tokens_per_s=t, max_layers=2,
                               max_layers_first=2, max_layers_last=2, max_layers_first_last=2)
                  for n, t in (("a", (10.0, 6.0)), ("b", (7.0, 4.0))))
    links = {(x, y): Link(1e6) for x in ("a", "b", COORDINATOR) for y in ("a", "b", COORDINATOR)
             if x != y}
    return PlacementProblem("tiny", 2, nodes, links)


def test_a_mixed_stage_reaches_the_brute_force_optimum_one_kind_stages_miss():
    problem = _two_kinds()
    best = true_optimum(problem, True)
    assert best == pytest.approx(10.0)
    mixed = max_flow(problem, mixed_stages(problem)).value_tokens_per_s
    one_kind = max_flow(problem, construct.stages(problem)).value_tokens_per_s
    assert mixed == pytest.approx(best) and one_kind == pytest.approx(7.0)


def test_multi_region_clusters_get_no_mixed_stages():
    problem = _two_kinds()
    nodes = (problem.nodes[0], dataclasses.replace(problem.nodes[1], region="q"))
    assert mixed_stages(PlacementProblem("tiny", 2, nodes, problem.links)) == {}


def test_the_42_node_reference_case_passes_5870(shared_data):
    """Issue 11's target (>= 1.2 x the best published 4,892.24): one-kind stages gave 5,813.7."""
    cases = shared_data / "reference_cases"
    tables = load_throughput_tables(cases / "throughput_tables.yaml", "cluster42")
    problem = build_problem(convert_ini(cases / "cluster42.ini", cases / "machine_profiles_cluster42.ini",
                                        "llama-2-70b", throughput_tables=tables).spec)
    assert max_flow(problem, mixed_stages(problem)).value_tokens_per_s >= 5870
    plan = solve(problem, "milp", time_limit_s=10, threads=1)
    assert plan.max_flow_tokens_per_s >= 5870
    assert plan.upper_bound_tokens_per_s <= 6528.9 * (1 + 1e-6)
