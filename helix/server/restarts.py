"""Workers come back as long as their machine does: restarts paced by a back-off, not capped by a
count (as Kubernetes' CrashLoopBackOff), and a worker that cannot be restarted said out loud.

Ray restarted a dead actor ``max_restarts`` (3) times and then left it dead without a word. Here the
launcher starts actors that Ray never restarts, and :class:`Supervisor` watches them
(:meth:`~helix.server.launcher.RayLauncher.check`, a non-blocking call per worker every
``interval_s``):

- a worker whose process died is started again (a new actor; it registers with the coordinator and
  the node rejoins) after a back-off: at once when it had served for ``stable_after_s``, else
  ``backoff_initial_s`` doubling to ``backoff_max_s`` with every quick death in a row;
- a node is *lost* when its worker cannot be restarted: no new actor came up within
  ``lost_after_s`` (no live Ray node offers its ``helix_node:`` resource: the machine is gone; or
  it never finishes starting), or ``lost_after_failures`` starts in a row died before coming up.
  The log says so, and ``on_lost(node, reason)`` tells the rest of the server (the coordinator
  reports it in ``/health``, ``/metrics`` and ``helix nodes``; the re-plan trigger counts it as
  gone). Restarts go on at the longest back-off; a pending actor waits for its machine, so the
  node comes back as soon as one offers its resource again (``on_back(node)``).

:class:`NodeRestarts` is the pure policy (a clock passed in); :class:`Supervisor` drives it.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("helix.launcher")


class WorkerProbe(str, enum.Enum):
    """What :meth:`~helix.server.launcher.RayLauncher.check` found of one worker."""

    UP = "up"
    """It answered a call."""
    STARTING = "starting"
    """Its actor is not up yet (being created, or waiting for a Ray node that offers its resource)."""
    SILENT = "silent"
    """It was up and its last call is unanswered (busy or frozen): nothing to do here."""
    DEAD = "dead"
    """Its process is gone."""


@dataclass(frozen=True)
class RestartPolicy:
    """How workers whose process died are started again (``LaunchConfig.restarts``)."""

    backoff_initial_s: float = 1.0
    """Wait before restarting a worker that died soon after it came up (doubles each time)."""
    backoff_max_s: float = 60.0
    """The longest wait between two restarts."""
    stable_after_s: float = 60.0
    """A worker that served this long before dying is restarted at once (its back-off resets)."""
    lost_after_s: float = 60.0
    """A restart that has not come up after this long makes the node lost."""
    lost_after_failures: int = 3
    """Restarts in a row that died before coming up make the node lost."""
    interval_s: float = 0.5
    """How often every worker is checked."""

    def __post_init__(self) -> None:
        if not 0 <= self.backoff_initial_s <= self.backoff_max_s:
            raise ValueError(f"need 0 <= backoff_initial_s ({self.backoff_initial_s}) <= "
                             f"backoff_max_s ({self.backoff_max_s})")
        if min(self.stable_after_s, self.lost_after_s, self.interval_s) <= 0 or \
                self.lost_after_failures < 1:
            raise ValueError("stable_after_s, lost_after_s and interval_s must be > 0 and "
                             "lost_after_failures >= 1")


class NodeRestarts:
    """One node's restart book: up, waiting out a back-off, or starting (pure; times passed in)."""

    def __init__(self, policy: RestartPolicy, now_s: float, up: bool = True) -> None:
        """``up``: its worker is up now (else: starting since ``now_s``)."""
        self.policy = policy
        self.phase = "up" if up else "starting"
        self.since_s = now_s
        """When the current phase began."""
        self.delay_s = 0.0
        """The last back-off."""
        self.due_s: float | None = None
        """When to start it again (while waiting)."""
        self.restarts = 0
        """New workers started for it."""
        self.failures = 0
        """Starts in a row that died before coming up."""
        self.last_error = ""
        self.lost: str | None = None
        """Why it cannot be restarted (None: it can, or it is up)."""

    def died(self, now_s: float, error: str = "") -> float:
        """Its worker died at ``now_s``; the back-off before the next start (``due_s``)."""
        p = self.policy
        if self.phase == "up" and now_s - self.since_s >= p.stable_after_s:
            self.delay_s = 0.0
        else:
            if self.phase != "up":
                self.failures += 1
            self.delay_s = min(p.backoff_max_s, max(p.backoff_initial_s, 2 * self.delay_s))
        self.phase, self.since_s, self.last_error = "waiting", now_s, error
        self.due_s = now_s + self.delay_s
        return self.delay_s

    def due(self, now_s: float) -> bool:
        """Whether a new worker should be started now."""
        return self.phase == "waiting" and now_s >= self.due_s

    def started(self, now_s: float) -> None:
        """A new worker was started at ``now_s``."""
        self.phase, self.since_s, self.due_s = "starting", now_s, None
        self.restarts += 1

    def came_up(self, now_s: float) -> bool:
        """Its worker answered; True when it was lost until now."""
        was_lost = self.lost is not None
        if self.phase != "up":
            self.phase, self.since_s = "up", now_s
        self.failures, self.lost = 0, None
        return was_lost

    def check_lost(self, now_s: float, offered: bool) -> str | None:
        """Why the node is lost now, when it just became so (None otherwise). ``offered``: some
        live Ray node offers its resource."""
        if self.lost is not None or self.phase == "up":
            return None
        p = self.policy
        if self.failures >= p.lost_after_failures:
            self.lost = (f"its worker failed to start {self.failures} times in a row"
                         + (f" ({self.last_error})" if self.last_error else ""))
        elif self.phase == "starting" and now_s - self.since_s >= p.lost_after_s:
            self.lost = (f"its worker has not come up within {p.lost_after_s:g} s" if offered else
                         "no live Ray node offers its resource (its machine is gone)")
        return self.lost


class Supervisor:
    """Restarts the launcher's dead workers and reports lost nodes, in a thread (see the module)."""

    def __init__(self, launcher, policy: RestartPolicy,
                 on_lost: Callable[[str, str], None] | None = None,
                 on_back: Callable[[str], None] | None = None) -> None:
        """``launcher``: a :class:`~helix.server.launcher.RayLauncher` whose workers are up."""
        self.launcher, self.policy = launcher, policy
        self.on_lost, self.on_back = on_lost, on_back
        now = time.monotonic()
        self.books: dict[str, NodeRestarts] = {n: NodeRestarts(policy, now)
                                               for n in launcher.supervised()}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="helix-restarts", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.policy.interval_s):
            try:
                self.check(time.monotonic())
            except Exception:   # Ray away for a moment: the next round tries again
                log.exception("checking the workers failed")

    def check(self, now_s: float) -> None:
        """One round over every worker: restart the dead when their back-off is over, report the
        nodes that became lost or came back."""
        offered = None
        for node in self.launcher.supervised():
            book = self.books.get(node)
            if book is None:   # started since (a node that joined): not up yet
                book = self.books[node] = NodeRestarts(self.policy, now_s, up=False)
            if book.phase != "waiting":
                probe, error = self.launcher.check(node)
                if probe is WorkerProbe.UP and book.came_up(now_s):
                    log.warning("node %s is back: its worker is up (restart %d)", node, book.restarts)
                    self._tell(self.on_back, node)
                elif probe is WorkerProbe.DEAD:
                    delay = book.died(now_s, error)
                    log.warning("worker of node %s died (%s); starting it again in %.1f s", node,
                                error or "no reason given", delay)
            if book.due(now_s):
                self.launcher.respawn(node)
                book.started(now_s)
                log.warning("worker of node %s started again (restart %d)", node, book.restarts)
            if book.phase != "up" and book.lost is None:
                if offered is None:
                    offered = self.launcher.offered()
                reason = book.check_lost(now_s, node in offered)
                if reason is not None:
                    log.error("node %s is lost: %s; it rejoins as soon as a worker of it comes "
                              "up", node, reason)
                    self._tell(self.on_lost, node, reason)

    @staticmethod
    def _tell(hook, *args) -> None:
        if hook is None:
            return
        try:
            hook(*args)
        except Exception:   # a hook that fails must not stop the restarts
            log.exception("restart hook %s failed", getattr(hook, "__name__", hook))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)
