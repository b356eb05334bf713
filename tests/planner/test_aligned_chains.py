"""Aligned chains: one chain per region, each region's weak layers lined up against another's
strong ones, the slow links evening out the difference."""

from __future__ import annotations

import time

import pytest

from planner import solve
from planner.flowgraph import max_flow
from planner.search.aligned_chains import aligned_chains
from planner.search.construct import region_problem
from tests.builders.problems import brute_force, make_node, make_problem


def two_regions():
    """Each region holds the 5 layers alone, but only as a chain strong on 3 layers and weak on
    2 (r0 alone serves 38, r1 30); 15 tokens/s links between the regions."""
    nodes = [make_node("r0n0", (150, 75, 50, 38), gpu="A", region="r0"),
             make_node("r0n1", (60, 30), gpu="B", region="r0"),
             make_node("r1n0", (60, 30, 20), gpu="B3", region="r1"),
             make_node("r1n1", (150, 75, 50), gpu="A3", region="r1")]
    return make_problem(nodes, 5, inter_region_cap=15.0)


def test_chains_line_up_across_regions_and_reach_the_optimum():
    """75 is the optimum: ``brute_force(two_regions(), True)`` (every placement, 8 s, so not
    run here) finds no more; each region alone serves 38 and 30."""
    p = two_regions()
    alone = sum(brute_force(region_problem(p, r), True) for r in ("r0", "r1"))
    placement = aligned_chains(p, restarts=1, steps=2_000)
    value = max_flow(p, placement).value_tokens_per_s
    assert alone == pytest.approx(68.0)
    assert value == pytest.approx(75.0)
    # r0 strong on layers 0-2, r1 on 2-4: one link evens out the 15 tokens/s between them
    assert placement == {"r0n0": (0, 3), "r0n1": (3, 5), "r1n0": (0, 2), "r1n1": (2, 5)}


def test_solve_keeps_the_aligned_chains():
    plan = solve(two_regions(), "milp", time_limit_s=5, threads=1)
    assert plan.max_flow_tokens_per_s == pytest.approx(75.0)
    assert plan.extras["found_by"].startswith("aligned-chains")


def test_every_node_holds_at_least_min_layers():
    placement = aligned_chains(two_regions(), restarts=1, steps=500, min_layers=2)
    assert placement and all(e - s >= 2 for s, e in placement.values())
    # r0's second node holds at most 2 layers and r1's two at most 3 each: no chain of >= 3
    assert aligned_chains(two_regions(), restarts=1, steps=500, min_layers=3) == {}


def test_one_region_or_none_that_holds_the_model_gets_nothing():
    single = make_problem([make_node(f"n{i}", (100, 50)) for i in range(3)], 4)
    assert aligned_chains(single) == {}
    short = make_problem([make_node("a", (100, 50), region="r0"),
                          make_node("b", (100, 50), region="r1")], 4, inter_region_cap=10.0)
    assert aligned_chains(short) == {}


def test_regions_that_cannot_hold_the_model_keep_their_start_ranges():
    nodes = [make_node(f"{x}{i}", (90, 45, 30), region=f"r{j}")
             for j, x in enumerate("ab") for i in range(2)] + [make_node("c0", (90, 45), region="r2")]
    p = make_problem(nodes, 5, inter_region_cap=20.0)
    placement = aligned_chains(p, start={"c0": (3, 5)}, restarts=1, steps=500)
    assert placement["c0"] == (3, 5)
    for x in "ab":  # one chain per region over [0, 5)
        ranges = sorted(r for n, r in placement.items() if n[0] == x)
        assert [s for s, _ in ranges] == [0] + [e for _, e in ranges[:-1]] and ranges[-1][1] == 5


def test_geo24_30b_regions_cost_nothing():
    """geo24 (LLaMA-1 30B): the regional MILP's union served 13,199.2 tokens/s; two annealing runs
    lines the chains up to single24's best on the same nodes (13,304.9; the other
    restart 13,242.8)."""
    p = _geo24("llama-1-30b")
    t0 = time.perf_counter()
    value = max_flow(p, aligned_chains(p, restarts=2)).value_tokens_per_s
    assert value >= 13_228.0   # a 3 % gap against the 13,624.5 bound
    assert time.perf_counter() - t0 < 20


def test_geo24_70b_beats_the_regional_milp():
    """geo24 (LLaMA-2 70B): the regional MILP served 8,931.6 tokens/s and the best warm start
    8,122 (separate); one annealing run serves 9,161.1 (single24's best on the same nodes),
    enough for a 3 % gap against the fixed point (9,391.0 then, 9,351.0 now)."""
    p = _geo24("llama-2-70b")
    assert max_flow(p, aligned_chains(p, restarts=1)).value_tokens_per_s >= 9_117.5


def _geo24(model: str):
    from pathlib import Path

    from helix.core.models import resolve_model
    from helix.core.spec import load_cluster
    from planner.build import build_problem
    spec = load_cluster(Path(__file__).resolve().parents[2] / "cluster_specs" / "geo24.yaml")
    return build_problem(spec, resolve_model(model))
