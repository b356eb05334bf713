"""Simulator events: plain data, a time and a payload, dispatched by the simulator.

Each event type has one handler on :class:`~helix.sim.engine.Simulator` (``Simulator.handlers``,
by type), which runs the coordinator or worker logic and returns the events it causes; an event
knows nothing of the simulator. The heap key is ``(time_s, seq)`` with ``seq`` the push order
(given by the simulator when it pushes), so simultaneous events run in the order they were caused
and a run is deterministic for a seed. Events carry only references.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from helix.sim.network import SharedLink
    from helix.sim.request import SimRequest
    from helix.sim.worker import SimWorker
    from worker.step_policy import StepPlan

NO_EVENTS: tuple = ()


class Event:
    """Base: something that happens at ``time_s``."""

    __slots__ = ("time_s",)

    def __init__(self, time_s: float) -> None:
        self.time_s = time_s

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
        self.index = index   # the request's position in the workload


class CoordinatorSchedule(Event):
    """The coordinator tries to give waiting requests their pipelines (FIFO, stops at the first
    that fits nowhere)."""

    __slots__ = ()


class TransferFinish(Event):
    """A message arrives at ``dst`` (a worker, or None for the coordinator). ``items`` are
    ``(request id, num_tokens, request, stage index, epoch)``: inputs for that stage, or sampled
    tokens."""

    __slots__ = ("dst", "items")

    def __init__(self, time_s: float, dst: "SimWorker | None",
                 items: list[tuple[int, int, "SimRequest", int, int]]) -> None:
        self.time_s = time_s   # Event.__init__, inlined (one per step or message)
        self.dst = dst
        self.items = items


class LinkWake(Event):
    """A fair-share link may have finished messages; stale (ignored) when the link's ``version``
    changed since."""

    __slots__ = ("link", "version")

    def __init__(self, time_s: float, link: "SharedLink", version: int) -> None:
        super().__init__(time_s)
        self.link = link
        self.version = version

    def subject(self) -> str:
        return "->".join(self.link.key)


class StepStart(Event):
    """An idle worker with new inputs picks its next step (inputs arriving at the same instant
    are batched together because this runs after them)."""

    __slots__ = ("worker",)

    def __init__(self, time_s: float, worker: "SimWorker") -> None:
        self.time_s = time_s   # Event.__init__, inlined (one per step or message)
        self.worker = worker


class StepFinish(Event):
    """A worker's step ends: outputs go downstream and the worker starts its next step. Stale (no
    effect) when the worker went down since it started (``epoch`` changed)."""

    __slots__ = ("worker", "plan", "duration_s", "epoch")

    def __init__(self, time_s: float, worker: "SimWorker", plan: "StepPlan",
                 duration_s: float, epoch: int = 0) -> None:
        self.time_s = time_s   # Event.__init__, inlined (one per step or message)
        self.worker = worker
        self.plan = plan
        self.duration_s = duration_s
        self.epoch = epoch


class NodeDown(Event):
    """A worker's process dies (or its link is cut): it stops stepping and receiving, its KV is lost.
    The coordinator learns of it ``detect_s`` later; ``down_for_s`` later it comes back (None: never)."""

    __slots__ = ("worker", "detect_s", "down_for_s")

    def __init__(self, time_s: float, worker: "SimWorker", detect_s: float,
                 down_for_s: float | None) -> None:
        super().__init__(time_s)
        self.worker = worker
        self.detect_s = detect_s
        self.down_for_s = down_for_s


class NodeDetected(Event):
    """The coordinator declares a down worker dead: no more requests to it, and the requests whose
    pipeline crossed it start again on other pipelines from their prompt and streamed tokens."""

    __slots__ = ("worker", "epoch")

    def __init__(self, time_s: float, worker: "SimWorker", epoch: int) -> None:
        super().__init__(time_s)
        self.worker = worker
        self.epoch = epoch
        """The outage it detects (the worker's epoch when it went down)."""


class NodeUp(Event):
    """A worker that was down answers again, empty (a restarted process): it rejoins routing."""

    __slots__ = ("worker",)

    def __init__(self, time_s: float, worker: "SimWorker") -> None:
        super().__init__(time_s)
        self.worker = worker


class DrainStart(Event):
    """The operator drains a worker: no new requests go to it; its requests finish where they are,
    or (``move``) start again on other pipelines."""

    __slots__ = ("worker", "move")

    def __init__(self, time_s: float, worker: "SimWorker", move: bool = False) -> None:
        super().__init__(time_s)
        self.worker = worker
        self.move = move


class NodeJoins(Event):
    """A worker absent until now joins: it gets requests from now on."""

    __slots__ = ("worker",)

    def __init__(self, time_s: float, worker: "SimWorker") -> None:
        super().__init__(time_s)
        self.worker = worker


class RequestFinish(Event):
    """The last token of a request reached the coordinator: free its KV everywhere."""

    __slots__ = ("request",)

    def __init__(self, time_s: float, request: "SimRequest") -> None:
        self.time_s = time_s   # Event.__init__, inlined (one per step or message)
        self.request = request


class ReplanPoll(Event):
    """The re-plan trigger looks at what it was told (joins, leaves, the completed requests' mix)
    and re-plans when due (:mod:`helix.sim.replan`); a ``recurring`` poll sets the next one
    ``poll_s`` later, one after a join or leave does not."""

    __slots__ = ("recurring",)

    def __init__(self, time_s: float, recurring: bool = True) -> None:
        super().__init__(time_s)
        self.recurring = recurring

    def subject(self) -> str:
        return "coordinator"


class NodeAppears(Event):
    """A node of the spec that holds no layers joins the cluster: the trigger re-plans with it."""

    __slots__ = ("node",)

    def __init__(self, time_s: float, node: str) -> None:
        super().__init__(time_s)
        self.node = node

    def subject(self) -> str:
        return self.node


class LayersLoaded(Event):
    """A node that re-plan ``number`` moved has loaded its new layers (it may serve them at the
    switch, once every moved node has)."""

    __slots__ = ("node", "number")

    def __init__(self, time_s: float, node: str, number: int) -> None:
        super().__init__(time_s)
        self.node = node
        self.number = number

    def subject(self) -> str:
        return self.node
