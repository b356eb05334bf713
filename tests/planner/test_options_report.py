"""PlanOptions (checked once, when made) and SearchReport (what the search proved, typed; the
plan file keeps it as it always has)."""

import random

import pytest

from helix.core.errors import HelixUserError
from planner import PlanOptions, SearchReport, solve
from planner.report import ClassMilpRun, CoverRun, MilpSkipped, PaperMilpRun
from tests.builders.problems import random_problem


@pytest.mark.parametrize("changes, message", [
    ({"method": "magic"}, "unknown method 'magic'; choose one of: milp, milp-paper"),
    ({"solver": "cplex"}, "unknown solver 'cplex'; choose one of: highs, gurobi"),
    ({"time_limit_s": float("nan")}, "--time-limit must be > 0"),
    ({"threads": -1}, "--threads must be >= 0"),
    ({"gap": float("inf")}, "--gap must be >= 0"),
    ({"max_depth": 0}, "--max-depth must be >= 1"),
])
def test_bad_options_fail_when_made(changes, message):
    with pytest.raises(HelixUserError, match=message):
        PlanOptions(**changes)
    with pytest.raises(HelixUserError, match=message):   # replace() checks again
        PlanOptions().replace(**changes)


def test_depth_turns_partial_inference_off_and_sets_the_layers_per_node():
    assert PlanOptions().partial and PlanOptions().min_layers(80) == 1
    deep = PlanOptions(max_depth=20)
    assert not deep.partial and deep.min_layers(80) == 4 and deep.min_layers(81) == 5


def test_the_report_reads_back_from_the_plan_it_wrote():
    """What the search proved, read from its plan: the same figures, and written again (phases
    aside, which the extras merge) the same keys in the same order."""
    problem = random_problem(random.Random(3), 4, 6, 3, regions=2, inter_region_cap=30.0)
    plan = solve(problem, PlanOptions(threads=1, time_limit_s=20, gap=0.0))
    report = SearchReport.of(plan)
    assert (report.method, report.seconds) == ("milp", plan.solve_seconds)
    assert report.bound == plan.upper_bound_tokens_per_s and report.status == "optimal"
    assert dict(report.bounds) == plan.extras["bounds"]
    phase_keys = {"cover_targets", *ClassMilpRun.__dataclass_fields__,
                  *PaperMilpRun.__dataclass_fields__, *MilpSkipped.__dataclass_fields__}
    assert {"cover_targets", "milp_status"} <= set(plan.extras)   # the cover bound, the class MILP
    assert list(report.to_extras().items()) == \
        [(k, v) for k, v in plan.extras.items() if k not in phase_keys]


def test_phases_are_written_in_the_order_they_ran():
    """A cover pass before the class MILP and one after: one list of targets, where the first
    pass put it (as the search's extras always had it)."""
    milp = ClassMilpRun("highs", "petals", 1.0, 2, False, 0.5, "optimal")
    report = SearchReport("milp", 1.0, "feasible", (("fixed_point", 2.0),), "fixed_point", "",
                          "petals", 1, 1.0, 0.1, 0.1, (),
                          phases=(CoverRun(((1.5, "covered"),)), milp,
                                  CoverRun(((1.8, "refuted"),))))
    extras = report.to_extras()
    assert list(extras)[:2] == ["cover_targets", "solver_used"]
    assert extras["cover_targets"] == [(1.5, "covered"), (1.8, "refuted")]
    assert report.solver_used == "highs" and not report.class_model_exact
    assert report.bound == 2.0 and extras["bound_fixed_point"] == 2.0
