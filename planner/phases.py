"""The search's phases after the warm starts: the packing LP and the cover bound (``_cover``),
the class MILP (``_class_milp``), the paper MILP on small clusters (``_exact_milp``), each taking
the search state and returning it with what it found, and local search on the exact max flow
(``_polish``), which improves one candidate. :func:`planner.solve._milp` runs them in order, each
until its share of the time limit."""

from __future__ import annotations

import dataclasses
import math
import time

from planner.milp import class_model, paper_model
from planner.milp.linear import LinearModel
from planner.milp.solvers import HighsAdapter, SolveOptions
from planner.problem import PlacementProblem
from planner.report import ClassMilpRun, CoverRun, PaperMilpRun
from planner.search import local_search
from planner.search.cover import cover_search
from planner.search.packing import packing_bound
from planner.search_state import Candidate, _Search, _State


def class_model_is_exact(problem: PlacementProblem, bound: float) -> bool:
    """One region, every node pair linked both ways with capacity >= the bound: links never bind."""
    if len({n.region for n in problem.nodes}) != 1:
        return False
    for a in problem.nodes:
        for b in problem.nodes:
            if a.name != b.name:
                link = problem.link(a.name, b.name)
                if link is None or link.capacity_tokens_per_s < bound:
                    return False
    return True


def _exact_milp(run: _Search, state: _State) -> _State:
    """The paper MILP, exact on every node, link, source and sink arc, warm-started from the
    best and capped at the best bound, ending at 90 % of the time limit: on small clusters it
    finds and proves what the relaxed class MILP cannot where links bind. Its dual bound joins
    the state's; its incumbent is measured and kept when better."""
    problem, best, U = run.problem, state.best, state.bound
    gap, end_s = run.options.gap, 0.9 * run.options.time_limit_s
    lp, v = paper_model.build_paper_model(problem, run.partial, run.min_k, flow_bound=U)
    fixed = paper_model.integer_values(problem, lp, v, best.placement, run.partial)
    warm = _complete(lp, fixed, run.solver_options(end_s)) if fixed else None

    def stop(primal, dual):
        return min(U, dual) <= max(best.value, primal) * (1 + max(gap, 1e-6))

    res = run.adapter.solve(lp, run.solver_options(end_s, None, warm, stop))
    state = state.with_phase(PaperMilpRun(res.status, res.seconds))
    if res.bound is not None:
        state = state.with_bound("paper_milp", res.bound)
    if res.values is not None:
        cand = run.evaluate(paper_model.extract(problem, v, res.values), "paper-milp")
        if cand.value > best.value:
            return state.with_best(cand)
    return state


def _cover(run: _Search, state: _State, deadline_s: float) -> _State:
    """Cover bound (``planner.search.cover``) from the incumbent's gap target up; the placements
    that cover a target are measured and kept when they beat the incumbent."""
    best = state.best
    if best.value <= 0:
        return state
    o = run.options
    target, known = best.value * (1 + max(o.gap, 1e-6)), state.bound
    again = any(isinstance(p, CoverRun) for p in state.phases)   # the gap target was tried
    if not again:  # the packing LP first: a fraction of a second a target where it decides
        packed = packing_bound(run.problem, run.adapter, best.value, known,
                               min(deadline_s, time.perf_counter() + 0.05 * o.time_limit_s),
                               run.min_k)
        if packed is not None:
            state, known = state.with_bound("packing", packed), packed
    res = cover_search(run.problem, run.adapter, target, known, deadline_s,
                       step_s=max(0.5, 0.05 * o.time_limit_s), threads=o.threads, seed=o.seed,
                       min_layers=run.min_k, optimal_at=best.value * (1 + 1e-7),
                       first=known - 0.25 * (known - target) if again else None)
    state = state.with_phase(CoverRun(tuple((round(x, 3), verdict) for x, verdict in res.tried)))
    if res.bound is not None:
        state = state.with_bound("cover", res.bound)
    for placement in res.placements:
        cand = run.evaluate(placement, "cover")
        if cand.value > best.value:
            best = cand
    return state.with_best(best)


def _class_milp(run: _Search, state: _State) -> _State:
    """The class MILP, warm-started from the best, ending at 75 % of the time limit.

    Its proven bound joins the state's: it holds for the exact problem because the class model
    relaxes it (see ``planner.milp.class_model``); its own status (``milp_status``) speaks of the
    class model only."""
    problem, best, bound = run.problem, state.best, state.bound
    gap, end_s, progress = run.options.gap, 0.75 * run.options.time_limit_s, run.options.progress
    model = class_model.build_class_model(problem, run.partial, run.min_k, flow_bound=bound)
    exact = class_model_is_exact(problem, bound)
    warm = _complete(model.lp, class_model.hold_values(model, best.placement),
                     run.solver_options(end_s)) if best.placement else None

    def stop(primal, dual):
        inc = max(best.value, primal if exact and math.isfinite(primal) else 0.0)
        return inc > 0 and min(bound, dual) <= inc * (1 + gap)

    def shown(elapsed, primal, dual):
        # The live line shows real flows and valid bounds: a relaxed model's primal is neither.
        if progress is not None:
            inc = max(best.value, primal if exact and math.isfinite(primal) else 0.0)
            progress(elapsed, inc, min(bound, dual))

    res = run.adapter.solve(model.lp, run.solver_options(end_s, shown, warm, stop))
    state = state.with_phase(ClassMilpRun(res.solver, best.source, best.value, len(model.classes),
                                          exact, res.seconds, res.status))
    cand = best
    if res.values is not None:
        bad = model.lp.violations(res.values, tol=1e-5)
        if bad:
            raise AssertionError(f"solver returned a solution violating {bad[:3]}")
        mine = run.evaluate(class_model.extract(model, res.values), "milp")
        if exact and mine.value < res.objective * (1 - 1e-6) - 1e-6:
            raise AssertionError(f"class model is exact but max flow {mine.value} < "
                                 f"objective {res.objective}")
        if mine.value > cand.value:
            cand = mine
    if res.bound is not None:
        state = state.with_bound("class_milp", res.bound)
    return state.with_best(cand)


def _polish(run: _Search, cand: Candidate, deadline_s: float, target: float) -> Candidate:
    if not cand.placement or cand.value >= target:
        return cand
    placement, flows = local_search.improve(run.problem, cand.placement, cand.flows, run.partial,
                                            deadline_s, run.options.seed, target, run.min_k)
    if flows.value_tokens_per_s > cand.value:
        return Candidate(placement, flows, cand.source + "+local")
    return cand


def _complete(lp: LinearModel, fixed: dict[int, float], options: SolveOptions):
    """A full assignment for a warm start: fix the integers, solve the LP for the rest (with the
    caller's threads and time limit; no progress callback, the LP has no MIP progress)."""
    if not fixed:
        return None
    lp2 = dataclasses.replace(lp, lb=list(lp.lb), ub=list(lp.ub), integer=[False] * lp.num_vars)
    for i, v in fixed.items():
        lp2.lb[i] = lp2.ub[i] = v
    res = HighsAdapter().solve(lp2, dataclasses.replace(options, warm_start=None, progress=None))
    return list(res.values) if res.status == "optimal" and res.values else None
