"""Solver adapters: HiGHS and Gurobi agree; Gurobi's licence errors fall back to HiGHS with a warning."""

import logging
import random
import sys

import pytest

from planner import solve
from planner.search.bounds import fixed_point_bound
from planner.milp.class_model import build_class_model
from planner.reference import reference_single24_70b
from planner.milp.solvers import FallbackAdapter, HighsAdapter, SolveOptions, make_solver
from tests.builders.problems import random_problem

OPTS = SolveOptions(time_limit_s=30, threads=1, rel_gap=0.0)


def _small_model(seed):
    p = random_problem(random.Random(seed), 3, 6, 3)
    return build_class_model(p, True, flow_bound=fixed_point_bound(p)).lp


@pytest.mark.parametrize("seed", [0, 3, 5])
def test_gurobi_and_highs_agree_on_small_models(seed):
    pytest.importorskip("gurobipy")
    from planner.milp.solvers import GurobiAdapter
    lp = _small_model(seed)
    a, b = HighsAdapter().solve(lp, OPTS), GurobiAdapter().solve(lp, OPTS)
    assert a.status == b.status == "optimal"
    assert a.objective == pytest.approx(b.objective, rel=1e-6, abs=1e-6)
    assert not lp.violations(b.values, tol=1e-5)


def test_size_limited_licence_falls_back_to_highs_with_one_warning(caplog):
    pytest.importorskip("gurobipy")
    p = reference_single24_70b()
    lp = build_class_model(p, True, flow_bound=fixed_point_bound(p)).lp  # > 2000 variables
    adapter = make_solver("gurobi")
    with caplog.at_level(logging.WARNING, logger="helix.planner"):
        res = adapter.solve(lp, SolveOptions(time_limit_s=30, threads=1))
        res2 = adapter.solve(lp, SolveOptions(time_limit_s=30, threads=1))
    if res.solver == "gurobi":
        pytest.skip("a full Gurobi licence is installed: nothing to fall back from")
    assert res.solver == res2.solver == "highs" and res.objective == pytest.approx(2046, rel=1e-6)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "10010" in warnings[0].getMessage()
    assert "\n" not in warnings[0].getMessage()


def test_missing_gurobipy_falls_back(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "gurobipy", None)  # import gurobipy -> ImportError
    with caplog.at_level(logging.WARNING, logger="helix.planner"):
        res = FallbackAdapter().solve(_small_model(0), OPTS)
    assert res.solver == "highs" and "not installed" in caplog.text


def test_solve_records_the_solver_that_ran(monkeypatch):
    monkeypatch.setitem(sys.modules, "gurobipy", None)
    plan = solve(reference_single24_70b(), "milp", solver="gurobi", warm_starts=False, threads=1)
    assert plan.solver == "highs" and plan.max_flow_tokens_per_s >= 2000


def test_highs_honours_a_new_thread_count_in_the_same_process():
    """HiGHS fixes its thread pool on its first run; a later run with other threads must still solve
    (highspy 1.15 otherwise returns status not_set with a dual bound of 0 in milliseconds)."""
    p = reference_single24_70b()
    lp = build_class_model(p, True, flow_bound=fixed_point_bound(p)).lp
    for threads in (1, 2, 1):
        res = HighsAdapter().solve(lp, SolveOptions(time_limit_s=30, threads=threads))
        assert res.status == "optimal", threads
        assert res.objective == pytest.approx(2046, rel=1e-6)
        assert res.bound == pytest.approx(2046, rel=1e-6)



def test_highs_refusing_an_option_is_an_error_not_a_silent_default():
    with pytest.raises(ValueError, match="time_limit"):
        HighsAdapter().solve(_small_model(0), SolveOptions(time_limit_s=-1.0, threads=1))
