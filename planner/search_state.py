"""The search's objects, shared by :mod:`planner.solve` and :mod:`planner.phases`: a candidate
placement with its max flow, the fixed inputs of one search (``_Search``: problem, options,
solver, clock) and what it holds so far (``_State``: the best, every bound, the phases run)."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from planner.flowgraph import FlowResult, Placement, max_flow
from planner.milp.solvers import SolveOptions, SolverAdapter
from planner.options import PlanOptions
from planner.problem import PlacementProblem
from planner.report import Phase


@dataclass(frozen=True)
class Candidate:
    placement: Placement
    flows: FlowResult
    source: str

    @property
    def value(self) -> float:
        return self.flows.value_tokens_per_s


_NONE = Candidate({}, FlowResult(0.0, {}, {}), "none")


@dataclass(frozen=True)
class _Search:
    """One search's fixed inputs: the problem, the options, the solver and the clock."""

    problem: PlacementProblem
    options: PlanOptions
    adapter: SolverAdapter | None
    t0: float

    @property
    def partial(self) -> bool:
        return self.options.partial

    @property
    def min_k(self) -> int:
        return self.options.min_layers(self.problem.num_layers)

    def at(self, fraction: float) -> float:
        """The clock reading ``fraction`` of the time limit after the start."""
        return self.t0 + fraction * self.options.time_limit_s

    def evaluate(self, placement: Placement, source: str) -> Candidate:
        return Candidate(dict(placement), max_flow(self.problem, placement, self.partial), source)

    def solver_options(self, end_s: float, progress=None, warm=None, stop=None) -> SolveOptions:
        """Solver options ending ``end_s`` seconds after the start; ``progress(elapsed, primal,
        dual)`` sees the solver's progress, ``stop(primal, dual)`` ends it early."""
        t0 = self.t0

        def cb(elapsed, primal, dual):
            if progress is not None:
                progress(time.perf_counter() - t0, primal, dual)
            return stop(primal, dual) if stop else False
        # No minimum: a phase that starts late gets what is left (HiGHS returns at once on 0).
        remaining = max(0.0, end_s - (time.perf_counter() - t0))
        o = self.options
        return SolveOptions(time_limit_s=remaining, threads=o.threads, seed=o.seed, rel_gap=o.gap,
                            warm_start=warm, progress=cb)

    def report(self, state: _State) -> None:
        """The incumbent and the bound to the caller's progress line."""
        if self.options.progress is not None:
            self.options.progress(time.perf_counter() - self.t0, state.best.value, state.bound)


@dataclass(frozen=True)
class _State:
    """What the search holds so far: the best candidate, every bound (by name, in the order
    found; each valid for the exact problem) and what each phase recorded."""

    best: Candidate
    bounds: tuple[tuple[str, float], ...]
    phases: tuple[Phase, ...] = ()
    skipped: tuple[str, ...] = ()
    """Warm starts not tried (one before them met the gap target)."""
    scope: str | None = None
    """The placements the bounds range over, when not all."""

    @property
    def bound(self) -> float:
        return min(v for _, v in self.bounds)

    def within(self, gap: float) -> bool:
        """The best is proven within ``gap`` of the bound."""
        return self.best.value > 0 and self.bound <= self.best.value * (1 + max(gap, 1e-6))

    def with_best(self, best: Candidate) -> _State:
        return dataclasses.replace(self, best=best)

    def with_bound(self, name: str, value: float) -> _State:
        """``value`` as the bound ``name`` (in its place when it is there already)."""
        names = [k for k, _ in self.bounds]
        bounds = [(k, value if k == name else v) for k, v in self.bounds]
        if name not in names:
            bounds.append((name, value))
        return dataclasses.replace(self, bounds=tuple(bounds))

    def with_phase(self, phase: Phase) -> _State:
        return dataclasses.replace(self, phases=(*self.phases, phase))
