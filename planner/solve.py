"""``solve(problem, method=...) -> Plan``: the planner's one verb.

For ``milp`` (the default): closed-form bounds (the fixed point; the crossing bound,
``planner.search.crossing``, where every token must change regions, and the sharing bound,
``planner.search.sharing``, where that crossing needs nodes beyond their full-flow layer counts)
-> every heuristic and
structured placement (``planner.search.baselines``, ``planner.search.construct``,
``planner.search.mixed_stages``, ``planner.search.region_chain``,
``planner.search.aligned_chains``, a caller's ``start``) as a warm
start, the best kept (the rest skipped once one is within ``gap`` of the bound); stop at once if
it is already within ``gap`` of the bound -> the packing LP (``planner.search.packing``, bisected
for up to 5 % of the time) -> the cover bound
(``planner.search.cover``, to 20 % of the time) -> multi-region clusters: each region's exact
class MILP, unioned -> local search on the exact max flow (to 30 %)
-> the class MILP (``planner.milp.class_model``) with node capacities capped at the bound,
warm-started, stopped as soon as the proven gap is within ``gap`` (until 75 %) -> on clusters of
at most ``PAPER_MILP_NODES`` nodes, the paper MILP (exact on every link), warm-started (until 90 %)
-> local search again -> exact max flow -> independent verification (``planner.verify``) -> Plan.
Every bound found is kept; the plan reports the least and a status that speaks of the exact
problem (``exact_status``). ``milp-paper`` runs the paper's node-level formulation
(``planner.milp.paper_model``) as the baseline. Heuristic methods return their placement with the
closed-form bounds.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass
from typing import Callable

from helix.errors import HelixUserError, InfeasibleError
from helix.plan import ArcFlow, Plan
from helix.slices import as_placement, as_slices
from planner.milp import class_model, paper_model
from planner.search import construct, local_search
from planner.search.bounds import fixed_point_bound, layer_counts
from planner.search.packing import packing_bound
from planner.flowgraph import FlowResult, Placement, max_flow
from planner.search.baselines import HEURISTICS, WARM_STARTS
from planner.search.cover import cover_search
from planner.search.crossing import crossing_bound
from planner.search.sharing import sharing_bound
from planner.search.mixed_stages import mixed_stages
from planner.search.region_chain import region_chain
from planner.search.aligned_chains import aligned_chains
from planner.latency import path_stats
from planner.milp.linear import LinearModel
from planner.problem import PlacementProblem
from planner.milp.solvers import HighsAdapter, SolveOptions, make_solver
from planner.verify import PlannerBug, verify

log = logging.getLogger("helix.planner")

METHODS = ("milp", "milp-paper", *HEURISTICS)

#: progress(elapsed_s, incumbent_tokens_per_s, bound_tokens_per_s)
Progress = Callable[[float, float, float], None]


@dataclass(frozen=True)
class Candidate:
    placement: Placement
    flows: FlowResult
    source: str

    @property
    def value(self) -> float:
        return self.flows.value_tokens_per_s


def check_feasible(problem: PlacementProblem, min_layers: int = 1) -> None:
    """Raise :class:`InfeasibleError` with numbers when no placement can hold the model once."""
    L = problem.num_layers
    most = sum(k for n in problem.nodes for k in [max(layer_counts(n, L), default=0)] if k >= min_layers)
    if most < L:
        why = "memory limits" if min_layers <= 1 else \
            f"memory limits, and --max-depth needs >= {min_layers} layers per node"
        raise InfeasibleError(f"{problem.model} needs {L} layers placed, but the cluster's nodes can "
                              f"hold at most {most} between them ({why})")


def min_layers_for_depth(num_layers: int, max_depth: int | None) -> int:
    """With every node holding >= ceil(L / D) layers and no partial inference, no path exceeds D."""
    return 1 if max_depth is None else math.ceil(num_layers / max_depth)


def check_options(*, time_limit_s: float, threads: int, gap: float,
                  max_depth: int | None = None) -> None:
    """Raise :class:`HelixUserError` quoting the first bad solve option (named as the CLI names it)."""
    if not time_limit_s > 0:  # also NaN
        raise HelixUserError(f"--time-limit must be > 0 seconds, got {time_limit_s}")
    if threads < 0:
        raise HelixUserError(f"--threads must be >= 0 (0 = all cores), got {threads}")
    if not (0 <= gap < math.inf):
        raise HelixUserError(f"--gap must be >= 0 (0.01 = 1 %), got {gap}")
    if max_depth is not None and max_depth < 1:
        raise HelixUserError(f"--max-depth must be >= 1, got {max_depth}")


def solve(problem: PlacementProblem, method: str = "milp", *, solver: str = "highs",
          time_limit_s: float = 60.0, threads: int = 1, seed: int = 0, gap: float = 0.01,
          partial_inference: bool = True, max_depth: int | None = None,
          progress: Progress | None = None, warm_starts: bool = True,
          start: Placement | None = None) -> Plan:
    """Place ``problem``'s layers with ``method``; the result is verified before it is returned.

    ``warm_starts=False`` runs the MILP alone (no heuristic incumbent): for ablations and tests.
    ``start`` is a placement to improve on (``helix plan --from``, a previous plan, the best found
    elsewhere): ``milp`` takes it as a warm start and never returns less; ``milp-paper`` falls back
    on it as on any warm start; heuristic methods, being baselines, ignore it."""
    if method not in METHODS:
        raise HelixUserError(f"unknown method {method!r}; choose one of: {', '.join(METHODS)}")
    check_options(time_limit_s=time_limit_s, threads=threads, gap=gap, max_depth=max_depth)
    adapter = make_solver(solver)
    t0 = time.perf_counter()
    partial = partial_inference and max_depth is None
    if method in HEURISTICS:
        # Heuristics ignore --max-depth, so their bound must hold for every placement.
        if max_depth is not None:
            log.warning("--max-depth is honoured by the MILP methods only; %s ignores it", method)
        check_feasible(problem)
        bounds = proven_bounds(problem)
        cand = _evaluate(problem, HEURISTICS[method](problem, seed), method, partial)
        if not cand.placement:
            raise InfeasibleError(f"the {method} heuristic cannot place {problem.model} on this cluster")
        return _plan(problem, cand, bounds, gap, method, None, t0, partial, {})
    min_k = min_layers_for_depth(problem.num_layers, max_depth)
    check_feasible(problem, min_k)
    bounds = proven_bounds(problem, min_k)
    bound = min(bounds.values())
    extras: dict = {}
    if max_depth is not None:
        # The MILP and the fixed point then range over this restricted set only: a placement
        # outside it (a node with fewer layers, overlapping stages) may serve more.
        extras["bound_scope"] = (f"placements with every node >= {min_k} layers and no partial "
                                 f"inference (--max-depth {max_depth})")
    best = _best_warm_start(problem, seed, partial, min_k, bound / (1 + max(gap, 1e-6)), extras,
                            time_limit_s) if warm_starts else \
        Candidate({}, FlowResult(0.0, {}, {}), "none")
    if start:
        best = _with_start(problem, best, start, partial, min_k)
    if method == "milp-paper":
        placement, paper_bound, status, used = paper_model.run(problem, adapter, _options(
            time_limit_s, threads, seed, gap, progress, t0), partial, min_k)
        extras.update(milp_status=status, solver_used=used)
        if paper_bound is not None:
            bounds["paper_milp"] = paper_bound
        cand = _evaluate(problem, placement, method, partial) if placement else None
        if (cand is None or cand.value <= 0) and best.value > 0:
            log.warning("the paper MILP found no placement in %.1f s; returning the best heuristic (%s)",
                        time_limit_s, best.source)
            cand = best
        if cand is None or cand.value <= 0:
            raise InfeasibleError(f"the paper MILP found no placement of {problem.model} that serves "
                                  f"tokens in {time_limit_s:.0f} s")
        return _plan(problem, cand, bounds, gap, method, adapter.name, t0, partial, extras)
    cand = _run_class_milp(problem, adapter, best, bounds, t0, time_limit_s, threads, seed, gap,
                           partial, min_k, progress, extras)
    return _plan(problem, cand, bounds, gap, method, adapter.name, t0, partial, extras)


def proven_bounds(problem: PlacementProblem, min_layers: int = 1) -> dict[str, float]:
    """The closed-form bounds, each valid for every placement (of nodes holding >= ``min_layers``):
    the fixed point, and the crossing and sharing bounds where every token must change regions."""
    bounds = {"fixed_point": fixed_point_bound(problem, min_layers)}
    for name, bound in (("crossing", crossing_bound), ("sharing", sharing_bound)):
        value = bound(problem, bounds["fixed_point"], min_layers)
        if value is not None:
            bounds[name] = value
    return bounds


def evaluate(problem: PlacementProblem, placement: Placement, partial_inference: bool = True,
             source: str = "given") -> Plan:
    """``placement`` as it is, no search: its verified max flow as a Plan (method ``source``) with
    the closed-form bounds (``helix plan --from``'s running placement, re-planning)."""
    cand = _evaluate(problem, placement, source, partial_inference)
    return _plan(problem, cand, proven_bounds(problem), 0.01, source, None,
                 time.perf_counter(), partial_inference, {})


def _options(time_limit_s, threads, seed, gap, progress, t0, warm=None, stop=None):
    """Solver options ending ``time_limit_s`` after ``t0``."""
    def cb(elapsed, primal, dual):
        if progress is not None:
            progress(time.perf_counter() - t0, primal, dual)
        return stop(primal, dual) if stop else False
    # No minimum: a phase that starts late gets what is left (HiGHS returns at once on 0).
    remaining = max(0.0, time_limit_s - (time.perf_counter() - t0))
    return SolveOptions(time_limit_s=remaining, threads=threads, seed=seed, rel_gap=gap,
                        warm_start=warm, progress=cb)


def _evaluate(problem, placement, source, partial) -> Candidate:
    return Candidate(dict(placement), max_flow(problem, placement, partial), source)


def _best_warm_start(problem, seed, partial, min_k, enough: float = math.inf,
                     extras: dict | None = None, time_limit_s: float = 60.0) -> Candidate:
    """The best of the heuristic and structured placements, in a fixed order; once one serves
    ``enough`` (the gap target against the fixed-point bound is met) the rest are skipped and
    named in ``extras["warm_starts_skipped"]``: at 1,000 nodes they cost minutes and the solve
    stops there anyway. The mixed-stage MILP gets up to 15 % of ``time_limit_s`` (at most 10 s),
    aiming at ``enough`` first and starting above the best so far."""
    best = Candidate({}, FlowResult(0.0, {}, {}), "none")
    starts = {**WARM_STARTS, "sweep": lambda p, s: construct.sweep(p, s, partial),
              "regional": lambda p, s: construct.regional(p, s, partial),
              "stages": lambda p, s: construct.stages(p, s, partial),
              # best.value is read when this runs: the best of the starts before it.
              "mixed-stages": lambda p, s: mixed_stages(
                  p, s, partial, min(10.0, 0.15 * time_limit_s), best.value, enough),
              "region-chain": lambda p, s: region_chain(p, s, partial),
              "aligned-chains": lambda p, s: aligned_chains(
                  p, s, partial, min_layers=min_k,
                  deadline_s=time.perf_counter() + min(10.0, 0.1 * time_limit_s))}
    for name, heuristic in starts.items():
        if best.value >= enough:
            if extras is not None:
                extras.setdefault("warm_starts_skipped", []).append(name)
            continue
        placement = heuristic(problem, seed)
        if any(e - s < min_k for s, e in placement.values()):
            continue
        cand = _evaluate(problem, placement, name, partial)
        if cand.value > best.value:
            best = cand
    return best


def _with_start(problem, best: Candidate, start: Placement, partial, min_k) -> Candidate:
    """The better of ``best`` and the given start (checked: a bad start is a user error)."""
    from planner.layout import check_placement_fits
    check_placement_fits(problem, start, "start placement")
    if any(e - s < min_k for s, e in start.values()):
        log.warning("the start placement has nodes with fewer than %d layers (--max-depth); "
                    "it is not used", min_k)
        return best
    cand = _evaluate(problem, start, "start", partial)
    return cand if cand.value >= best.value else best


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


def _run_class_milp(problem, adapter, best, bounds, t0, time_limit_s, threads, seed, gap, partial,
                    min_k, progress, extras) -> Candidate:
    """Warm starts -> local search (to 30 % of the time) -> class MILP (to 75 %) -> local search.

    Every bound found goes into ``bounds``. A phase whose deadline has passed is skipped: the time
    limit bounds the solver runs and the local searches; only fixed costs (warm starts, building
    the model, verification) can overrun."""
    def bound() -> float:
        return min(bounds.values())

    if best.value > 0 and bound() <= best.value * (1 + max(gap, 1e-6)):
        return best  # a warm start is already proven within the gap

    def report(value: float) -> None:
        if progress is not None:
            progress(time.perf_counter() - t0, value, bound())

    report(best.value)
    best = _cover(problem, adapter, best, bounds, gap, t0 + 0.2 * time_limit_s, time_limit_s,
                  threads, seed, partial, min_k, extras)
    report(best.value)
    if best.value > 0 and bound() <= best.value * (1 + max(gap, 1e-6)):
        return best
    best = _regional_milp(problem, best, partial, min_k, time_limit_s, threads, seed, gap, t0)
    report(best.value)
    best = _polish(problem, best, partial, t0 + 0.3 * time_limit_s, seed, bound() / (1 + gap), min_k)
    report(best.value)
    cand = best
    if time.perf_counter() < t0 + 0.75 * time_limit_s:
        cand, milp_bound = _class_milp(problem, adapter, best, bound(), t0, 0.75 * time_limit_s,
                                       threads, seed, gap, partial, min_k, progress, extras)
        if milp_bound is not None:
            bounds["class_milp"] = milp_bound
    else:  # recorded, not warned: per-region sub-solves of short runs hit this routinely
        extras["milp_skipped"] = (f"no time left after the warm starts "
                                  f"({time.perf_counter() - t0:.1f} s of {time_limit_s:.1f} s)")
    if len(problem.nodes) <= PAPER_MILP_NODES and bound() > cand.value * (1 + max(gap, 1e-6)) \
            and time.perf_counter() < t0 + 0.9 * time_limit_s:
        cand = _exact_milp(problem, adapter, cand, bounds, t0, 0.9 * time_limit_s, threads, seed,
                           gap, partial, min_k, extras)
    report(cand.value)
    # Leave ~5 % of the time for extraction, verification and path statistics.
    cand = _polish(problem, cand, partial, t0 + 0.95 * time_limit_s, seed, bound() / (1 + gap), min_k)
    if cand.value > 0 and bound() > cand.value * (1 + max(gap, 1e-6)):  # time the search left over
        cand = _cover(problem, adapter, cand, bounds, gap, t0 + 0.95 * time_limit_s, time_limit_s,
                      threads, seed, partial, min_k, extras)
    if cand.value <= 0:
        raise InfeasibleError(f"no placement of {problem.model} serves any tokens "
                              "(is a region or the coordinator cut off?)")
    return cand


#: Clusters up to this many nodes also get the paper MILP (exact on every link), warm-started.
PAPER_MILP_NODES = 8


def _exact_milp(problem, adapter, best: Candidate, bounds, t0, time_limit_s, threads, seed, gap,
                partial, min_k, extras) -> Candidate:
    """The paper MILP, exact on every node, link, source and sink arc, warm-started from ``best``
    and capped at the best bound, ending ``time_limit_s`` after ``t0``: on small clusters it finds
    and proves what the relaxed class MILP cannot where links bind. Its dual bound joins
    ``bounds``; its incumbent is measured and kept when better."""
    U = min(bounds.values())
    lp, v = paper_model.build_paper_model(problem, partial, min_k, flow_bound=U)
    opts = _options(time_limit_s, threads, seed, gap, None, t0)
    fixed = paper_model.integer_values(problem, lp, v, best.placement, partial)
    warm = _complete(lp, fixed, opts) if fixed else None

    def stop(primal, dual):
        return min(U, dual) <= max(best.value, primal) * (1 + max(gap, 1e-6))

    res = adapter.solve(lp, _options(time_limit_s, threads, seed, gap, None, t0, warm, stop))
    extras.update(paper_milp_status=res.status, paper_milp_seconds=res.seconds)
    if res.bound is not None:
        bounds["paper_milp"] = res.bound
    if res.values is not None:
        cand = _evaluate(problem, paper_model.extract(problem, v, res.values), "paper-milp", partial)
        if cand.value > best.value:
            return cand
    return best


def _cover(problem, adapter, best: Candidate, bounds, gap, deadline_s, time_limit_s, threads, seed,
           partial, min_k, extras) -> Candidate:
    """Cover bound (``planner.search.cover``) from the incumbent's gap target up; the placements
    that cover a target are measured and kept when they beat the incumbent."""
    if best.value <= 0:
        return best
    target, known = best.value * (1 + max(gap, 1e-6)), min(bounds.values())
    again = "cover_targets" in extras  # a second pass: the gap target was tried already
    if not again:  # the packing LP first: a fraction of a second a target where it decides
        packed = packing_bound(problem, adapter, best.value, known,
                               min(deadline_s, time.perf_counter() + 0.05 * time_limit_s), min_k)
        if packed is not None:
            bounds["packing"] = known = packed
    res = cover_search(problem, adapter, target, known, deadline_s,
                       step_s=max(0.5, 0.05 * time_limit_s), threads=threads, seed=seed,
                       min_layers=min_k, optimal_at=best.value * (1 + 1e-7),
                       first=known - 0.25 * (known - target) if again else None)
    extras.setdefault("cover_targets", []).extend((round(x, 3), verdict) for x, verdict in res.tried)
    if res.bound is not None:
        bounds["cover"] = res.bound
    for placement in res.placements:
        cand = _evaluate(problem, placement, "cover", partial)
        if cand.value > best.value:
            best = cand
    return best


def _class_milp(problem, adapter, best, bound, t0, time_limit_s, threads, seed, gap, partial, min_k,
                progress, extras):
    """The class MILP, warm-started from ``best``, ending ``time_limit_s`` after ``t0``.

    Returns (best candidate, the MILP's proven bound or None). The bound holds for the exact
    problem because the class model relaxes it (see ``planner.milp.class_model``); its own
    status (``milp_status``) speaks of the class model only."""
    model = class_model.build_class_model(problem, partial, min_k, flow_bound=bound)
    exact = class_model_is_exact(problem, bound)
    warm = _complete(model.lp, class_model.hold_values(model, best.placement),
                     _options(time_limit_s, threads, seed, gap, None, t0)) \
        if best.placement else None

    def stop(primal, dual):
        inc = max(best.value, primal if exact and math.isfinite(primal) else 0.0)
        return inc > 0 and min(bound, dual) <= inc * (1 + gap)

    def shown(elapsed, primal, dual):
        # The live line shows real flows and valid bounds: a relaxed model's primal is neither.
        if progress is not None:
            inc = max(best.value, primal if exact and math.isfinite(primal) else 0.0)
            progress(elapsed, inc, min(bound, dual))

    res = adapter.solve(model.lp, _options(time_limit_s, threads, seed, gap, shown, t0, warm, stop))
    extras.update(solver_used=res.solver, warm_start=best.source, warm_start_tokens_per_s=best.value,
                  classes=len(model.classes), class_model_exact=exact, milp_seconds=res.seconds,
                  milp_status=res.status)
    cand = best
    if res.values is not None:
        bad = model.lp.violations(res.values, tol=1e-5)
        if bad:
            raise AssertionError(f"solver returned a solution violating {bad[:3]}")
        mine = _evaluate(problem, class_model.extract(model, res.values), "milp", partial)
        if exact and mine.value < res.objective * (1 - 1e-6) - 1e-6:
            raise AssertionError(f"class model is exact but max flow {mine.value} < "
                                 f"objective {res.objective}")
        if mine.value > cand.value:
            cand = mine
    return cand, res.bound


def _regional_milp(problem, best: Candidate, partial, min_k, time_limit_s, threads, seed, gap,
                   t0) -> Candidate:
    """Multi-region clusters: solve each region on its own (its class model is exact there), union.

    The coordinator reaches every region directly, so regions that can hold the model serve without
    crossing slow links; this is a warm start, the whole cluster is still evaluated exactly."""
    regions = sorted({n.region for n in problem.nodes})
    if len(regions) < 2:
        return best
    placement: dict[str, tuple[int, int]] = {}
    share = 0.2 * time_limit_s / len(regions)
    for r in regions:
        sub = construct.region_problem(problem, r)
        try:
            check_feasible(sub, min_k)
            plan = solve(sub, "milp", time_limit_s=share, threads=threads, seed=seed, gap=gap,
                         partial_inference=partial, max_depth=None if min_k <= 1 else
                         math.ceil(problem.num_layers / min_k))
        except InfeasibleError:
            continue
        placement.update(as_placement(plan.placements))
    cand = _evaluate(problem, placement, "regional-milp", partial)
    return cand if cand.value > best.value else best


def _polish(problem, cand: Candidate, partial, deadline_s, seed, target, min_k) -> Candidate:
    if not cand.placement or cand.value >= target:
        return cand
    placement, flows = local_search.improve(problem, cand.placement, cand.flows, partial, deadline_s,
                                            seed, target, min_k)
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


#: Why each bound holds for the exact problem (every node, link, source and sink arc).
BOUND_NOTES = {
    "fixed_point": "fixed point of the layer work the nodes can do at flow F, capped by their link "
                   "totals and the region cuts (planner.search.bounds)",
    "crossing": "every token must change regions and no single link between regions carries this "
                "much, so two nodes run some layer side by side: the layer coverage that wastes "
                "exceeds the slack the nodes have at this flow (planner.search.crossing)",
    "sharing": "every token must change regions and no single link between regions carries this "
               "much, so some layer has two holders; no mix of nodes holding more layers than "
               "they run at this flow gives that room (planner.search.sharing)",
    "class_milp": "dual bound of the class MILP; it relaxes the network (links summed per class and "
                  "region), so its bound holds, but its optimum is no placement's flow",
    "class_milp_exact": "dual bound of the class MILP, exact here (one region, no link below the "
                        "bound)",
    "cover": "no placement gives every layer nodes worth this many tokens/s (each token runs "
             "each layer on one node; the cover MILP, planner.milp.cover_model, refuted it)",
    "packing": "no placement fills every layer's slots to this many tokens/s, nodes giving k slots "
               "each (the packing LP, planner.search.packing, refuted it)",
    "paper_milp": "dual bound of the paper MILP, which models every node, link, source and sink arc",
}


def exact_status(value: float, bound: float, gap: float) -> str:
    """What a flow and a bound valid for the exact problem prove: ``optimal`` (they meet), ``gap``
    (within the gap target) or ``feasible`` (a placement, no proof)."""
    if bound <= value * (1 + 1e-6):
        return "optimal"
    return "gap" if bound <= value * (1 + gap) else "feasible"


def _plan(problem, cand: Candidate, bounds: dict[str, float], gap: float, method, solver, t0,
          partial, extras) -> Plan:
    """Verify ``cand`` and wrap it in a Plan whose bound is the least of ``bounds`` (each valid for
    the exact problem) and whose status says what they prove."""
    verify(problem, cand.placement, cand.flows, partial)
    stats = path_stats(problem, cand.placement, cand.flows)
    used = set(cand.placement)
    source = min(bounds, key=lambda k: (bounds[k], k))
    bound = bounds[source]
    if bound < cand.value * (1 - 1e-6):
        raise PlannerBug(f"bound {bound} ({source}) is below a found max flow {cand.value}")
    note = BOUND_NOTES["class_milp_exact" if source == "class_milp" and
                       extras.get("class_model_exact") else source]
    extras = {**extras, "status": exact_status(cand.value, bound, gap), "bounds": dict(bounds),
              "bound_source": source, "bound_note": note,
              **{f"bound_{name}": value for name, value in bounds.items()},
              "found_by": cand.source, "depth_max": stats.depth_max,
              "depth_mean": round(stats.depth_mean, 3), "latency_mean_s": stats.latency_mean_s,
              "latency_max_s": stats.latency_max_s,
              "unused_nodes": sorted(n.name for n in problem.nodes if n.name not in used)}
    placements = as_slices(cand.placement, by_layers=True)
    arcs = tuple(ArcFlow(u, v, f) for (u, v), f in sorted(cand.flows.arc_flows.items()))
    return Plan(model=problem.model, num_layers=problem.num_layers, placements=placements,
                arc_flows=arcs, max_flow_tokens_per_s=cand.value,
                upper_bound_tokens_per_s=max(bound, cand.value),
                method=method, solver=extras.get("solver_used", solver), solve_seconds=time.perf_counter() - t0,
                partial_inference=partial, spec_hash=problem.spec_hash, extras=extras)
