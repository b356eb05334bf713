"""What the search found, typed: :class:`SearchReport` and the records of its phases.

The search (:mod:`planner.solve`) ends in a :class:`SearchReport`: every bound it proved (by name,
in the order found), which phases ran and what each recorded (:data:`Phase`), and the statistics
of the placement it returns. ``Plan.extras`` keeps it serialized
(:meth:`SearchReport.to_extras`, the keys plan files and ``helix plan --json`` have always had,
in the same order); :meth:`SearchReport.of` reads it back from a plan.

The outer loop's own figures (``planner.predicted``: capacities, routing, candidates scored,
chosen by; ``planner.budget``: the step budget chosen) are read from a plan by
:class:`ChoiceReport`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from helix.core.plan import Plan


@dataclass(frozen=True)
class ClassMilpRun:
    """The class MILP (``planner.milp.class_model``), warm-started."""

    solver_used: str
    warm_start: str
    """The candidate it started from (its source)."""
    warm_start_tokens_per_s: float
    classes: int
    class_model_exact: bool
    """One region and no link below the bound: the class model's optimum is a placement's flow."""
    milp_seconds: float
    milp_status: str
    """Its own status, about the class model only."""


def class_model_exact(phases) -> bool:
    """Whether a class MILP among ``phases`` ran on a model whose optimum is a placement's flow."""
    return any(isinstance(p, ClassMilpRun) and p.class_model_exact for p in phases)


@dataclass(frozen=True)
class MilpSkipped:
    """No time was left for the class MILP after the warm starts."""

    milp_skipped: str


@dataclass(frozen=True)
class PaperMilpRun:
    """The paper MILP run after the class MILP on a small cluster (exact on every link)."""

    paper_milp_status: str
    paper_milp_seconds: float


@dataclass(frozen=True)
class PaperMethodRun:
    """``milp-paper``: the paper's node-level MILP as the method itself."""

    milp_status: str
    solver_used: str


@dataclass(frozen=True)
class CoverRun:
    """One pass of the cover bound: each target tried and what it proved."""

    targets: tuple[tuple[float, str], ...]


#: What one phase of the search recorded.
Phase = ClassMilpRun | MilpSkipped | PaperMilpRun | PaperMethodRun | CoverRun


def _write(phase: Phase, extras: dict[str, Any]) -> None:
    """``phase``'s keys into ``extras`` (cover passes add to one list)."""
    if isinstance(phase, CoverRun):
        extras.setdefault("cover_targets", []).extend(phase.targets)
    else:
        extras.update(dataclasses.asdict(phase))


@dataclass(frozen=True)
class SearchReport:
    """What one search found and proved (serialized in ``Plan.extras``; the method and the
    seconds are the plan's own fields)."""

    method: str
    """The method that ran (``Plan.method``)."""
    seconds: float
    """Wall-clock seconds it took (``Plan.solve_seconds``; for a plan of the outer loop, the
    whole loop's)."""
    status: str
    """``optimal``, ``gap`` (within the gap target) or ``feasible``: what the bound proves about
    the exact problem (``planner.solve.exact_status``)."""
    bounds: tuple[tuple[str, float], ...]
    """Every bound proved, by name, in the order found; each holds for every placement (of
    :attr:`bound_scope` when set)."""
    bound_source: str
    """The name of the least bound."""
    bound_note: str
    """Why that bound holds."""
    found_by: str
    """The method or phase that found the placement."""
    depth_max: int
    depth_mean: float
    latency_mean_s: float
    """Seconds for a token to cross a pipeline (mean over the flow's paths)."""
    latency_max_s: float
    unused_nodes: tuple[str, ...]
    bound_scope: str | None = None
    """The placements the bounds range over, when not all (``max_depth``)."""
    warm_starts_skipped: tuple[str, ...] = ()
    """Warm starts not tried: one before them was already within the gap of the bound."""
    phases: tuple[Phase, ...] = ()
    """What each phase that ran recorded, in order (not read back by :meth:`of`)."""

    @property
    def bound(self) -> float:
        """The least bound (tokens/s)."""
        return dict(self.bounds)[self.bound_source]

    @property
    def solver_used(self) -> str | None:
        """The MILP back end that ran last (None: no MILP ran)."""
        used = [p.solver_used for p in self.phases if isinstance(p, (ClassMilpRun, PaperMethodRun))]
        return used[-1] if used else None

    @property
    def class_model_exact(self) -> bool:
        return class_model_exact(self.phases)

    def to_extras(self) -> dict[str, Any]:
        """The report as ``Plan.extras`` keeps it (keys in the order the search wrote them)."""
        out: dict[str, Any] = {}
        if self.bound_scope is not None:
            out["bound_scope"] = self.bound_scope
        if self.warm_starts_skipped:
            out["warm_starts_skipped"] = list(self.warm_starts_skipped)
        for phase in self.phases:
            _write(phase, out)
        bounds = dict(self.bounds)
        out.update(status=self.status, bounds=bounds, bound_source=self.bound_source,
                   bound_note=self.bound_note, **{f"bound_{k}": v for k, v in bounds.items()},
                   found_by=self.found_by, depth_max=self.depth_max, depth_mean=self.depth_mean,
                   latency_mean_s=self.latency_mean_s, latency_max_s=self.latency_max_s,
                   unused_nodes=list(self.unused_nodes))
        return out

    @classmethod
    def of(cls, plan: Plan) -> SearchReport | None:
        """The report ``plan`` keeps (None: the plan was not made by the search); :attr:`phases`
        are not read back."""
        extras = plan.extras
        if "status" not in extras or "bound_source" not in extras:
            return None
        return cls(method=plan.method, seconds=plan.solve_seconds, status=extras["status"],
                   bounds=tuple(extras.get("bounds", {}).items()),
                   bound_source=extras["bound_source"], bound_note=extras.get("bound_note", ""),
                   found_by=extras.get("found_by", ""), depth_max=extras.get("depth_max", 0),
                   depth_mean=extras.get("depth_mean", 0.0),
                   latency_mean_s=extras.get("latency_mean_s", 0.0),
                   latency_max_s=extras.get("latency_max_s", 0.0),
                   unused_nodes=tuple(extras.get("unused_nodes", ())),
                   bound_scope=extras.get("bound_scope"),
                   warm_starts_skipped=tuple(extras.get("warm_starts_skipped", ())))


@dataclass(frozen=True)
class ChoiceReport:
    """What the outer loop chose and why, read from a plan's ``extras`` (:meth:`of`)."""

    capacities: str = "T(k)"
    """The node capacities the placement was solved with (``T(k)`` or pipeline-aware)."""
    routing: str | None = None
    """The routing users get the most from, when not the solver's own flows."""
    predicted_by_round: tuple[float, ...] = ()
    candidates: tuple[tuple[str, float], ...] = ()
    """Each candidate placement scored: (name, predicted prompt + decode tokens/s)."""
    chosen_by: str | None = None
    """``prediction: NAME`` when a candidate replaced the max-flow placement."""
    max_flow_placement: dict[str, Any] | None = None
    """What that candidate replaced: its max flow, prediction, source and placement."""
    chunk_tokens_chosen: int | None = None
    """The step budget chosen (``chunk_tokens: auto``, ``planner.budget``)."""
    chunk_tokens_predicted: dict[str, float] | None = None
    """Predicted decode tokens/s at each budget tried."""
    max_flow_result: dict[str, Any] | None = None
    """What the search proved about its own placement: max flow, bound, gap, status, found by,
    predicted tokens/s (``planner.predicted.max_flow_result``)."""
    choice: dict[str, Any] | None = None
    """The placement served (``max flow`` or a candidate's name), its predicted tokens/s and why
    (``planner.predicted.choice``)."""

    @classmethod
    def of(cls, plan: Plan) -> ChoiceReport:
        """What ``plan``'s ``extras`` say the outer loop chose (defaults where they are silent)."""
        extras = plan.extras
        return cls(capacities=extras.get("capacities", "T(k)"), routing=extras.get("routing"),
                   predicted_by_round=tuple(extras.get("predicted_by_round", ())),
                   candidates=tuple(tuple(c) for c in extras.get("candidates", ())),
                   chosen_by=extras.get("chosen_by"),
                   max_flow_placement=extras.get("max_flow_placement"),
                   chunk_tokens_chosen=extras.get("chunk_tokens_chosen"),
                   chunk_tokens_predicted=extras.get("chunk_tokens_predicted"),
                   max_flow_result=extras.get("max_flow_result"), choice=extras.get("choice"))
