"""What happened to the cluster while serving, with wall-clock times: failures, restarts, lost
nodes, drains, joins and re-plans (the live view's timeline, ``GET /v1/cluster``).

A bounded log kept by :class:`coordinator.runtime.Coordinator` (``Coordinator.events``): whoever
changes the cluster records one line; readers take a copy of the last hour, and ``/metrics``
(``helix:cluster_events_total``) reads how many of each kind were recorded since start. Thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from dataclasses import asdict, dataclass

from helix.core.cluster_frame import EVENTS_KEEP_S as KEEP_S

MAX_EVENTS = 2000
"""At most this many are kept (a flapping node must not grow the log without bound)."""

KINDS = {
    "failure": "failure",          # a node stopped answering (suspect) or was declared dead
    "return": "return",            # a failed node serves again
    "join": "join",                # a node the plan lacks registered to join
    "restart": "restart",          # a new worker process registered for a plan node
    "lost": "lost",                # a dead node whose worker cannot be restarted
    "drain": "drain",
    "undrain": "drain",            # a draining or drained node takes requests again
    "reroute": "replan",           # routing re-solved over the nodes serving (same placement)
    "replan_decided": "replan",    # the re-plan trigger fired and decided (adopt or keep)
    "replan_applied": "replan",    # a new placement was switched to
}
"""What a recorder says happened -> the frame's coarser kind (``cluster_frame.EVENT_KINDS``, what
the live view colours). The log counts each of these since start: the ``kind`` label of
``helix:cluster_events_total``."""


@dataclass(frozen=True)
class ClusterEvent:
    """One change: ``time_s`` in unix seconds, ``kind`` the frame's (``cluster_frame.EVENT_KINDS``),
    ``detail`` a line for people (``cpu-2 is dead (was suspect)``)."""

    time_s: float
    kind: str
    detail: str

    def to_dict(self) -> dict:
        return asdict(self)


class EventLog:
    """The last :data:`KEEP_S` seconds of events (at most :data:`MAX_EVENTS`), oldest first, and
    how many of each of :data:`KINDS` were recorded since start."""

    def __init__(self, clock=time.time) -> None:
        self._clock = clock
        self._events: deque[ClusterEvent] = deque(maxlen=MAX_EVENTS)
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def record(self, kind: str, detail: str) -> None:
        """Log that ``kind`` (one of :data:`KINDS`) happened now; the frame's event gets its
        coarse kind."""
        if kind not in KINDS:
            raise ValueError(f"event kind {kind!r}; known: {', '.join(KINDS)}")
        with self._lock:
            self._events.append(ClusterEvent(self._clock(), KINDS[kind], detail))
            self._counts[kind] += 1

    def counts(self) -> dict[str, int]:
        """How many events of each of :data:`KINDS` were recorded since start (0 for the others);
        not bounded by what the log keeps."""
        with self._lock:
            return {kind: self._counts[kind] for kind in KINDS}

    def recent(self) -> list[ClusterEvent]:
        """The events of the last :data:`KEEP_S` seconds, oldest first."""
        since = self._clock() - KEEP_S
        with self._lock:
            while self._events and self._events[0].time_s < since:
                self._events.popleft()
            return list(self._events)
