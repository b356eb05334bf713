"""How many new requests may wait for a pipeline: as many as the capacity still serving completes
in the time a worker restart takes.

When a node dies its running requests move (they were admitted: they go ahead of everyone and
never count against the bound), and new requests find less capacity. A fixed queue of 64 filled at
once on the demo cluster at 22.5 req/s when its biggest node died, and 76 requests were refused
within seconds although the node was back 7 s later. So the bound is a *wait*:

    limit = max(floor, rate_now x wait_s)

- ``wait_s``: the configured longest wait, else half again the time a restart takes (measured:
  each node that comes back says how long it was down, :attr:`coordinator.health.Transition.down_s`,
  averaged; seeded with ``restart_s``) -- the restart, and the backlog it leaves to clear;
- ``rate_now``: requests completed per second per unit of serving capacity over the last
  ``window_s``, times the fraction of the plan's capacity serving now
  (:class:`coordinator.capacity.Capacity`). It is measured at the offered load, so it errs low
  (fewer wait, more are refused) when the cluster was not full;
- ``floor``: at least this many may wait (start-up, a quiet server: nothing measured yet).

The rate is an estimate, and the machine may slow down under it: so a new request is also refused
once the oldest new request waiting has waited longer than ``wait_s`` (:meth:`WaitingBound.overdue`:
the queue is not draining within its bound, whatever the estimate says).

A request past the limit is refused (HTTP 503) with ``Retry-After`` the time the queue needs at
``rate_now`` to come back under its limit (at least 1 s, at most ``wait_s``). A configured fixed
limit replaces all this (``RuntimeConfig.max_waiting_requests``; ``Retry-After`` is then the
configured ``retry_after_s``).

Pure bookkeeping over a clock the caller passes.
"""

from __future__ import annotations

import math
from collections import deque

#: Weight of the newest restart time in the running mean (older ones fade geometrically).
RESTART_WEIGHT = 0.5


class WaitingBound:
    """The waiting queue's limit for new requests, from the serving rate and the restart time."""

    def __init__(self, fixed: int | None = None, floor: int = 64, wait_s: float | None = None,
                 restart_s: float = 10.0, window_s: float = 30.0, default_retry_s: int = 1) -> None:
        """``fixed``: a constant limit (the rest is then unused); ``wait_s``: the longest wait
        (None: 1.5 x the mean restart time, seeded with ``restart_s``)."""
        self.fixed, self.floor, self.window_s = fixed, floor, window_s
        self._wait_s, self.restart_s = wait_s, restart_s
        self.default_retry_s = default_retry_s
        self._done: deque[float] = deque()                # completion times
        self._serving: deque[tuple[float, float]] = deque()  # (time, capacity fraction from then)

    @property
    def wait_s(self) -> float:
        """The longest a new request should expect to wait for a pipeline."""
        return self._wait_s if self._wait_s is not None else 1.5 * self.restart_s

    def restarted(self, down_s: float) -> None:
        """A node came back after ``down_s`` seconds down."""
        self.restart_s += RESTART_WEIGHT * (down_s - self.restart_s)

    def completed(self, now_s: float) -> None:
        self._done.append(now_s)
        self._trim(now_s)

    def serving(self, now_s: float, fraction: float) -> None:
        """From ``now_s`` on, ``fraction`` of the plan's capacity serves."""
        if not self._serving or self._serving[-1][1] != fraction:
            self._serving.append((now_s, fraction))
        self._trim(now_s)

    def _trim(self, now_s: float) -> None:
        start = now_s - self.window_s
        while self._done and self._done[0] < start:
            self._done.popleft()
        # Keep the last sample that began before the window: it covers the window's start.
        while len(self._serving) > 1 and self._serving[1][0] <= start:
            self._serving.popleft()

    def _capacity_seconds(self, now_s: float) -> float:
        """The integral of the serving fraction over the window (seconds at full capacity)."""
        start, total = now_s - self.window_s, 0.0
        samples = list(self._serving)
        for k, (t, f) in enumerate(samples):
            end = samples[k + 1][0] if k + 1 < len(samples) else now_s
            total += f * max(0.0, end - max(t, start))
        return total

    def rate_per_s(self, now_s: float, fraction: float) -> float | None:
        """Requests per second the capacity serving now completes (None: not measured yet)."""
        self._trim(now_s)
        seconds = self._capacity_seconds(now_s)
        if not self._done or seconds < 1.0:
            return None
        return len(self._done) / seconds * fraction

    def limit(self, now_s: float, fraction: float) -> int:
        """How many new requests may wait now."""
        if self.fixed is not None:
            return self.fixed
        rate = self.rate_per_s(now_s, fraction)
        return max(self.floor, math.ceil(rate * self.wait_s) if rate else 0)

    def overdue(self, oldest_wait_s: float) -> bool:
        """Whether a queue whose oldest new request has waited ``oldest_wait_s`` is past its bound
        (never with a fixed limit)."""
        return self.fixed is None and oldest_wait_s > self.wait_s

    def retry_after_s(self, now_s: float, fraction: float, waiting: int) -> int:
        """Seconds a refused client should wait: until ``waiting`` is back under the limit."""
        rate = None if self.fixed is not None else self.rate_per_s(now_s, fraction)
        if not rate:
            return self.default_retry_s
        excess = waiting - self.limit(now_s, fraction) + 1
        return int(min(max(1, math.ceil(self.wait_s)), max(1, math.ceil(excess / rate))))


class QueueFull(Exception):
    """Every pipeline is masked and the waiting queue is full."""

    def __init__(self, retry_after_s: int, detail: str = "") -> None:
        super().__init__(f"server busy: the request queue is full{f' ({detail})' if detail else ''}; "
                         f"retry after {retry_after_s} s")
        self.retry_after_s = retry_after_s
