"""How to plan: :class:`PlanOptions`, the one typed object the planner's entries take.

``helix plan``'s flags, ``helix simulate``'s planning, the re-plan trigger and the server all say
what they want as one :class:`PlanOptions`; it is checked once, when made, so a bad option fails
in one line (named as the CLI names it) before anything is solved.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from helix.core.errors import HelixUserError
from helix.core.models import ModelSpec
from planner.flowgraph import Placement
from planner.milp.solvers import SOLVERS
from planner.search.baselines import HEURISTICS

#: What ``method`` accepts: ``milp`` (the class MILP with warm starts and a proven bound, the
#: default), ``milp-paper`` (the paper's node-level MILP) and the heuristics.
METHODS = ("milp", "milp-paper", *HEURISTICS)

#: progress(elapsed_s, incumbent_tokens_per_s, bound_tokens_per_s)
Progress = Callable[[float, float, float], None]

#: Solves of the outer loop at most (the first with T(k), the others with pipeline capacities;
#: :mod:`planner.predicted`). One by default: the pipeline-capacity rounds favour long shared
#: pipelines (30B on single24: one 18-stage pipeline) and cross-region ones, where the prediction
#: is not yet accurate (simulated: 30B single24 +52 %, geo24 +246 %, where round-1 plans are
#: within 15 %), so they would chase the model's errors. ``iterations=3`` runs the fixed point.
ITERATIONS = 1


@dataclass(frozen=True)
class PlanOptions:
    """What to plan with; validated when made (:class:`HelixUserError` quoting the first bad
    option, named as ``helix plan`` names it)."""

    method: str = "milp"
    """One of :data:`METHODS`."""
    solver: str = "highs"
    """The MILP back end, one of :data:`planner.milp.solvers.SOLVERS` (``gurobi`` falls back
    on HiGHS where it cannot run)."""
    time_limit_s: float = 60.0
    """Seconds for the whole search (``--time-limit``); the outer loop shares them out."""
    gap: float = 0.01
    """Stop once the proven gap is within this (0.01 = 1 %)."""
    threads: int = 1
    """Solver threads (the CLI turns its 0, all cores, into the core count)."""
    seed: int = 0
    """Random seed of the solver and the heuristics."""
    max_depth: int | None = None
    """Most nodes a request passes (None: any); trades throughput for latency."""
    partial_inference: bool = True
    """Whether a stage may start inside the previous stage's range."""
    model: ModelSpec | None = field(default=None, hash=False)
    """The model to place (None: the spec's)."""
    start: Placement | None = field(default=None, hash=False)
    """A placement to improve on (``--from``, the running one when re-planning): ``milp`` takes
    it as a warm start and never returns less; heuristics ignore it."""
    progress: Progress | None = field(default=None, compare=False, hash=False, repr=False)
    """Called with (elapsed s, incumbent, bound) while the MILP runs (the CLI's live line)."""
    warm_starts: bool = True
    """False: the MILP alone, no heuristic incumbent (ablations and tests)."""
    iterations: int = ITERATIONS
    """Solves of the outer loop at most (:data:`ITERATIONS`)."""

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise HelixUserError(f"unknown method {self.method!r}; choose one of: "
                                 f"{', '.join(METHODS)}")
        if not self.time_limit_s > 0:  # also NaN
            raise HelixUserError(f"--time-limit must be > 0 seconds, got {self.time_limit_s}")
        if self.threads < 0:
            raise HelixUserError(f"--threads must be >= 0 (0 = all cores), got {self.threads}")
        if not (0 <= self.gap < math.inf):
            raise HelixUserError(f"--gap must be >= 0 (0.01 = 1 %), got {self.gap}")
        if self.max_depth is not None and self.max_depth < 1:
            raise HelixUserError(f"--max-depth must be >= 1, got {self.max_depth}")
        if self.solver not in SOLVERS:
            raise HelixUserError(f"unknown solver {self.solver!r}; choose one of: "
                                 f"{', '.join(SOLVERS)}")

    @property
    def partial(self) -> bool:
        """Partial inference as the search runs it: off under ``max_depth`` (a path's depth is
        bounded by whole stages)."""
        return self.partial_inference and self.max_depth is None

    def min_layers(self, num_layers: int) -> int:
        """Layers every node holds at least: with every node holding >= ceil(L / D) layers and
        no partial inference, no path exceeds ``max_depth`` D."""
        return 1 if self.max_depth is None else math.ceil(num_layers / self.max_depth)

    def replace(self, **changes) -> PlanOptions:
        """These options with ``changes`` (checked again)."""
        return dataclasses.replace(self, **changes)
