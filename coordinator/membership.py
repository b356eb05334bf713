"""The coordinator's side of its workers: heartbeats, each node's health, failover and rejoin.

A mixin of :class:`coordinator.runtime.Coordinator` (it reads and writes the coordinator's state
under the coordinator's lock): the stats poller feeds :class:`coordinator.health.NodeHealth`, a
suspect or dead node is masked in the scheduler's KV estimator, a dead node's requests move to
another pipeline (:meth:`Membership._move`), a suspect node's too while another pipeline has room
for them (a frozen node's streams need not wait until it is declared dead), a node that registers
again rejoins (:meth:`Membership.rejoin`), and with no pipeline left requests wait a grace period,
then fail (:class:`NoPipeline`, HTTP 503).

Outages: each poll works out the share of the plan's capacity that the serving nodes carry
(:class:`coordinator.capacity.Capacity`), which sizes the waiting queue
(:class:`coordinator.admission.WaitingBound`); the time each dead node took to come back is the
restart time the queue is sized for. A node whose worker cannot be restarted is *lost*
(:meth:`Membership.mark_lost`, said by whoever restarts workers: ``helix.server.restarts``) until a
new process for it registers. :meth:`Membership.health_report` says all of it for ``/health``.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from datetime import datetime, timezone

from coordinator.admission import QueueFull
from coordinator.capacity import Capacity
from coordinator.health import NodeState, Transition
from coordinator.reflow import rebuilt, surviving_flows
from coordinator.requests import Done, LiveRequest
from coordinator.stalls import StallWatch
from coordinator.workers import WorkerHandle
from helix.core.errors import HelixUserError
from helix.net.control import WORKER_SERVICE, ControlClient, ControlError
from helix.net.sampling import SamplingParams
from helix.net.stats import WorkerStats
from helix.net.wire import Release
from helix.core.plan import COORDINATOR

log = logging.getLogger("helix.coordinator")


class NoPipeline(Exception):
    """No pipeline of live workers is left, and none came back within the grace period."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Membership:
    """Worker health and failover for :class:`~coordinator.runtime.Coordinator` (see the module)."""

    def _outages_init(self) -> None:
        self.lost: dict[str, str] = {}
        """Nodes whose worker cannot be restarted now, and why (until a new process registers)."""
        self.restarts: Counter[str] = Counter()
        """Times a new process registered for each node while serving (a restart)."""
        self.capacity_fraction = 1.0
        """The share of the plan's capacity the serving nodes carry (at the last poll)."""
        self._capacity: Capacity | None = None
        self.stalls = StallWatch(self.config.health.stall)
        self.stalled: set[str] = set()
        """Nodes on pipelines whose output stopped (and on none still sending): no new requests
        until output resumes (:mod:`coordinator.stalls`)."""
        self._stalls_checked_s = 0.0
        self.stalls_total: Counter[str] = Counter()
        """Times each node was found stalled."""
        self.stalled_at: dict[str, float] = {}
        """When (``time.monotonic()``) each node was last found stalled."""

    def mark_lost(self, node: str, reason: str) -> None:
        """``node``'s worker cannot be restarted (its machine is gone, or it fails to start): it is
        reported ``lost`` with ``reason`` until a new process for it registers. Unknown nodes (one
        that left the plan) are ignored."""
        with self._lock:
            if node not in self.workers or self.lost.get(node) == reason:
                return
            self.lost[node] = reason
        self.events.record("lost", f"{node} is lost: {reason}")
        log.error("coordinator: node %s is lost: %s", node, reason)

    def rejoin(self, w: WorkerHandle) -> None:
        """A worker for a plan node registered again (restarted by hand, or by Ray, at new
        addresses): load its slice, tell every peer where it is now; the next stats polls bring it
        back into routing (dead -> ok). Requests that moved away from the old process stay moved."""
        if w.node not in self.workers:
            raise HelixUserError(f"node {w.node!r} is not in the plan; nodes: {sorted(self.workers)}")
        if self.workers[w.node] == w:
            return   # the same process registering twice (a retried call): nothing changed
        client = ControlClient(w.control_address, WORKER_SERVICE, keys=self.keys)
        reply = self._load_slice(self.plan.placement_of(w.node), self.serving, client)
        self._load_adapters_on(w.node, client)   # the tasks every worker holds (coordinator.adapters)
        with self._lock:
            # A new process replaces the node: whatever the old one held is gone with it (it may
            # still look alive: restarted before it was declared dead). Its requests move first.
            self.restarts[w.node] += 1
            self.events.record("restart", f"{w.node}: a new worker process registered")
            self.lost.pop(w.node, None)
            t = self.health.declare_dead(w.node, time.monotonic())
            if t is not None:
                self._on_transition(t)
                self._reflow()
            old = self.clients.get(w.node)
            self.workers[w.node] = w
            self.clients[w.node] = client
            self.stats[w.node] = WorkerStats.from_dict(reply)
            self.data.forget_queued(w.node)
        self._publish_peers()   # coordinator.reshape
        if old is not None and old is not client:
            old.close()
        log.warning("coordinator: node %s rejoined (control %s, data %s)", w.node, w.control_address,
                    w.data_address)

    # --- worker stats, health -----------------------------------------------------------------------
    def _stats_loop(self) -> None:
        while not self._stop.wait(self.config.stats_interval_s):
            try:   # the queue and /health depend on this thread: it must outlive any one poll
                self.poll_stats()
            except Exception:
                log.exception("coordinator: stats poll failed")

    def poll_stats(self) -> None:
        """Poll every worker at once (the heartbeat): feed real KV use to the estimator, update each
        node's health, and act on the changes: suspect and dead nodes get no new requests (they read
        full to the estimator, as drained ones do), a dead node's requests move to other pipelines,
        and a node that answers again is released of the requests that moved away from it."""
        timeout_s = min(2.0, self.config.health.suspect_after_s)
        nodes = list(self.clients)
        polled_s = time.monotonic()
        replies = list(self._poll_pool.map(lambda n: self._poll_one(n, timeout_s), nodes))
        now = time.monotonic()
        with self._lock:
            for node, reply in zip(nodes, replies):
                if node not in self.clients:   # it left the plan while polled (coordinator.reshape)
                    continue
                if isinstance(reply, WorkerStats):
                    reply = self._fresh(reply, polled_s)
                    self.health.answered(node, now)
                    old = self.stats.get(node)
                    if old is not None and reply.steps_total > old.steps_total:
                        self._stepped_s[node] = now
                    self.stats[node] = reply
                else:
                    self.health.failed(node, refused=reply)
            changes = self.health.update(now)
            for t in changes:
                self._on_transition(t)
            if any(NodeState.DEAD in (t.old, t.new) for t in changes):
                self._reflow()
            self._observe_kv([n for n in nodes if n in self.clients], self.scheduler.kv)
            self._move_off_suspects()
            self._update_route(now)
            self._update_capacity(now)
            self._admit_waiting()   # usage may have dropped with no request ending

    def _poll_one(self, node: str, timeout_s: float) -> WorkerStats | bool:
        """The node's stats, or whether the failure was a refusal (nothing listening there)."""
        try:
            return WorkerStats.from_dict(self.clients[node].call("Stats", timeout_s=timeout_s))
        except ControlError as exc:
            if self.health.state(node) is NodeState.OK:
                log.warning("coordinator: stats of %s failed: %s", node, exc)
            return exc.code.name == "UNAVAILABLE" and "refused" in exc.details.lower()
        except Exception:   # a reply that does not parse
            log.exception("coordinator: stats of %s unreadable", node)
            return False

    def _reflow(self) -> None:
        """Re-solve the max flow on the nodes neither dead nor draining and schedule on it (under the
        lock); with every node back, the plan's own flows come back. Plans without capacities keep
        their flows (dead and draining nodes are masked either way)."""
        alive = {n for n, s in self.health.states().items() if s is not NodeState.DEAD}
        alive -= self.draining_nodes()
        flows = self.plan.arc_flows if alive >= set(self.workers) else surviving_flows(self.plan, alive)
        if flows is None or flows == self._flows:
            return
        self.scheduler = rebuilt(self.scheduler, self.plan, flows, self.scheduler.kv, self._make_scheduler)
        self._flows = flows
        total = sum(a.flow_tokens_per_s for a in flows if a.src == COORDINATOR)
        self.events.record("reroute", f"routing on a max flow of {total:,.0f} tokens/s over "
                                      f"{len(alive)} live node(s)")
        log.warning("coordinator: routing on a max flow of %.0f tokens/s over %d live node(s)",
                    total, len(alive))

    def _on_transition(self, t: Transition) -> None:
        """Act on one node's change of state (under the lock)."""
        log.warning("coordinator: node %s is %s (was %s)", t.node, t.new.value, t.old.value)
        self.events.record("return" if t.new is NodeState.OK else "failure",
                           f"{t.node} is {'serving again' if t.new is NodeState.OK else t.new.value} "
                           f"(was {t.old.value})")
        if t.new is NodeState.DEAD:
            self.data.forget_queued(t.node)   # a restarted process must not get the old traffic
            moving = [r for r in self._live.values()
                      if not r.done and r.pipeline is not None and t.node in r.pipeline.nodes]
            for req in moving:
                self._move(req, t.node)
        elif t.new is NodeState.OK:
            self.lost.pop(t.node, None)
            if t.old is NodeState.DEAD and t.down_s is not None:
                self.waiting_bound.restarted(t.down_s)   # what the waiting queue is sized for
            orphans = self._orphans.pop(t.node, set())
            if orphans:   # the node kept KV of requests that moved away: free it
                try:
                    self.data.send(t.node, Release(tuple(sorted(orphans))))
                except Exception:
                    log.exception("coordinator: releasing moved requests on %s failed", t.node)

    def _move_off_suspects(self) -> None:
        """Move the requests crossing a suspect node (silent: frozen, overloaded or cut off) to
        pipelines without it, as long as one has room now (under the lock); the others stay where
        they are, for the node may answer again and continue them. The node is masked already."""
        suspects = {n for n, s in self.health.states().items() if s is NodeState.SUSPECT}
        if not suspects:
            return
        stuck = [r for r in self._live.values()
                 if not r.done and r.pipeline is not None and not suspects.isdisjoint(r.pipeline.nodes)]
        moved = 0
        for req in stuck:
            old_id = req.request_id
            req.request_id = self._next_id   # the id _move gives it, so the reservation is its own
            pipeline = self._schedule(req, len(req.dispatch_token_ids()),
                                      req.dispatch_params().max_tokens)
            req.request_id = old_id
            if pipeline is None:
                break   # no room: later polls try again
            self._move(req, next(n for n in req.pipeline.nodes if n in suspects), queue=False)
            moved += 1
            try:
                self._try_dispatch(req, pipeline)
            except Exception:   # the send failed: it waits, first in line, as a dead node's do
                log.exception("coordinator: dispatching moved request %d failed", req.request_id)
                self._waiting.appendleft(req)
        if moved:
            log.warning("coordinator: %d of %d request(s) moved off suspect node(s) %s", moved,
                        len(stuck), ", ".join(sorted(suspects)))

    def _move(self, req: LiveRequest, dead: str | None, queue: bool = True) -> None:
        """``req``'s pipeline lost ``dead`` (None: none lost, a drained node gives its requests away):
        free it on the other stages (and on ``dead`` once it answers again) and start it again, under a
        new id, on another pipeline from its prompt and the tokens it already streamed (the caller
        sees a pause). Greedy output is unchanged; presence / frequency penalties then also count the
        earlier output as prompt, and a seeded draw restarts its generator. ``queue`` False: the
        caller dispatches it (a pipeline is reserved for its new id) instead of queueing it."""
        old_id = req.request_id
        self.scheduler.release(old_id)
        for node in dict.fromkeys(req.pipeline.nodes):
            if node == dead:
                self._orphans.setdefault(node, set()).add(old_id)
                continue
            try:
                self.data.send(node, Release((old_id,)))
            except Exception:
                log.exception("coordinator: releasing request %r on %s failed", old_id, node)
        del self._live[old_id]
        req.request_id = self._next_id
        self._next_id += 1
        self._alias[req.handle.request_id] = req.request_id
        self._live[req.request_id] = req
        req.pipeline = None
        req.moves += 1
        self.requests_moved += 1
        self.moved_prefill_tokens += len(req.dispatch_token_ids())
        if queue:   # it was admitted before: it goes ahead of requests that never started
            self._waiting.appendleft(req)

    def _observe_kv(self, nodes, kv) -> None:
        """Feed ``kv`` each node's KV use from its last stats (under the lock); a node that is not
        ok, drains, stalls or has no slice counts as full twice over, so nothing is routed to it."""
        draining = self.draining_nodes()
        for node in nodes:
            s = self.stats[node]
            usable = (self.health.state(node) is NodeState.OK and node not in draining
                      and node not in self.stalled and s.configured)
            kv.observe(node, s.kv_used_token_layers if usable else 2 * s.kv_capacity_token_layers)

    def check_stalls(self, interval_s: float = 0.05) -> None:
        """Every ``interval_s`` at most: the nodes of pipelines whose output stopped get no new
        requests, as long as the other nodes still form a pipeline (a lone pipeline that is slow
        is better than none); when output resumes they get requests again."""
        now = time.perf_counter()
        if now - self._stalls_checked_s < interval_s or self.scheduler is None:
            return
        self._stalls_checked_s = now
        with self._lock:
            since: dict[tuple[str, ...], float] = {}
            for r in self._live.values():
                if not r.done and r.pipeline is not None and r.dispatched_s is not None:
                    nodes = r.pipeline.nodes
                    since[nodes] = min(since.get(nodes, r.dispatched_s), r.dispatched_s)
            stalled = set(self.stalls.stalled(since, now))
            culprits = self.stalls.culprits(stalled, now)
            if culprits and not self._has_pipeline(self._usable() - culprits):
                # Blame only the nodes no other pipeline goes through (a shared first stage of an
                # idle pipeline is not exonerated by output; it is by the plan's other routes).
                shared = {n for p in self.pipeline_counts if p not in stalled for n in p}
                culprits -= shared
                if culprits and not self._has_pipeline(self._usable() - culprits):
                    culprits = set()
            if culprits == self.stalled:
                return
            for node in culprits - self.stalled:
                self.stalls_total[node] += 1
                self.stalled_at[node] = time.monotonic()
            if culprits - self.stalled:
                log.warning("coordinator: no output from pipeline(s) through %s for %s: no new "
                            "requests there until it resumes", ", ".join(sorted(culprits - self.stalled)),
                            ", ".join(f"{self.stalls.limit_s(p):.2f} s" for p in since
                                      if set(p) & (culprits - self.stalled)))
            resumed = self.stalled - culprits
            if resumed:
                log.warning("coordinator: output from %s again", ", ".join(sorted(resumed)))
            self.stalled = culprits
            self._observe_kv([n for n in self.clients if n in self.stats], self.scheduler.kv)
            if resumed:
                self._admit_waiting()

    def _update_route(self, now: float) -> None:
        """Track since when no pipeline of usable nodes exists; past the grace, fail what waits
        (not while a plan is applied: requests wait for the nodes it reloads)."""
        if self.reshaping or self._has_pipeline(self._usable()):
            self._no_route_since = None
            return
        if self._no_route_since is None:
            self._no_route_since = now
            log.warning("coordinator: no pipeline of live workers is left (%s); requests wait up to "
                        "%.0f s", self._unusable_text(), self.config.health.no_route_grace_s)
        if now - self._no_route_since >= self.config.health.no_route_grace_s:
            message = self._no_route_message()
            while self._waiting:
                self._finish(self._waiting.popleft(), "error", release_stages=False, error=message,
                             retry_after_s=self.config.retry_after_s)

    # --- capacity, the waiting queue, outages -------------------------------------------------------
    def _update_capacity(self, now: float) -> None:
        """The share of the plan's capacity the serving nodes carry now (under the lock)."""
        if self._capacity is None or self._capacity.plan is not self.plan:
            self._capacity = Capacity(self.plan)
        fraction = self._capacity.fraction(self._usable())
        if fraction != self.capacity_fraction:
            log.warning("coordinator: %.0f %% of the plan's capacity serves", 100 * fraction)
        self.capacity_fraction = fraction
        self.waiting_bound.serving(now, fraction)

    def queue_limit(self) -> int:
        """How many new requests may wait for a pipeline now."""
        return self.waiting_bound.limit(time.monotonic(), self.capacity_fraction)

    def _check_queue(self) -> None:
        """Raise :class:`~coordinator.admission.QueueFull` when as many new requests wait as the
        bound allows, or the oldest has waited past it (under the lock). Moved requests (admitted
        before) do not count."""
        now, bound = time.monotonic(), self.waiting_bound
        limit = bound.limit(now, self.capacity_fraction)
        oldest = next((r for r in self._waiting if not r.moves), None)
        waited_s = 0.0 if oldest is None else time.perf_counter() - oldest.arrival_s
        if len(self._waiting) < limit and not bound.overdue(waited_s):
            return
        fresh = sum(1 for r in self._waiting if not r.moves)
        if fresh < limit and not bound.overdue(waited_s):
            return
        raise QueueFull(bound.retry_after_s(now, self.capacity_fraction, fresh),
                        f"{fresh} new requests wait, the oldest for {waited_s:.0f} s; "
                        f"{100 * self.capacity_fraction:.0f} % of the plan's capacity serves")

    def health_report(self) -> dict:
        """What ``/health`` says beside its status: the share of the plan's capacity that serves
        (and its tokens/s), every node's state, the nodes that are down (since when, for how long,
        and why when lost), and the waiting queue against its bound."""
        states = self.node_states()
        with self._lock:
            now, wall = time.monotonic(), time.time()
            capacity = self._capacity or Capacity(self.plan)
            down = {}
            for node in self.workers:
                since = self.health.down_since(node)
                if since is None:
                    continue
                at = datetime.fromtimestamp(wall - (now - since), timezone.utc)
                down[node] = {"state": states[node], "since": at.isoformat(timespec="seconds"),
                              "for_s": round(now - since, 1), "restarts": self.restarts[node]}
                if node in self.lost:
                    down[node]["reason"] = self.lost[node]
            fraction = self.capacity_fraction
            return {"capacity_fraction": round(fraction, 4),
                    "capacity_tokens_per_s": round(fraction * capacity.full_tokens_per_s, 1),
                    "plan_tokens_per_s": round(capacity.full_tokens_per_s, 1),
                    "nodes": states, "down": down, "stalled": sorted(self.stalled),
                    "waiting": {"requests": len(self._waiting), "limit": self.queue_limit(),
                                "wait_s": round(self.waiting_bound.wait_s, 1)}}

    def _check_route(self) -> None:
        """Refuse a new request once no pipeline has been left for the whole grace period."""
        grace = self.config.health.no_route_grace_s
        if self._no_route_since is not None and time.monotonic() - self._no_route_since >= grace:
            raise NoPipeline(self._no_route_message(), self.config.retry_after_s)

    def _usable(self) -> set[str]:
        draining = self.draining_nodes()
        return {n for n in self.health.usable() if n not in draining and self.stats[n].configured}

    def _unusable_text(self) -> str:
        bad = {n: s.value for n, s in self.health.states().items() if s is not NodeState.OK}
        bad = {n: "draining" for n in self.draining_nodes()} | bad
        return ", ".join(f"{n} {s}" for n, s in sorted(bad.items())) or "every node is draining"

    def _no_route_message(self) -> str:
        return (f"no pipeline can serve: {self._unusable_text()} (no live worker holds some layers "
                f"for {self.config.health.no_route_grace_s:.0f} s)")

    def healthy(self, probe_timeout_s: float = 10.0) -> bool:
        """True when some pipeline of live (``ok``, not draining) nodes completed a generation step
        within ``health_window_s``; otherwise when a one-token probe generates through a pipeline
        now. False at once when no pipeline of live nodes exists (workers gone or frozen)."""
        with self._lock:
            usable = self._usable()
        if not self._has_pipeline(usable):
            return False
        now = time.monotonic()
        window = self.config.health_window_s
        stepped = {n for n in usable if now - self._stepped_s.get(n, -math.inf) <= window}
        if self._has_pipeline(stepped):
            return True
        with self._probe_lock:   # concurrent health checks share the machine, not one probe each
            return self._probe(probe_timeout_s)

    def _has_pipeline(self, nodes: set[str]) -> bool:
        topology = self.scheduler.fallback or self.scheduler.topology
        # No lock: a Topology may be walked from any thread (see its docstring).
        return topology.has_path(topology.mask_of(n for n in topology.nodes if n in nodes))

    def _probe(self, timeout_s: float) -> bool:
        try:
            handle = self.submit(self.codec.encode("health") or [0],
                                 SamplingParams(temperature=0, max_tokens=1))
            return any(isinstance(ev, Done) and ev.error is None and ev.finish_reason != "abort"
                       for ev in handle.events(timeout_s=timeout_s))
        except Exception:   # QueueFull, a timeout, a failed step: all mean "not healthy now"
            return False
