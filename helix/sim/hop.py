"""The coordinator hop: what a token costs on its way to the caller, and the CPU it takes from
workers that share their cores with the coordinator (measured figures, off unless the spec has them).

On a GPU cluster the coordinator has a machine of its own: a token costs it microseconds and the
simulator charges nothing (the spec's ``coordinator`` section gives no figures). When the
coordinator shares one machine's cores with pinned CPU workers (``cluster_specs/local2.yaml`` under
``scripts/bench_live.py``) it is not free, and two things follow, each from a measured figure of
:class:`helix.core.spec.CoordinatorSpec`:

- ``token_cpu``: every token the last stage samples passes the coordinator (one Python process:
  ZeroMQ receive, detokenize, stream it to the caller), a FIFO server with that service time per
  token; the caller sees the token when it leaves the server. The next step's input does not wait
  for it (a live last stage feeds the first stage, or itself, directly).
- ``request_cpu``: a request passes the same server once when it arrives (HTTP, checks, the
  reply's stream set up) and is scheduled only when it leaves it.
- ``shared_cpu``: CPU time per token that the coordinator and any other process on the machine
  (a load generator) spend on the workers' cores. A pinned worker whose core it takes loses that
  time: the share of each token is split equally among the workers busy when the token arrives and
  added to their next steps. A core whose worker is idle gives it for free (the OS runs the
  coordinator there), so nobody pays.
"""

from __future__ import annotations

from collections.abc import Iterable

from helix.core.spec import CoordinatorSpec
from helix.sim.worker import SimWorker


class CoordinatorHop:
    """The coordinator's FIFO token server and the CPU time it owes the workers."""

    __slots__ = ("token_s", "shared_s", "request_s", "free_s", "owed_s", "_ready_s")

    def __init__(self, token_s: float = 0.0, shared_s: float = 0.0, request_s: float = 0.0) -> None:
        """``token_s``: service time per token; ``shared_s``: CPU per token taken from the workers;
        ``request_s``: service time per request."""
        self.token_s = token_s
        self.shared_s = shared_s
        self.request_s = request_s
        self.free_s = 0.0
        """When the server finishes the tokens and requests it holds."""
        self.owed_s: dict[str, float] = {}
        """Worker name -> seconds its next step is lengthened by (CPU the others took)."""
        self._ready_s: dict[int, float] = {}   # request id -> when the server is done with it

    @classmethod
    def of(cls, coordinator: CoordinatorSpec) -> "CoordinatorHop | None":
        """The hop the spec's measured figures describe; None when it gives none (free)."""
        figures = (coordinator.token_cpu_s or 0.0, coordinator.shared_cpu_s or 0.0,
                   coordinator.request_cpu_s or 0.0)
        return cls(*figures) if any(f > 0 for f in figures) else None

    def arrive(self, request_id: int, now_s: float) -> None:
        """A request arrives at ``now_s``: it queues for ``request_s`` of service."""
        if self.request_s > 0:
            self.free_s = max(now_s, self.free_s) + self.request_s
            self._ready_s[request_id] = self.free_s

    def ready_s(self, request_id: int, now_s: float) -> float | None:
        """When the coordinator is done with the request, if that is after ``now_s``; else None
        (it may be scheduled now)."""
        ready = self._ready_s.get(request_id)
        if ready is None or ready <= now_s:
            self._ready_s.pop(request_id, None)
            return None
        return ready

    def deliver(self, now_s: float, workers: Iterable[SimWorker]) -> float:
        """A token arrives at ``now_s``: when its caller sees it. Its CPU is taken from ``workers``
        that are busy now (their next step pays it)."""
        done_s = max(now_s, self.free_s) + self.token_s
        self.free_s = done_s
        if self.shared_s > 0:
            busy = [w.name for w in workers if w.busy]
            for name in busy:
                self.owed_s[name] = self.owed_s.get(name, 0.0) + self.shared_s / len(busy)
        return done_s

    def charge(self, worker: SimWorker) -> float:
        """Seconds to add to the step ``worker`` starts now (what it is owed is then paid)."""
        return self.owed_s.pop(worker.name, 0.0)
