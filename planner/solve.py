"""``solve(problem, options) -> Plan``: the search for the placement with the most max flow.

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

This module holds the order (``_milp``), the warm starts and the Plan; the phases after the warm
starts are :mod:`planner.phases`, the objects they share :mod:`planner.search_state`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time

from helix.core.errors import InfeasibleError
from helix.core.plan import ArcFlow, Plan
from helix.core.slices import as_placement, as_slices
from planner.flowgraph import Placement, max_flow
from planner.latency import path_stats
from planner.milp import paper_model
from planner.milp.solvers import make_solver
from planner.options import PlanOptions
from planner.phases import _class_milp, _cover, _exact_milp, _polish
from planner.problem import PlacementProblem
from planner.report import MilpSkipped, PaperMethodRun, SearchReport, class_model_exact
from planner.search import construct
from planner.search.aligned_chains import aligned_chains
from planner.search.baselines import HEURISTICS, WARM_STARTS
from planner.search.bounds import fixed_point_bound, layer_counts
from planner.search.crossing import crossing_bound
from planner.search.mixed_stages import mixed_stages
from planner.search.region_chain import region_chain
from planner.search.sharing import sharing_bound
from planner.search_state import _NONE, Candidate, _Search, _State
from planner.verify import PlannerBug, verify

log = logging.getLogger("helix.planner")


def check_feasible(problem: PlacementProblem, min_layers: int = 1) -> None:
    """Raise :class:`InfeasibleError` with numbers when no placement can hold the model once."""
    L = problem.num_layers
    most = sum(k for n in problem.nodes for k in [max(layer_counts(n, L), default=0)] if k >= min_layers)
    if most < L:
        why = "memory limits" if min_layers <= 1 else \
            f"memory limits, and --max-depth needs >= {min_layers} layers per node"
        raise InfeasibleError(f"{problem.model} needs {L} layers placed, but the cluster's nodes can "
                              f"hold at most {most} between them ({why})")


def solve(problem: PlacementProblem, method: str | PlanOptions = "milp", **options) -> Plan:
    """Place ``problem``'s layers as ``options`` say (a :class:`~planner.options.PlanOptions`, or
    its fields as keywords: ``solve(problem, "milp", time_limit_s=5)``); the result is verified
    before it is returned.

    ``start`` is a placement to improve on (``helix plan --from``, a previous plan, the best found
    elsewhere): ``milp`` takes it as a warm start and never returns less; ``milp-paper`` falls back
    on it as on any warm start; heuristic methods, being baselines, ignore it."""
    if isinstance(method, PlanOptions):
        opts = method.replace(**options) if options else method
    else:
        opts = PlanOptions(method=method, **options)
    run = _Search(problem, opts, make_solver(opts.solver), time.perf_counter())
    if opts.method in HEURISTICS:
        return _heuristic(run)
    check_feasible(problem, run.min_k)
    state = _State(_NONE, tuple(proven_bounds(problem, run.min_k).items()))
    if opts.max_depth is not None:
        # The MILP and the fixed point then range over this restricted set only: a placement
        # outside it (a node with fewer layers, overlapping stages) may serve more.
        state = dataclasses.replace(state, scope=(
            f"placements with every node >= {run.min_k} layers and no partial inference "
            f"(--max-depth {opts.max_depth})"))
    if opts.warm_starts:
        best, skipped = _best_warm_start(run, state.bound / (1 + max(opts.gap, 1e-6)))
        state = dataclasses.replace(state, best=best, skipped=skipped)
    if opts.start:
        state = state.with_best(_with_start(run, state.best))
    if opts.method == "milp-paper":
        return _paper_method(run, state)
    return _plan(run, _milp(run, state), run.adapter.name)


def _heuristic(run: _Search) -> Plan:
    """A baseline heuristic's placement, with the closed-form bounds."""
    o, problem = run.options, run.problem
    # Heuristics ignore --max-depth, so their bound must hold for every placement.
    if o.max_depth is not None:
        log.warning("--max-depth is honoured by the MILP methods only; %s ignores it", o.method)
    check_feasible(problem)
    bounds = tuple(proven_bounds(problem).items())
    cand = run.evaluate(HEURISTICS[o.method](problem, o.seed), o.method)
    if not cand.placement:
        raise InfeasibleError(f"the {o.method} heuristic cannot place {problem.model} on this "
                              "cluster")
    return _plan(run, _State(cand, bounds), None)


def _paper_method(run: _Search, state: _State) -> Plan:
    """``milp-paper``: the paper's node-level MILP as the reference ran it; the best warm start
    when it finds no placement."""
    o, problem = run.options, run.problem
    placement, paper_bound, status, used = paper_model.run(
        problem, run.adapter, run.solver_options(o.time_limit_s, o.progress), run.partial,
        run.min_k)
    state = state.with_phase(PaperMethodRun(status, used))
    if paper_bound is not None:
        state = state.with_bound("paper_milp", paper_bound)
    best = state.best
    cand = run.evaluate(placement, o.method) if placement else None
    if (cand is None or cand.value <= 0) and best.value > 0:
        log.warning("the paper MILP found no placement in %.1f s; returning the best heuristic (%s)",
                    o.time_limit_s, best.source)
        cand = best
    if cand is None or cand.value <= 0:
        raise InfeasibleError(f"the paper MILP found no placement of {problem.model} that serves "
                              f"tokens in {o.time_limit_s:.0f} s")
    return _plan(run, state.with_best(cand), run.adapter.name)


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
    cand = Candidate(dict(placement), max_flow(problem, placement, partial_inference), source)
    bounds = tuple(proven_bounds(problem).items())
    run = _Search(problem, PlanOptions(partial_inference=partial_inference), None,
                  time.perf_counter())
    return _plan(run, _State(cand, bounds), None, method=source)


def _best_warm_start(run: _Search, enough: float = math.inf) -> tuple[Candidate, tuple[str, ...]]:
    """The best of the heuristic and structured placements, in a fixed order, and the ones
    skipped: once one serves ``enough`` (the gap target against the fixed-point bound is met)
    the rest are skipped: at 1,000 nodes they cost minutes and the solve stops there anyway. The
    mixed-stage MILP gets up to 15 % of the time limit (at most 10 s), aiming at ``enough`` first
    and starting above the best so far."""
    problem, partial, min_k, limit_s = run.problem, run.partial, run.min_k, run.options.time_limit_s
    best, skipped = _NONE, []
    starts = {**WARM_STARTS, "sweep": lambda p, s: construct.sweep(p, s, partial),
              "regional": lambda p, s: construct.regional(p, s, partial),
              "stages": lambda p, s: construct.stages(p, s, partial),
              # best.value is read when this runs: the best of the starts before it.
              "mixed-stages": lambda p, s: mixed_stages(
                  p, s, partial, min(10.0, 0.15 * limit_s), best.value, enough),
              "region-chain": lambda p, s: region_chain(p, s, partial),
              "aligned-chains": lambda p, s: aligned_chains(
                  p, s, partial, min_layers=min_k,
                  deadline_s=time.perf_counter() + min(10.0, 0.1 * limit_s))}
    for name, heuristic in starts.items():
        if best.value >= enough:
            skipped.append(name)
            continue
        placement = heuristic(problem, run.options.seed)
        if any(e - s < min_k for s, e in placement.values()):
            continue
        cand = run.evaluate(placement, name)
        if cand.value > best.value:
            best = cand
    return best, tuple(skipped)


def _with_start(run: _Search, best: Candidate) -> Candidate:
    """The better of ``best`` and the given start (checked: a bad start is a user error)."""
    from planner.layout import check_placement_fits
    start, min_k = run.options.start, run.min_k
    check_placement_fits(run.problem, start, "start placement")
    if any(e - s < min_k for s, e in start.values()):
        log.warning("the start placement has nodes with fewer than %d layers (--max-depth); "
                    "it is not used", min_k)
        return best
    cand = run.evaluate(start, "start")
    return cand if cand.value >= best.value else best


def _milp(run: _Search, state: _State) -> _State:
    """Warm starts -> local search (to 30 % of the time) -> class MILP (to 75 %) -> local search.

    Every bound found joins the state's. A phase whose deadline has passed is skipped: the time
    limit bounds the solver runs and the local searches; only fixed costs (warm starts, building
    the model, verification) can overrun."""
    problem, gap, limit_s = run.problem, run.options.gap, run.options.time_limit_s
    if state.within(gap):
        return state   # a warm start is already proven within the gap
    run.report(state)
    state = _cover(run, state, run.at(0.2))
    run.report(state)
    if state.within(gap):
        return state
    state = state.with_best(_regional_milp(run, state.best))
    run.report(state)
    state = state.with_best(_polish(run, state.best, run.at(0.3), state.bound / (1 + gap)))
    run.report(state)
    if time.perf_counter() < run.at(0.75):
        state = _class_milp(run, state)
    else:  # recorded, not warned: per-region sub-solves of short runs hit this routinely
        state = state.with_phase(MilpSkipped(
            f"no time left after the warm starts ({time.perf_counter() - run.t0:.1f} s of "
            f"{limit_s:.1f} s)"))
    if len(problem.nodes) <= PAPER_MILP_NODES and \
            state.bound > state.best.value * (1 + max(gap, 1e-6)) and \
            time.perf_counter() < run.at(0.9):
        state = _exact_milp(run, state)
    run.report(state)
    # Leave ~5 % of the time for extraction, verification and path statistics.
    state = state.with_best(_polish(run, state.best, run.at(0.95), state.bound / (1 + gap)))
    if state.best.value > 0 and state.bound > state.best.value * (1 + max(gap, 1e-6)):
        state = _cover(run, state, run.at(0.95))   # time the search left over
    if state.best.value <= 0:
        raise InfeasibleError(f"no placement of {problem.model} serves any tokens "
                              "(is a region or the coordinator cut off?)")
    return state


#: Clusters up to this many nodes also get the paper MILP (exact on every link), warm-started.
PAPER_MILP_NODES = 8


def _regional_milp(run: _Search, best: Candidate) -> Candidate:
    """Multi-region clusters: solve each region on its own (its class model is exact there), union.

    The coordinator reaches every region directly, so regions that can hold the model serve without
    crossing slow links; this is a warm start, the whole cluster is still evaluated exactly."""
    problem, o, min_k = run.problem, run.options, run.min_k
    regions = sorted({n.region for n in problem.nodes})
    if len(regions) < 2:
        return best
    placement: dict[str, tuple[int, int]] = {}
    each = PlanOptions(time_limit_s=0.2 * o.time_limit_s / len(regions), threads=o.threads,
                       seed=o.seed, gap=o.gap, partial_inference=run.partial,
                       max_depth=None if min_k <= 1 else math.ceil(problem.num_layers / min_k))
    for r in regions:
        sub = construct.region_problem(problem, r)
        try:
            check_feasible(sub, min_k)
            plan = solve(sub, each)
        except InfeasibleError:
            continue
        placement.update(as_placement(plan.placements))
    cand = run.evaluate(placement, "regional-milp")
    return cand if cand.value > best.value else best


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


def _plan(run: _Search, state: _State, solver: str | None, method: str | None = None) -> Plan:
    """Verify the state's best and wrap it in a Plan whose bound is the least of the state's
    (each valid for the exact problem), with the :class:`~planner.report.SearchReport` of what
    the search proved in its ``extras``."""
    problem, cand = run.problem, state.best
    verify(problem, cand.placement, cand.flows, run.partial)
    stats = path_stats(problem, cand.placement, cand.flows)
    used = set(cand.placement)
    bounds = dict(state.bounds)
    source = min(bounds, key=lambda k: (bounds[k], k))
    bound = bounds[source]
    if bound < cand.value * (1 - 1e-6):
        raise PlannerBug(f"bound {bound} ({source}) is below a found max flow {cand.value}")
    exact = class_model_exact(state.phases)
    report = SearchReport(
        method=method or run.options.method, seconds=time.perf_counter() - run.t0,
        status=exact_status(cand.value, bound, run.options.gap), bounds=state.bounds,
        bound_source=source,
        bound_note=BOUND_NOTES["class_milp_exact" if source == "class_milp" and exact else source],
        found_by=cand.source, depth_max=stats.depth_max, depth_mean=round(stats.depth_mean, 3),
        latency_mean_s=stats.latency_mean_s, latency_max_s=stats.latency_max_s,
        unused_nodes=tuple(sorted(n.name for n in problem.nodes if n.name not in used)),
        bound_scope=state.scope, warm_starts_skipped=state.skipped, phases=state.phases)
    placements = as_slices(cand.placement, by_layers=True)
    arcs = tuple(ArcFlow(u, v, f) for (u, v), f in sorted(cand.flows.arc_flows.items()))
    return Plan(model=problem.model, num_layers=problem.num_layers, placements=placements,
                arc_flows=arcs, max_flow_tokens_per_s=cand.value,
                upper_bound_tokens_per_s=max(bound, cand.value),
                method=report.method,
                solver=solver if report.solver_used is None else report.solver_used,
                solve_seconds=report.seconds, partial_inference=run.partial,
                spec_hash=problem.spec_hash, extras=report.to_extras())
