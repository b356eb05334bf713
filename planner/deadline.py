"""When a plan must be done: :class:`Deadline`, the user's ``--time-limit`` as a point in time.

:func:`planner.plan` makes one when its caller gives none (``helix plan`` makes it first thing,
so reading the spec counts too) and hands it down: the search (:func:`planner.solve.solve`) gets
a share of what is left, the candidate scoring of :func:`planner.predicted.choose` and the step
budget (:mod:`planner.budget`) stop when it has passed, each keeping the best found so far. Every
phase that starts says so to :attr:`Deadline.on_phase` (``helix plan``'s progress lines).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field

#: on_phase(phase, elapsed_s, left_s): a phase of planning starts (``helix plan``'s progress line).
PhaseProgress = Callable[[str, float, float], None]


@dataclass(frozen=True)
class Deadline:
    """The seconds a plan may take, from :attr:`start_s` (``time.perf_counter``'s clock)."""

    start_s: float
    limit_s: float
    on_phase: PhaseProgress | None = field(default=None, compare=False, repr=False)
    """Told the name of each phase as it starts (None: nobody listens)."""

    @classmethod
    def after(cls, limit_s: float, on_phase: PhaseProgress | None = None) -> Deadline:
        """A deadline ``limit_s`` seconds from now."""
        return cls(time.perf_counter(), limit_s, on_phase)

    @property
    def end_s(self) -> float:
        return self.start_s + self.limit_s

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.start_s

    def left_s(self) -> float:
        """Seconds until the deadline (0 once it has passed)."""
        return max(0.0, self.end_s - time.perf_counter())

    def passed(self) -> bool:
        return time.perf_counter() >= self.end_s

    def allows(self, seconds: float) -> bool:
        """Whether ``seconds`` of work started now ends before the deadline (``seconds`` = 0:
        whether it has not passed)."""
        return time.perf_counter() + seconds < self.end_s

    def share(self, fraction: float) -> Deadline:
        """A deadline ``fraction`` of the seconds left from now (same start, same listener)."""
        return dataclasses.replace(self, limit_s=self.elapsed_s() + fraction * self.left_s())

    def sooner(self, seconds: float) -> Deadline:
        """This deadline ``seconds`` earlier (for a phase that leaves time to the ones after)."""
        return dataclasses.replace(self, limit_s=max(0.0, self.limit_s - seconds))

    def phase(self, name: str) -> None:
        """Say that phase ``name`` starts."""
        if self.on_phase is not None:
            self.on_phase(name, self.elapsed_s(), self.left_s())
