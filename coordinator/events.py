"""What happened to the cluster while serving, with wall-clock times: failures, restarts, lost
nodes, drains, joins and re-plans (the live view's timeline, ``GET /v1/cluster``).

A bounded log kept by :class:`coordinator.runtime.Coordinator` (``Coordinator.events``): whoever
changes the cluster records one line; readers take a copy of the last hour. Thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import asdict, dataclass

from helix.core.cluster_frame import EVENT_KINDS, EVENTS_KEEP_S as KEEP_S

MAX_EVENTS = 2000
"""At most this many are kept (a flapping node must not grow the log without bound)."""


@dataclass(frozen=True)
class ClusterEvent:
    """One change: ``time`` in unix seconds, ``kind`` one of :data:`EVENT_KINDS`, ``detail`` a line
    for people (``cpu-2 is dead (was suspect)``)."""

    time: float
    kind: str
    detail: str

    def to_dict(self) -> dict:
        return asdict(self)


class EventLog:
    """The last :data:`KEEP_S` seconds of events (at most :data:`MAX_EVENTS`), oldest first."""

    def __init__(self, clock=time.time) -> None:
        self._clock = clock
        self._events: deque[ClusterEvent] = deque(maxlen=MAX_EVENTS)
        self._lock = threading.Lock()

    def record(self, kind: str, detail: str) -> None:
        if kind not in EVENT_KINDS:
            raise ValueError(f"event kind {kind!r}; known: {', '.join(EVENT_KINDS)}")
        with self._lock:
            self._events.append(ClusterEvent(self._clock(), kind, detail))

    def recent(self) -> list[ClusterEvent]:
        """The events of the last :data:`KEEP_S` seconds, oldest first."""
        since = self._clock() - KEEP_S
        with self._lock:
            while self._events and self._events[0].time < since:
                self._events.popleft()
            return list(self._events)
