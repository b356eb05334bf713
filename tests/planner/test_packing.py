"""The packing bound (planner.search.packing) against brute force, and where it beats the fixed point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helix.core.spec import ClusterSpec, load_cluster
from planner.build import build_problem
from planner.milp.solvers import HighsAdapter
from planner.search.bounds import fixed_point_bound
from planner.search.packing import packing_bound, verdict
from tests.planner.test_planner_honesty import SEEDS, binding_problem, true_optimum

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("partial", [True, False])
def test_packing_never_refutes_a_flow_some_placement_serves(partial):
    """On every brute-forced tiny cluster the optimum is never refuted, and the bisected bound
    (from a tenth of the optimum up to the fixed point) stays >= the optimum."""
    adapter, tighter = HighsAdapter(), 0
    for seed in SEEDS:
        problem = binding_problem(seed)
        best = true_optimum(problem, partial)
        if best <= 0:
            continue
        assert verdict(problem, adapter, best * (1 - 1e-6), 10.0) == "open", seed
        fp = fixed_point_bound(problem)
        bound = packing_bound(problem, adapter, 0.1 * best, fp, float("inf"), steps=20)
        if bound is not None:
            assert bound >= best * (1 - 1e-6), (seed, bound, best)
            tighter += bound < fp * (1 - 1e-3)
    assert tighter, "no tiny cluster where the packing bound is below the fixed point"


def geo24_30b_frozen() -> ClusterSpec:
    """geo24 with LLaMA-1 30B and the T(k) tables the cost model gave at commit 325731a (before
    decode attention was added to the GEMMs and paid for GQA re-reads), frozen as explicit tables
    (``data/geo24_llama1_30b_tk.json``) so that this instance stays the one the bound was built on:
    with today's T(k) the packing bound equals the fixed point on geo24 30B."""
    spec = load_cluster(str(REPO / "cluster_specs" / "geo24.yaml"))
    data = spec.model_dump(by_alias=True, exclude_none=True)
    data["model"] = "llama-1-30b"
    data["performance"] = {"throughput_tables": json.loads(
        (REPO / "tests" / "planner" / "data" / "geo24_llama1_30b_tk.json").read_text())}
    return ClusterSpec.model_validate(data)


def test_packing_beats_the_fixed_point_on_geo24_30b():
    """geo24 with LLaMA-1 30B (frozen T(k)): k T(k) peaks at a few layers, so every layer needs
    several whole nodes; the fixed point (21,437.5) lets capacity split at will, the packing LP
    refutes 21,100."""
    problem = build_problem(geo24_30b_frozen())
    fp = fixed_point_bound(problem)
    assert fp == pytest.approx(21437.5, rel=1e-3)
    assert verdict(problem, HighsAdapter(), 21100.0, 30.0) == "refuted"
    assert verdict(problem, HighsAdapter(), 16792.0, 30.0) == "open"  # a placement serves it
