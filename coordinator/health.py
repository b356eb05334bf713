"""Which workers are alive: each node's state from the coordinator's heartbeats (its stats polls).

Pure bookkeeping over a clock the caller passes (the live coordinator passes ``time.monotonic()``,
a test any numbers):

- ``ok``: the node answered its last poll, within ``suspect_after_s``;
- ``suspect``: its last poll failed, or it has not answered for ``suspect_after_s``: it gets no new
  requests and keeps the ones it holds (a node that answers again continues them, so no request is
  ever served twice);
- ``dead``: no answer for ``dead_after_s``, or ``dead_after_refusals`` polls in a row refused outright
  (nothing listens on its port: the process is gone). Its requests move to other pipelines. A dead
  node stays dead until it answers again.

A node is *down* from the moment it leaves ``ok`` until it is ``ok`` again (:meth:`NodeHealth.down_since`);
the transition back says how long that was (:attr:`Transition.down_s`, the time a restart took).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

from coordinator.stalls import StallConfig


class NodeState(str, enum.Enum):
    OK = "ok"
    SUSPECT = "suspect"
    DEAD = "dead"


@dataclass(frozen=True)
class HealthConfig:
    """When a silent node becomes suspect and then dead (``RuntimeConfig.health``)."""

    suspect_after_s: float = 2.0
    """No answer for this long: no new requests (a frozen or overloaded node)."""
    dead_after_s: float = 10.0
    """No answer for this long: its requests move to other pipelines."""
    dead_after_refusals: int = 2
    """Polls in a row refused outright (connection refused: the process is gone) that make it dead."""
    no_route_grace_s: float = 10.0
    """With no pipeline left, requests wait this long (a restart may be under way), then fail (503)."""
    stall: StallConfig = field(default_factory=StallConfig)
    """When a pipeline whose output stopped sends its nodes no new requests, before any poll
    times out (:mod:`coordinator.stalls`)."""

    def __post_init__(self) -> None:
        if not 0 < self.suspect_after_s <= self.dead_after_s:
            raise ValueError(f"need 0 < suspect_after_s ({self.suspect_after_s}) <= dead_after_s "
                             f"({self.dead_after_s})")
        if self.dead_after_refusals < 1 or self.no_route_grace_s < 0:
            raise ValueError("dead_after_refusals must be >= 1 and no_route_grace_s >= 0")


@dataclass(frozen=True)
class Transition:
    node: str
    old: NodeState
    new: NodeState
    down_s: float | None = None
    """On a transition back to ``ok``: how long the node was down (None otherwise)."""


class NodeHealth:
    """Every node's state; feed it poll outcomes, read transitions from :meth:`update`."""

    def __init__(self, nodes: Iterable[str], config: HealthConfig, now_s: float) -> None:
        self.config = config
        self._state = {n: NodeState.OK for n in nodes}
        self._answered_s = dict.fromkeys(self._state, now_s)
        self._failed = dict.fromkeys(self._state, False)
        self._refusals = dict.fromkeys(self._state, 0)
        self._down_since: dict[str, float] = {}

    def answered(self, node: str, now_s: float) -> None:
        self._answered_s[node] = now_s
        self._failed[node] = False
        self._refusals[node] = 0

    def failed(self, node: str, refused: bool) -> None:
        """A poll of ``node`` failed; ``refused``: nothing listens at its address."""
        self._failed[node] = True
        self._refusals[node] = self._refusals[node] + 1 if refused else 0

    def update(self, now_s: float) -> list[Transition]:
        """Re-derive every state at ``now_s``; the nodes whose state changed."""
        out = []
        for node, old in self._state.items():
            new = self._derive(node, now_s, old)
            if new is not old:
                self._state[node] = new
                out.append(self._went(node, old, new, now_s))
        return out

    def _went(self, node: str, old: NodeState, new: NodeState, now_s: float) -> Transition:
        """Book ``node``'s change of state at ``now_s`` (since when it is down)."""
        if new is NodeState.OK:
            since = self._down_since.pop(node, None)
            return Transition(node, old, new, None if since is None else now_s - since)
        self._down_since.setdefault(node, now_s)
        return Transition(node, old, new)

    def _derive(self, node: str, now_s: float, old: NodeState) -> NodeState:
        silent_s = now_s - self._answered_s[node]
        c = self.config
        if not self._failed[node] and silent_s <= c.suspect_after_s:
            return NodeState.OK
        if old is NodeState.DEAD or silent_s > c.dead_after_s or self._refusals[node] >= c.dead_after_refusals:
            return NodeState.DEAD
        return NodeState.SUSPECT

    def declare_dead(self, node: str, now_s: float) -> Transition | None:
        """Mark ``node`` dead at ``now_s`` (its process was replaced: a new one registered); the
        transition, or None when it already was. It comes back when the new process answers a poll."""
        old = self._state[node]
        if old is NodeState.DEAD:
            return None
        self._state[node] = NodeState.DEAD
        self._failed[node] = True
        return self._went(node, old, NodeState.DEAD, now_s)

    def add(self, node: str, now_s: float) -> None:
        """A node that joined while serving: ``ok``, as if it had just answered."""
        self._state[node] = NodeState.OK
        self._answered_s[node] = now_s
        self._failed[node] = False
        self._refusals[node] = 0
        self._down_since.pop(node, None)

    def remove(self, node: str) -> None:
        """A node that left the plan: no longer tracked."""
        for book in (self._state, self._answered_s, self._failed, self._refusals, self._down_since):
            book.pop(node, None)

    def state(self, node: str) -> NodeState:
        return self._state[node]

    def down_since(self, node: str) -> float | None:
        """Since when ``node`` is not ``ok`` (the clock :meth:`update` was given); None while it is."""
        return self._down_since.get(node)

    def states(self) -> dict[str, NodeState]:
        return dict(self._state)

    def usable(self) -> set[str]:
        """Nodes that may get new requests."""
        return {n for n, s in self._state.items() if s is NodeState.OK}
