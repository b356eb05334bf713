"""Cover bound: bisect on the target X of the cover MILP (``planner.milp.cover_model``).

A target no placement covers is a proven upper bound on every placement's max flow; a target some
placement covers leaves that placement as a candidate (its exact max flow is measured by the
caller). The first target is the one that would prove the incumbent within the gap; when the solver cannot
decide it in its step, the next is a quarter of the way down from the known bound (targets near
the bound are refuted fastest), and each refuted one brings the next a quarter closer to the gap
target; an undecided one moves up, a covered one moves the search up.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from planner.flowgraph import Placement
from planner.milp import cover_model
from planner.milp.solvers import SolveOptions, SolverAdapter
from planner.problem import PlacementProblem


@dataclass
class CoverResult:
    bound: float | None = None
    """The least target proven uncoverable (a valid upper bound), or None."""
    placements: list[Placement] = field(default_factory=list)
    """Placements that covered a target (candidates, not yet measured)."""
    tried: list[tuple[float, str]] = field(default_factory=list)
    """(target, 'refuted' | 'covered' | 'unknown') in order."""


def cover_search(problem: PlacementProblem, adapter: SolverAdapter, target: float, known: float,
                 deadline_s: float, *, step_s: float, threads: int = 1, seed: int = 0,
                 min_layers: int = 1, optimal_at: float | None = None,
                 first: float | None = None) -> CoverResult:
    """Bisect between ``target`` (the first X tried) and ``known`` (a proven bound) until
    ``time.perf_counter() >= deadline_s`` or the target is refuted; then ``optimal_at`` (the
    incumbent's flow, a hair above) is tried once. ``first``: the first X instead of ``target``
    (a second pass starts where targets are refuted fastest)."""
    out = CoverResult()
    lo, hi, x = target, known, target if first is None else first
    while time.perf_counter() < deadline_s - 0.05 and x < hi * (1 - 1e-4):
        verdict, placement = _try(problem, adapter, x, min(step_s, deadline_s - time.perf_counter()),
                                  threads, seed, min_layers)
        out.tried.append((x, verdict))
        if verdict == "refuted":
            hi = out.bound = x
            if x <= target:  # the gap target is proven; one short try at proving optimality
                if optimal_at is not None and optimal_at < x:
                    verdict, _ = _try(problem, adapter, optimal_at, min(
                        step_s, deadline_s - time.perf_counter()), threads, seed, min_layers)
                    out.tried.append((optimal_at, verdict))
                    if verdict == "refuted":
                        out.bound = optimal_at
                break
            x = max(lo, hi - 0.25 * (hi - lo))
        elif verdict == "covered":
            out.placements.append(placement)
            lo = x
            x = (x + hi) / 2
        else:  # undecided: targets near the bound are refuted fastest, so go there, a quarter off
            x = hi - 0.25 * (hi - x) if x <= lo else (x + hi) / 2
    return out


def _try(problem, adapter, x, seconds, threads, seed, min_layers):
    model = cover_model.build_cover_model(problem, x, min_layers)
    if model.refuted:
        return "refuted", None
    res = adapter.solve(model.lp, SolveOptions(time_limit_s=max(0.0, seconds), threads=threads,
                                               seed=seed, rel_gap=1.0))
    if res.status == "infeasible":
        return "refuted", None
    if res.values is not None:
        return "covered", cover_model.extract(model, res.values)
    return "unknown", None
