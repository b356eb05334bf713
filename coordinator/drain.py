"""Draining a node: out of routing at once, its requests finish where they are (or move),
and it reports when it is empty and may be stopped; ``undrain`` puts it back.

A mixin of :class:`coordinator.runtime.Coordinator` (its state is read and written under the
coordinator's lock). A node drains when an operator asks (``helix drain``, the admin HTTP route,
gRPC ``Drain``: :meth:`Draining.drain`) or when its worker says so itself (its ``Drain`` control
call sets ``WorkerStats.draining``). Either way it reads full to the KV estimator, so the scheduler
gives it no new request, and the max flow is re-solved without it (as for a dead node,
:meth:`~coordinator.membership.Membership._reflow`), so IWRR weighs the nodes that stay. Its
requests finish where they run, or, with ``move``, start again on other pipelines from their prompt
and streamed tokens, as a dead node's do.

A node's state (:meth:`Draining.node_states`): ``draining`` while requests remain on it (the
coordinator's requests whose pipeline crosses it, and what its worker last reported holding),
``drained`` once both are zero. Draining the last node that keeps some layer served (no pipeline
of the nodes still taking requests would be left) is refused unless forced.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections import Counter
from dataclasses import asdict, dataclass

from coordinator.health import NodeState
from helix.core.errors import HelixUserError
from helix.net.control import ControlError

log = logging.getLogger("helix.coordinator")


class UnknownNode(HelixUserError):
    """A node name the plan does not have (HTTP 404, gRPC NOT_FOUND)."""


class DrainRefused(HelixUserError):
    """Draining would leave some layer unserved (HTTP 409, gRPC FAILED_PRECONDITION)."""


@dataclass(frozen=True)
class NodeStatus:
    """One node as ``GET /admin/nodes`` and ``helix drain --wait`` report it."""

    node: str
    state: str
    """``ok``, ``suspect``, ``dead`` (health), ``lost`` (dead, and its worker cannot be restarted),
    ``draining`` (no new requests; some left) or ``drained`` (empty: it may be stopped)."""
    start: int
    end: int
    """The node's layers ``[start, end)`` in the plan."""
    requests: int
    """Requests whose pipeline crosses the node (the coordinator's count)."""
    worker_requests: int | None
    """Requests the node's worker held at its last stats poll; None while it does not answer
    (suspect, dead, lost: that count is stale)."""
    kv_blocks_used: int
    draining_for_s: float | None
    """Seconds since the node was drained (None: it takes requests)."""
    down_for_s: float | None = None
    """Seconds since the node stopped answering (None: it answers)."""
    restarts: int = 0
    """Times a new process registered for it while serving."""
    reason: str | None = None
    """Why it is lost (None otherwise)."""

    def to_dict(self) -> dict:
        return asdict(self)


def _ranges(layers: list[int]) -> str:
    """``[0, 2), [5, 6)`` for layers 0, 1, 5."""
    out, start = [], None
    for i, layer in enumerate(layers):
        if start is None:
            start = layer
        if i + 1 == len(layers) or layers[i + 1] != layer + 1:
            out.append(f"[{start}, {layer + 1})")
            start = None
    return ", ".join(out)


class DrainBook:
    """The operator's word on draining (``Coordinator.drains``), in the coordinator's monotonic clock."""

    def __init__(self) -> None:
        self.since_s: dict[str, float] = {}
        """Nodes drained through :meth:`Draining.drain`, and since when."""
        self.undrained_s: dict[str, float] = {}
        """When each node was last undrained: a stats reply polled before that still says draining."""

    def __contains__(self, node: str) -> bool:
        return node in self.since_s


class Draining:
    """Drain and undrain for :class:`~coordinator.runtime.Coordinator` (see the module)."""

    def _check_node(self, node: str) -> None:
        if node not in self.workers:
            raise UnknownNode(f"no node {node!r} in the plan; nodes: {', '.join(sorted(self.workers))}")

    def draining_nodes(self) -> set[str]:
        """Nodes that take no new requests because they drain (asked here, or by their worker)."""
        return set(self.drains.since_s) | {n for n, s in self.stats.items() if s.draining}

    def _fresh(self, reply, polled_s: float):
        """A stats ``reply`` whose poll began at ``polled_s``, without the draining flag the worker
        had before it was undrained since (under the lock)."""
        if reply.draining and self.drains.undrained_s.get(reply.node, -math.inf) >= polled_s:
            return dataclasses.replace(reply, draining=False)
        return reply

    def drain(self, node: str, force: bool = False, move: bool = False) -> NodeStatus:
        """Take ``node`` out of routing now; its requests finish where they are, or, with ``move``,
        start again on other pipelines. Raises :class:`UnknownNode`, or :class:`DrainRefused` when
        no pipeline of the nodes still taking requests would be left (``force`` drains anyway:
        new requests then wait, and fail after the no-route grace)."""
        self._check_node(node)
        with self._lock:
            if node not in self.draining_nodes() and not force:
                self._check_leaves_a_pipeline(node)
            self.drains.since_s.setdefault(node, time.monotonic())
            kv = self.scheduler.kv
            kv.observe(node, 2 * kv.capacity(node))   # reads full: no new request goes there
            self._reflow()
            moved = 0
            if move:
                for req in [r for r in self._live.values()
                            if not r.done and r.pipeline is not None and node in r.pipeline.nodes]:
                    self._move(req, None)
                    moved += 1
                self._admit_waiting()
            client = self.clients[node]
        self.events.record("drain", f"{node} drains" + (f" ({moved} request(s) moved)" if move else ""))
        log.warning("coordinator: draining node %s%s", node, f" ({moved} request(s) moved)" if move else "")
        self._tell_worker(client, node, True)
        return self.node_status(node)

    def undrain(self, node: str) -> NodeStatus:
        """Put a draining or drained ``node`` back into routing (a no-op for a node that takes
        requests: no event is recorded). Raises :class:`UnknownNode`."""
        self._check_node(node)
        client = self.clients[node]
        self._tell_worker(client, node, False)
        with self._lock:
            was_draining = node in self.draining_nodes()
            self.drains.since_s.pop(node, None)
            self.drains.undrained_s[node] = time.monotonic()
            s = self.stats[node]
            if s.draining:   # the worker's own flag, cleared above: routing need not wait a poll
                self.stats[node] = s = dataclasses.replace(s, draining=False)
            if self.health.state(node) is NodeState.OK and s.configured:
                self.scheduler.kv.observe(node, s.kv_used_token_layers)
            self._reflow()
            self._admit_waiting()
        if was_draining:
            self.events.record("undrain", f"{node} takes requests again")
            log.warning("coordinator: node %s takes requests again", node)
        return self.node_status(node)

    @staticmethod
    def _tell_worker(client, node: str, draining: bool) -> None:
        """The worker's own flag, so its stats say so (best effort: the coordinator's word routes)."""
        try:
            client.call("Drain", {"draining": draining}, timeout_s=5.0)
        except ControlError as exc:
            log.warning("coordinator: telling %s it is %s failed: %s", node,
                        "draining" if draining else "back in service", exc)

    def _check_leaves_a_pipeline(self, node: str) -> None:
        """Raise :class:`DrainRefused` when the nodes left taking requests (not draining, not dead;
        suspect ones count: they may answer again) hold no pipeline without ``node``."""
        dead = {n for n, s in self.health.states().items() if s is NodeState.DEAD}
        left = set(self.workers) - self.draining_nodes() - dead - {node}
        if self._has_pipeline(left):
            return
        held = {layer for p in self.plan.placements if p.node in left for layer in range(p.start, p.end)}
        missing = [layer for layer in range(self.plan.num_layers) if layer not in held]
        why = (f"it is the last node taking requests that holds layer(s) {_ranges(missing)}" if missing
               else "the nodes left cannot form a pipeline")
        raise DrainRefused(f"refusing to drain {node}: {why}, so no request could be served "
                           f"(drain it anyway with --force)")

    def _requests_by_node(self) -> Counter[str]:
        """How many requests' pipelines cross each node (one pass over the live requests)."""
        return Counter(n for r in self._live.values() if not r.done and r.pipeline is not None
                       for n in dict.fromkeys(r.pipeline.nodes))

    def node_status(self, node: str) -> NodeStatus:
        """``node``'s status now; raises :class:`UnknownNode`."""
        self._check_node(node)
        with self._lock:
            return self._status(node, self.health.state(node), time.monotonic(),
                                self._requests_by_node()[node])

    def nodes_status(self) -> list[NodeStatus]:
        """Every node's status, in plan order."""
        with self._lock:
            now, states, counts = time.monotonic(), self.health.states(), self._requests_by_node()
            return [self._status(p.node, states[p.node], now, counts[p.node])
                    for p in self.plan.placements]

    def _status(self, node: str, health: NodeState, now: float, requests: int) -> NodeStatus:
        s, p = self.stats[node], self.plan.placement_of(node)
        state = health.value
        draining = node in self.drains or s.draining
        if draining and health is NodeState.OK:
            state = "drained" if requests == 0 and s.num_requests == 0 else "draining"
        reason = self.lost.get(node) if health is not NodeState.OK else None
        if reason is not None:
            state = "lost"
        since = self.drains.since_s.get(node)
        down = self.health.down_since(node)
        return NodeStatus(node, state, p.start, p.end, requests,
                          s.num_requests if health is NodeState.OK else None, s.kv_blocks_used,
                          None if not draining else (now - since if since is not None else 0.0),
                          None if down is None else round(now - down, 1), self.restarts[node], reason)

    def node_states(self) -> dict[str, str]:
        """Each node's state (``ok`` / ``suspect`` / ``dead`` / ``lost``, or ``draining`` /
        ``drained``), for /health and /metrics."""
        return {st.node: st.state for st in self.nodes_status()}


#: Why a drain or undrain is refused without an API key off loopback (HTTP 403, gRPC
#: PERMISSION_DENIED).
ADMIN_NEEDS_KEY = ("draining needs --api-key when helix serve listens off loopback (anyone "
                   "reaching the port could take nodes out of service)")
