"""Nodes that join a running ``helix serve``: checked against the cluster spec,
placed by a re-plan, routed to once their slice is loaded.

A worker whose node the plan lacks registers (``helix worker --coordinator ... --node NAME --gpu
KIND [--region R]``, or the Ray actor that :class:`RayJoins` starts on a Ray node that appears
with a ``helix_node:NAME`` resource of the spec); the coordinator's gRPC service hands it to
:meth:`Elastic.join`, which checks
it at once (the worker hears a one-line error and exits) and places it in the background:

- a node of the cluster spec (``helix serve --cluster``) that was absent takes the spec's GPU kind
  and region (given ones must agree); a new name needs a known ``--gpu`` and a region of the spec
  (``--region``, or the spec's only region), whose links the spec gives;
- :class:`planner.trigger.ReplanTrigger` (the policy the simulator also drives) re-plans the
  cluster with the node, warm-started from the running placement, and decides whether the new
  placement pays for its moves (:func:`planner.replan.decide`);
- adopted: :meth:`coordinator.runtime.Coordinator.apply_plan` loads the node's slice, moves the
  other slices drain-first, and switches routing; kept: the node stays registered but idle
  (:attr:`Elastic.joins` says why).

A node whose worker cannot be restarted (:mod:`helix.server.restarts`) is a departure to the same
trigger (:meth:`Elastic.node_lost`): a re-plan without it is considered at once, and an adopted one
is applied (the lost node leaves the plan; a worker of it that comes up later joins as a new node
does). One that comes back while still in the plan is present again (:meth:`Elastic.node_back`).

The same trigger re-plans when the workload's mix drifts (:meth:`Elastic.watch`): the requests
the coordinator completes (:class:`ObservedMix`, its observer) feed the trigger's window, a thread
asks it every ``poll_s`` whether a re-plan is due (drift beyond its band, enough requests, not too
soon after the last), and an adopted plan is applied as a join's is.

This module may import the planner: it is the launcher's side (``coordinator/`` may not).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from coordinator.runtime import Coordinator, WorkerHandle
from helix.core.errors import HelixUserError
from helix.core.spec import ClusterSpec, NodeSpec

log = logging.getLogger("helix.serve")


@dataclass
class JoinStatus:
    """One join, as ``Elastic.joins`` keeps it."""

    node: str
    state: str = "planning"
    """``planning``, ``applying``, ``serving`` (routed to), ``idle`` (the re-plan kept the running
    placement) or ``failed``."""
    detail: str = ""


def join_node_spec(spec: ClusterSpec | None, node: str, gpu: str | None, region: str | None) -> NodeSpec:
    """The joining ``node`` as the cluster spec has it (``gpu`` / ``region`` must agree), or a new
    node of GPU kind ``gpu`` in ``region``; one-line :class:`HelixUserError` otherwise."""
    if spec is None:
        raise HelixUserError(f"node {node!r} is not in the plan, and helix serve was started "
                             f"without --cluster SPEC, so a new node cannot be placed")
    if any(n.name == node for n in spec.nodes):
        known = spec.node(node)
        if gpu is not None and gpu != known.gpu:
            raise HelixUserError(f"node {node!r} is a {known.gpu} in the cluster spec, not a {gpu}")
        if region is not None and region != spec.region_of(node):
            raise HelixUserError(f"node {node!r} is in region {spec.region_of(node)!r} in the "
                                 f"cluster spec, not {region!r}")
        return known
    if gpu is None:
        raise HelixUserError(f"node {node!r} is not in the cluster spec: give its GPU kind "
                             f"(helix worker --gpu KIND)")
    if region is None:
        if len(spec.regions) > 1:
            raise HelixUserError(f"node {node!r} is not in the cluster spec: give its region "
                                 f"(helix worker --region R; the spec has {', '.join(spec.regions)})")
        region = next(iter(spec.regions))
    if region not in spec.regions:
        raise HelixUserError(f"region {region!r} of node {node!r} is not in the cluster spec (its "
                             f"links are not given); regions: {', '.join(spec.regions)}")
    from pydantic import ValidationError
    try:
        return NodeSpec(name=node, gpu=gpu, region=region)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise HelixUserError(f"node {node!r}: {first['msg'].removeprefix('Value error, ')}") from None


class Elastic:
    """Joins of one running serve (module docstring). ``spec``: the cluster spec every node that
    may take part is checked against (None: no new node can be placed)."""

    def __init__(self, coordinator: Coordinator, spec: ClusterSpec | None, config=None,
                 apply_timeout_s: float = 600.0) -> None:
        self.coordinator = coordinator
        self.spec = spec
        self.apply_timeout_s = apply_timeout_s
        self.joins: dict[str, JoinStatus] = {}
        self._lock = threading.Lock()   # one re-plan at a time, joins in arrival order
        self.trigger = None
        if spec is not None:
            from planner.trigger import ReplanTrigger, TriggerConfig
            running = {p.node for p in coordinator.plan.placements}
            unknown = sorted(running - {n.name for n in spec.nodes})
            if unknown:
                raise HelixUserError(f"--cluster: the spec lacks the plan's node(s) {unknown}")
            self.trigger = ReplanTrigger(spec, coordinator.plan, config or TriggerConfig(),
                                         present=running)
        self._t0 = time.monotonic()
        self._completed: list[tuple[float, int, int]] = []   # (now, prompt, output) not yet fed
        self._completed_lock = threading.Lock()
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self.replans: list[dict] = []
        """Every re-plan the trigger considered here (its summary, ``applied`` and ``error``)."""

    # --- drift -------------------------------------------------------------------------------------
    def completed(self, prompt_tokens: int, output_tokens: int) -> None:
        """A request completed (any thread; cheap: the trigger is fed at the next poll)."""
        with self._completed_lock:
            self._completed.append((self._now(), prompt_tokens, output_tokens))

    def watch(self, poll_s: float = 30.0) -> None:
        """Poll the trigger every ``poll_s`` in a thread until :meth:`close` (needs a spec)."""
        if self.trigger is None or self._watcher is not None:
            return
        def run():
            while not self._stop.wait(poll_s):
                try:
                    self.poll()
                except Exception:   # one failed re-plan must not stop the next
                    log.exception("re-plan poll failed")
        self._watcher = threading.Thread(target=run, name="helix-replan", daemon=True)
        self._watcher.start()

    def poll(self) -> dict | None:
        """Feed the completed requests to the trigger; re-plan if it is due, applying an adopted
        plan. The re-plan's summary (None: not due)."""
        with self._completed_lock:
            done, self._completed = self._completed, []
        with self._lock:
            for now_s, prompt, output in done:
                self.trigger.observe(now_s, prompt, output)
            if self.trigger.due(self._now()) is None:
                return None
            replan = self.trigger.poll(self._now())
            summary = {**replan.summary(), "cause": replan.cause, "applied": False, "error": None}
            self.replans.append(summary)
            log.warning("re-plan (%s): %s", replan.cause, replan.decision.reason)
            self._decided(replan)
            if replan.adopted:
                try:
                    self.coordinator.apply_plan(replan.plan, timeout_s=self.apply_timeout_s)
                    summary["applied"] = True
                except Exception as exc:
                    summary["error"] = str(exc).splitlines()[0] if str(exc) else repr(exc)
                    log.exception("applying the re-plan failed")
                finally:
                    self.trigger.plan = self.coordinator.plan
            return summary

    # --- departures ---------------------------------------------------------------------------------
    def node_lost(self, node: str, wait: bool = False) -> None:
        """``node`` cannot be restarted: the trigger counts it as gone and a re-plan is considered
        in the background (``wait``: here, before returning). Without a spec: nothing to plan."""
        self._membership(node, "node_left", wait)

    def node_back(self, node: str, wait: bool = False) -> None:
        """``node``, lost before, serves again in the running plan: the trigger counts it present.
        (A node the plan dropped meanwhile comes back by joining.)"""
        if node in self.coordinator.workers:
            self._membership(node, "node_joined", wait)

    def _membership(self, node: str, change: str, wait: bool) -> None:
        if self.trigger is None:
            return

        def run():
            try:
                with self._lock:
                    getattr(self.trigger, change)(self._now(), node)
                self.poll()
            except Exception:   # the node stays as it is; the next poll may re-plan
                log.exception("re-plan after %s %s failed", change, node)
        if wait:
            run()
        else:
            threading.Thread(target=run, name=f"helix-replan-{node}", daemon=True).start()

    def close(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5.0)

    def join(self, handle: WorkerHandle, request: dict) -> dict:
        """Check a registering worker of a node the plan lacks (``request``: its Register call,
        with optional ``gpu`` and ``region``), then place it in the background."""
        gpu, region = request.get("gpu"), request.get("region")
        for name, value in (("gpu", gpu), ("region", region)):
            if value is not None and not isinstance(value, str):
                raise HelixUserError(f"Register: {name} must be a string, got {value!r}")
        node = join_node_spec(self.spec, handle.node, gpu, region)
        status = self.joins.get(handle.node)
        if status is not None and status.state in ("planning", "applying"):
            raise HelixUserError(f"node {handle.node!r} is joining already ({status.state})")
        self.joins[handle.node] = JoinStatus(handle.node)
        self.coordinator.events.record("join", f"{handle.node} registered to join: re-planning")
        threading.Thread(target=self._place, args=(handle, node), daemon=True,
                         name=f"helix-join-{handle.node}").start()
        return {"ok": True, "joining": True}

    def _place(self, handle: WorkerHandle, node: NodeSpec) -> None:
        status = self.joins[handle.node]
        try:
            with self._lock:
                self.trigger.node_joined(self._now(), node)
                replan = self.trigger.poll(self._now())
                d = replan.decision
                self._decided(replan)
                if not d.adopt:
                    status.state, status.detail = "idle", d.reason
                    log.warning("join of %s: the re-plan keeps the running placement (%s); the node "
                                "stays idle", handle.node, d.reason)
                    return
                status.state = "applying"
                status.detail = (f"{d.current_tokens_per_s:,.0f} -> {d.proposed_tokens_per_s:,.0f} "
                                 f"tokens/s predicted, {len(d.moves)} node(s) change")
                log.warning("join of %s: re-plan adopted (%s)", handle.node, status.detail)
                try:
                    self.coordinator.apply_plan(replan.plan, joining=[handle],
                                                timeout_s=self.apply_timeout_s)
                finally:   # what runs now, applied whole or in part
                    self.trigger.plan = self.coordinator.plan
            status.state = "serving"
        except Exception as exc:
            status.state, status.detail = "failed", str(exc).splitlines()[0] if str(exc) else repr(exc)
            log.exception("join of %s failed", handle.node)

    def _decided(self, replan) -> None:
        self.coordinator.events.record("replan_decided", f"re-plan ({replan.cause}): "
                                                         f"{replan.decision.reason}")

    def _now(self) -> float:
        return time.monotonic() - self._t0


class ObservedMix:
    """The coordinator's observer: ``inner``'s hooks (the metrics), and every request that
    completed (stop / length) handed to :meth:`Elastic.completed`."""

    def __init__(self, inner, elastic: Elastic) -> None:
        self.inner, self.elastic = inner, elastic

    def first_token(self, ttft_s: float) -> None:
        if self.inner is not None:
            self.inner.first_token(ttft_s)

    def next_token(self, itl_s: float) -> None:
        if self.inner is not None:
            self.inner.next_token(itl_s)

    def finished(self, reason: str, e2e_s: float, queue_s: float, prompt_tokens: int,
                 completion_tokens: int, started: bool) -> None:
        if self.inner is not None:
            self.inner.finished(reason, e2e_s, queue_s, prompt_tokens, completion_tokens, started)
        if reason in ("stop", "length"):
            self.elastic.completed(prompt_tokens, completion_tokens)


class RayJoins:
    """Watches the Ray cluster for nodes that appear with a ``helix_node:<name>`` resource of the
    cluster spec that no worker serves, and starts each one's worker actor there; the actor
    registers and joins as a ``helix worker`` does (:meth:`Elastic.join`, its GPU kind and region
    from the spec). A name the spec lacks is logged once and left alone (it needs ``helix worker
    --gpu``)."""

    def __init__(self, elastic: Elastic, launcher, model_path: str, coordinator_address: str,
                 keys=None, interval_s: float = 2.0) -> None:
        self.elastic, self.launcher = elastic, launcher
        self._args = (model_path, coordinator_address, keys)
        self.interval_s = interval_s
        self.started: set[str] = set()
        """Nodes whose worker this watcher started."""
        self._ignored: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="helix-ray-joins", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.poll()
            except Exception:   # Ray away for a moment: try again at the next poll
                log.exception("watching Ray for joining nodes failed")

    def poll(self) -> list[str]:
        """Start the workers of new nodes now; their names."""
        spec = self.elastic.spec
        known = {n.name for n in spec.nodes} if spec is not None else set()
        new = sorted(self.launcher.offered() - set(self.elastic.coordinator.workers) - self.started
                     - set(self.launcher.supervised()))   # a lost node's actor waits for it already
        for node in new:
            if node not in known:
                if node not in self._ignored:
                    self._ignored.add(node)
                    log.warning("Ray node offers helix_node:%s, which the cluster spec lacks: start "
                                "`helix worker --node %s --gpu KIND` there to add it", node, node)
                continue
            log.warning("Ray node offering helix_node:%s appeared: starting its worker", node)
            self.launcher.spawn(node, *self._args)
            self.started.add(node)
        return [n for n in new if n in known]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)
