"""Applying a new plan to a running coordinator: nodes join, slices move,
no request is dropped.

A mixin of :class:`coordinator.runtime.Coordinator` (its state is read and written under the
coordinator's lock). :meth:`Reshaping.apply_plan` takes the new plan (made by the planner in
``helix.server``: this package does not import it) and the workers of nodes that join with it:

1. every joining node loads its new slice (it is in no pipeline yet), gets the peer book, and the
   routing switches to the running placement plus the joined nodes;
2. every running node whose range changes, one at a time, *drain first*: out of routing
   (:meth:`~coordinator.drain.Draining.drain`), wait until no request crosses it (in-flight
   requests finish on the pipeline they started on), load the new slice, route on the placement as
   it now stands (the running ranges with the nodes moved so far), back into routing;
3. the routing switches to the new plan (its pipelines and IWRR weights from its flows) at once:
   the scheduler is rebuilt and takes over the reservations of the requests in flight.

Order: the next node to move is one whose drain leaves a pipeline of the nodes still taking
requests (so every layer stays served). When none can (the only holder of layer 0 grows, say), the
first one moves anyway: new requests wait in the queue (not failed: the no-route grace is
suspended while a plan is applied) until it is back. Joined nodes count from step 1 on, which is
what usually frees the order. Nodes the new plan drops leave routing at the switch; once no
request crosses them they are forgotten (their workers stay up, idle, and may join again).

Routing between the switches: a mixed placement has no flow solution of its own; its arcs take the
old plan's flows between nodes that did not move and the new plan's where a moved node is an end,
and the scheduler's fallback (every usable hop, by KV) covers the rest.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from coordinator.health import NodeState
from coordinator.pipeline import Topology
from coordinator.reflow import rebuilt
from coordinator.workers import WorkerHandle, check_serving
from helix.core.errors import HelixUserError
from helix.net.control import WORKER_SERVICE, ControlClient, ControlError
from helix.net.stats import WorkerStats
from helix.core.plan import COORDINATOR, Plan
from helix.core.slices import LayerSlice, as_placement, as_slices

log = logging.getLogger("helix.coordinator")

Range = tuple[int, int]


class ApplyBusy(HelixUserError):
    """Another plan is being applied (HTTP 409)."""


@dataclass(frozen=True)
class Step:
    """One node's change while a plan was applied."""

    node: str
    old: Range | None
    """Its layers before (None: it joined)."""
    new: Range | None
    """Its layers after (None: the new plan drops it; it is retired once empty)."""
    forced: bool
    """Its drain left no pipeline (new requests waited until it was back)."""
    drain_s: float
    """Seconds until its last request finished (0 for a joining node)."""
    load_s: float
    """Seconds its worker took to load the new slice."""


@dataclass(frozen=True)
class ApplyReport:
    """What :meth:`Reshaping.apply_plan` did."""

    steps: tuple[Step, ...]
    seconds: float
    max_flow_tokens_per_s: float
    """The new plan's."""

    def to_dict(self) -> dict:
        return asdict(self)


def mixed_plan(old: Plan, new: Plan, ranges: dict[str, Range], moved: set[str]) -> Plan:
    """The placement while a plan is applied: ``ranges`` (each node's slice now), routed on ``old``'s
    flows between nodes not ``moved`` and ``new``'s where a moved node is an end (unusable arcs
    are dropped by the topology; the fallback covers missing ones). Serving: each node's KV pool
    from the plan whose slice it holds. No flow capacities: a node lost meanwhile is only masked."""
    def mine(a) -> bool:
        return a.src in moved or a.dst in moved
    flows = tuple(a for a in old.arc_flows if not mine(a) and a.src in (COORDINATOR, *ranges)
                  and a.dst in (COORDINATOR, *ranges)) + tuple(a for a in new.arc_flows if mine(a))
    pools = {n: (new if n in moved else old).serving.kv_capacity_tokens.get(n, 0) for n in ranges}
    serving = new.serving.model_copy(update={"kv_capacity_tokens": pools})
    return dataclasses.replace(
        new, placements=as_slices(ranges),
        arc_flows=flows, max_flow_tokens_per_s=sum(a.flow_tokens_per_s for a in flows
                                                   if a.src == COORDINATOR),
        serving=serving, prediction=None, extras={})


def next_move(num_layers: int, ranges: dict[str, Range], changing: Sequence[str],
              taking: set[str], partial_inference: bool = True,
              target: dict[str, Range] | None = None) -> tuple[str, bool]:
    """The node of ``changing`` to move next and whether that is forced (its drain leaves no
    pipeline of the nodes in ``taking``, those taking requests). Preferred: a node whose drain
    leaves a pipeline, then (given the ``target`` ranges) one after whose move the placement has
    a pipeline of all its nodes (so routing can take it back at once); ties in ``changing``'s order."""
    def runs(rs: dict[str, Range], nodes: set[str]) -> bool:
        every = [COORDINATOR, *rs]
        t = Topology(num_layers, rs, {u: [w for w in every if w != u] for u in every},
                     partial_inference=partial_inference)
        return t.has_path(t.mask_of(nodes))
    best = None
    for k, node in enumerate(changing):
        keeps = runs(ranges, taking - {node})
        after = {**ranges, node: target[node]} if target is not None else ranges
        key = (not keeps, not runs(after, set(after)), k)
        if best is None or key < best[0]:
            best = (key, node)
    return best[1], best[0][0]


class Reshaping:
    """:meth:`apply_plan` for :class:`~coordinator.runtime.Coordinator` (see the module)."""

    reshaping = False
    """True while a plan is applied: waiting requests are neither failed for want of a pipeline
    nor refused as too big for the pipelines left (the moving nodes come back)."""
    _apply_lock = threading.Lock()   # one plan applied at a time (per process is enough)

    def apply_plan(self, plan: Plan, joining: Sequence[WorkerHandle] = (), timeout_s: float = 600.0,
                   progress: Callable[[str], None] | None = None) -> ApplyReport:
        """Switch to ``plan``; ``joining``: the workers of its nodes that do not serve yet. Raises
        :class:`HelixUserError` for a plan that does not fit (other model, no serving section, a
        node without a worker) and :class:`ApplyBusy` while another applies;
        a node whose requests do not finish within ``timeout_s`` stops the change there (it is put
        back into routing with its old slice)."""
        if not self._apply_lock.acquire(blocking=False):
            raise ApplyBusy("another plan is being applied; try again when it is done")
        try:
            self._check_plan(plan, joining)
            say = progress or (lambda line: log.warning("coordinator: %s", line))
            t0 = time.monotonic()
            self.reshaping = True
            try:
                steps = self._apply(plan, joining, t0 + timeout_s, say)
            finally:
                self.reshaping = False
            seconds = time.monotonic() - t0
            self.events.record("replan_applied", f"new plan applied in {seconds:.1f} s: {len(steps)} "
                               f"node(s) changed, max flow {plan.max_flow_tokens_per_s:,.0f} tokens/s")
            say(f"plan applied in {seconds:.1f} s: {len(steps)} node(s) changed, max flow "
                f"{plan.max_flow_tokens_per_s:,.0f} tokens/s")
            return ApplyReport(tuple(steps), seconds, plan.max_flow_tokens_per_s)
        finally:
            self._apply_lock.release()

    def _check_plan(self, plan: Plan, joining: Sequence[WorkerHandle]) -> None:
        if plan.num_layers != self.plan.num_layers:
            raise HelixUserError(f"the new plan places {plan.num_layers} layers; the served model "
                                 f"has {self.plan.num_layers}")
        check_serving(plan)
        new, joins = as_placement(plan.placements, skip_empty=True), {w.node for w in joining}
        again = sorted(joins & set(self.workers))
        if again:
            raise HelixUserError(f"node(s) {again} already serve: they cannot join")
        missing = sorted(set(new) - set(self.workers) - joins)
        if missing:
            raise HelixUserError(f"no worker for the new plan's node(s) {missing} (start them with "
                                 f"helix worker --coordinator HOST:PORT --node NAME)")

    def _apply(self, plan: Plan, joining: Sequence[WorkerHandle], deadline: float, say) -> list[Step]:
        old, target = self.plan, as_placement(plan.placements, skip_empty=True)
        ranges, moved, steps = as_placement(old.placements, skip_empty=True), set(), []
        for w in joining:
            t = time.monotonic()
            self._join_worker(w, target[w.node], plan)
            ranges[w.node] = target[w.node]
            moved.add(w.node)
            steps.append(Step(w.node, None, target[w.node], False, 0.0, time.monotonic() - t))
            say(f"node {w.node} joined with layers {target[w.node]}")
        if joining:
            self._install(mixed_plan(old, plan, ranges, moved))
        changing = [n for n in ranges if n in target and n not in moved and ranges[n] != target[n]]
        waiting: list[str] = []   # moved, drained until a placement with a pipeline can route them
        while changing:
            node, forced = next_move(plan.num_layers, ranges, changing, set(self._usable()),
                                     plan.partial_inference, target)
            changing.remove(node)
            steps.append(self._move_node(node, ranges, target[node], old, plan, moved, forced,
                                         deadline, say, waiting))
        self._install(plan)
        for node in waiting:
            self.undrain(node)
        for node in sorted(set(ranges) - set(target)):   # routed to no more: retire once empty
            t0 = time.monotonic()
            self._tell_worker(self.clients[node], node, True)
            self._wait_empty(node, deadline, retiring=True)
            self._retire(node)
            steps.append(Step(node, ranges[node], None, False, time.monotonic() - t0, 0.0))
            say(f"node {node} left the plan (its worker is idle and may be stopped)")
        return steps

    def _retire(self, node: str) -> None:
        """Forget ``node`` (the plan no longer has it, and no request crosses it): no more polls,
        no status; its worker stays up, idle, and may register again to join."""
        with self._lock:
            client = self.clients.pop(node)
            for book in (self.workers, self.stats, self._stepped_s, self._orphans, self.drains.since_s):
                book.pop(node, None)
            self.health.remove(node)
        client.close()

    def _move_node(self, node: str, ranges: dict[str, Range], new: Range, old: Plan, plan: Plan,
                   moved: set[str], forced: bool, deadline: float, say, waiting: list[str]) -> Step:
        """Drain ``node``, wait until it is empty, load ``new``, route on the placement now, undrain
        (with the nodes in ``waiting``). A placement now with no pipeline of all its nodes cannot
        be routed on: the node then joins ``waiting``, drained, until a later one can."""
        was = ranges[node]
        say(f"moving node {node} [{was[0]}, {was[1]}) -> [{new[0]}, {new[1]})" +
            (" (its drain leaves no pipeline: new requests wait until it is back)" if forced else ""))
        t0 = time.monotonic()
        self.drain(node, force=True)
        try:
            self._wait_empty(node, deadline)
        except HelixUserError:
            self.undrain(node)
            raise
        t1 = time.monotonic()
        try:
            reply = self._load_slice(LayerSlice(node, *new), plan.serving, self.clients[node],
                                     "new slice")
        except HelixUserError:   # the worker kept its old slice (it swaps only a loaded one)
            self.undrain(node)
            raise
        self._load_adapters_on(node, self.clients[node])
        with self._lock:
            self.stats[node] = WorkerStats.from_dict(reply)
        ranges[node] = new
        moved.add(node)
        try:
            self._install(mixed_plan(old, plan, ranges, moved))
        except HelixUserError as exc:   # the moved ranges form no pipeline yet: route as before
            waiting.append(node)
            say(f"node {node} waits drained with its new slice ({exc})")
            return Step(node, was, new, forced, t1 - t0, time.monotonic() - t1)
        for n in (*waiting, node):
            self.undrain(n)
        waiting.clear()
        return Step(node, was, new, forced, t1 - t0, time.monotonic() - t1)

    def _wait_empty(self, node: str, deadline: float, retiring: bool = False) -> None:
        """Until no request crosses ``node`` and its worker, polled after that, holds none (a dead
        node: until no request crosses it)."""
        clear_s = None
        while True:
            with self._lock:
                ours = self._requests_by_node()[node]
                theirs = self.stats[node].num_requests
                dead = self.health.state(node) is NodeState.DEAD
            if ours == 0 and dead:
                return   # a dead node's requests moved; its last report is stale
            if ours == 0 and clear_s is None:
                clear_s = time.monotonic()
            if ours == 0 and theirs == 0:
                try:   # the poller's figure may predate the last release: ask once more
                    if WorkerStats.from_dict(self.clients[node].call("Stats", timeout_s=5.0)).num_requests == 0:
                        return
                except ControlError as exc:
                    log.warning("coordinator: stats of %s failed while it drained: %s", node, exc)
            if time.monotonic() > deadline:
                if retiring:
                    raise HelixUserError(f"node {node} still holds {max(ours, theirs)} request(s) at "
                                         f"the apply timeout; the new plan serves, without it")
                raise HelixUserError(f"node {node} still holds {max(ours, theirs)} request(s) at the "
                                     f"apply timeout; it keeps its old slice and takes requests again "
                                     f"(the nodes moved before it keep their new slices)")
            time.sleep(min(0.05, self.config.stats_interval_s))

    def _join_worker(self, w: WorkerHandle, rng: Range, plan: Plan) -> None:
        """Load a joining node's slice and adapters, add it to the books (in no pipeline yet: the
        scheduler does not know it until the next install), tell every worker where it is."""
        client = ControlClient(w.control_address, WORKER_SERVICE, keys=self.keys)
        try:
            self._tell_worker(client, w.node, False)   # one that left a plan earlier said draining
            reply = self._load_slice(LayerSlice(w.node, *rng), plan.serving, client, "new slice")
            self._load_adapters_on(w.node, client)
        except BaseException:
            client.close()
            raise
        with self._lock:
            self.health.add(w.node, time.monotonic())
            self.stats[w.node] = WorkerStats.from_dict(reply)
            self.workers[w.node] = w
            self.clients[w.node] = client
        self._publish_peers()

    def _publish_peers(self) -> None:
        """Every worker's address book (and the coordinator's) from :attr:`workers`; call it
        without the lock held (it calls every worker)."""
        with self._lock:
            peers = {n: h.data_address for n, h in self.workers.items()} | {COORDINATOR: self.data.address}
            self.data.set_peers(peers)
            clients = dict(self.clients)
        for node, c in clients.items():
            try:
                c.call("SetPeers", {"peers": peers}, timeout_s=5.0)
            except ControlError as exc:   # a node that is down gets the book when it rejoins
                log.warning("coordinator: telling %s the peers failed: %s", node, exc)

    def _install(self, plan: Plan) -> None:
        """Route on ``plan`` from now on (under the lock, at once): the scheduler is rebuilt on its
        flows and takes over the requests in flight; KV pools, request limits and the re-solved
        max flow (dead and draining nodes) follow."""
        with self._lock:
            kv = self.scheduler.kv
            kv.resize({p.node: self.stats[p.node].kv_capacity_token_layers for p in plan.placements})
            self._observe_kv([p.node for p in plan.placements], kv)
            self.scheduler = rebuilt(self.scheduler, plan, plan.arc_flows, kv, self._make_scheduler)
            self.plan, self.serving, self._flows = plan, plan.serving, plan.arc_flows
            self._kv_tokens.clear()
            self._reflow()
            self._placement_follow(plan)   # tasks on the new pipelines (coordinator.adapters)
            self.limits = dataclasses.replace(self.limits, max_kv_tokens=self._max_kv_tokens())
            self._admit_waiting()
