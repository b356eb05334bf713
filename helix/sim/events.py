"""Simulator events. Each has a time and a handler that returns the events it causes.

The heap key is ``(time_s, seq)`` with ``seq`` the push order, so simultaneous events run in the
order they were caused and a run is deterministic for a seed. Handlers delegate to the
:class:`~helix.sim.engine.Simulator`'s coordinator and worker logic; events carry only references.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from helix.sim.engine import Simulator
    from helix.sim.request import SimRequest
    from helix.sim.worker import SimWorker
    from worker.step_policy import StepPlan

NO_EVENTS: tuple = ()


class Event:
    """Base: something that happens at ``time_s``."""

    __slots__ = ("time_s",)

    def __init__(self, time_s: float) -> None:
        self.time_s = time_s

    def handle(self, sim: "Simulator") -> Iterable["Event"]:
        raise NotImplementedError

    def subject(self) -> str:
        """What the event is about, for event logs (a worker, a request...)."""
        worker = getattr(self, "worker", None) or getattr(self, "dst", None)
        if worker is not None:
            return worker.name
        request = getattr(self, "request", None)
        if request is not None:
            return f"request {request.request_id}"
        index = getattr(self, "index", None)
        return "coordinator" if index is None else f"request {index}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(t={self.time_s:.6f})"


class RequestArrival(Event):
    """A user request reaches the coordinator (online mode); the next arrival is chained."""

    __slots__ = ("index",)

    def __init__(self, time_s: float, index: int) -> None:
        super().__init__(time_s)
        self.index = index

    def handle(self, sim: "Simulator") -> Iterable[Event]:
        return sim.on_arrival(self.time_s, self.index)


class CoordinatorSchedule(Event):
    """The coordinator tries to give waiting requests their pipelines (FIFO, stops at the first
    that fits nowhere)."""

    __slots__ = ()

    def handle(self, sim: "Simulator") -> Iterable[Event]:
        return sim.on_coordinator_schedule(self.time_s)


class TransferFinish(Event):
    """A message arrives at ``dst`` (a worker, or None for the coordinator). ``items`` are
    ``(request, stage index, num_tokens)``: inputs for that stage, or sampled tokens."""

    __slots__ = ("dst", "items")

    def __init__(self, time_s: float, dst: "SimWorker | None",
                 items: list[tuple["SimRequest", int, int]]) -> None:
        super().__init__(time_s)
        self.dst = dst
        self.items = items

    def handle(self, sim: "Simulator") -> Iterable[Event]:
        if self.dst is None:
            return sim.on_tokens_at_coordinator(self.time_s, self.items)
        return sim.on_inputs_at_worker(self.time_s, self.dst, self.items)


class LinkWake(Event):
    """A fair-share link may have finished messages; ignored when the link changed since."""

    __slots__ = ("link", "version")

    def __init__(self, time_s: float, link, version: int) -> None:
        super().__init__(time_s)
        self.link = link
        self.version = version

    def handle(self, sim: "Simulator") -> Iterable[Event]:
        if self.link.version != self.version:
            return NO_EVENTS
        return sim.on_link_wake(self.time_s, self.link)

    def subject(self) -> str:
        return "->".join(self.link.key)


class StepStart(Event):
    """An idle worker with new inputs picks its next step (inputs arriving at the same instant
    are batched together because this runs after them)."""

    __slots__ = ("worker",)

    def __init__(self, time_s: float, worker: "SimWorker") -> None:
        super().__init__(time_s)
        self.worker = worker

    def handle(self, sim: "Simulator") -> Iterable[Event]:
        self.worker.start_pending = False
        return sim.start_step(self.time_s, self.worker)


class StepFinish(Event):
    """A worker's step ends: outputs go downstream and the worker starts its next step."""

    __slots__ = ("worker", "plan", "duration_s")

    def __init__(self, time_s: float, worker: "SimWorker", plan: "StepPlan",
                 duration_s: float) -> None:
        super().__init__(time_s)
        self.worker = worker
        self.plan = plan
        self.duration_s = duration_s

    def handle(self, sim: "Simulator") -> Iterable[Event]:
        return sim.on_step_finish(self.time_s, self.worker, self.plan, self.duration_s)


class RequestFinish(Event):
    """The last token of a request reached the coordinator: free its KV everywhere."""

    __slots__ = ("request",)

    def __init__(self, time_s: float, request: "SimRequest") -> None:
        super().__init__(time_s)
        self.request = request

    def handle(self, sim: "Simulator") -> Iterable[Event]:
        return sim.on_request_finish(self.time_s, self.request)
