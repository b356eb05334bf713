"""Re-planning during a simulation: the live system's policy object,
:class:`planner.trigger.ReplanTrigger`, driven by the simulated clock.

With ``SimConfig.replan`` (``helix simulate --replan``) the simulator tells the trigger what the
coordinator sees: every completed request (prompt and output tokens), nodes that join (``--join``:
a node of the spec, holding layers in the plan or not) and nodes drained for good (``--drain``);
it polls the trigger every ``poll_s`` simulated seconds and at once after each join or drain. A
re-plan the trigger adopts is applied as ``helix serve`` would, drain-first:

- a node whose layers change and whose memory cannot hold both slices (``Move.beside`` false), or
  that loses all its layers, stops taking requests at once (drained: its requests finish where they
  run), then loads its new layers; a node that can hold both keeps serving its old slice while it
  loads; a node that joins loads at once. Loading takes ``Move.load_s``: its new weights' bytes
  over its link from the coordinator (:func:`planner.replan.moves`);
- meanwhile requests are routed on the old plan's max flow over the nodes that take requests (as
  for a drain, :mod:`helix.sim.elastic`);
- the switch: when every moved node has loaded, the new plan's workers, KV pools and flows take
  over. Requests in flight finish on the pipeline they started on (a node that loaded beside runs
  them on its old slice; the two slices do not contend for its GPU here: an optimism).

While a re-plan is being applied the trigger is not polled (joins and leaves wait for the switch).
Each re-plan the trigger considered is in ``SimResult.replans``: when, why, adopted or not, moves,
the predicted switch / gain / cost, when the switch happened and the node-seconds of service lost
(nodes stopped x seconds until the switch; per stopped node when it stopped, was empty and its load
seconds); the timeline marks each adopted re-plan and its
switch (``SimResult.phases``). The trigger plans with the MILP under a time limit: on a cluster it
solves within its gap the run is deterministic.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from helix.core.plan import Plan
from helix.sim.events import NO_EVENTS, Event, LayersLoaded, NodeAppears, ReplanPoll
from helix.sim.worker import SimWorker
from helix.core.spec import ClusterSpec
from planner.trigger import Replan, ReplanTrigger, TriggerConfig

#: Makes the simulated workers of a plan (``helix.sim.build`` binds its config and cost model).
WorkerBuilder = Callable[[ClusterSpec, Plan], dict[str, SimWorker]]


@dataclass(frozen=True)
class ReplanConfig:
    """Re-planning in a simulation (``helix simulate --replan``)."""

    trigger: TriggerConfig = field(default_factory=TriggerConfig)
    """When to re-plan and how the decision weighs it (band, margin, window, horizon...)."""
    poll_s: float = 60.0
    """Simulated seconds between two looks at the workload's drift."""

    def __post_init__(self) -> None:
        if not self.poll_s > 0:
            raise ValueError(f"poll_s must be > 0, got {self.poll_s}")


@dataclass
class _Switch:
    """An adopted re-plan being applied."""

    number: int
    replan: Replan
    waiting: dict[str, float]
    """Moved nodes not loaded yet -> their load seconds."""
    stopped: dict[str, float]
    """Nodes that stopped serving -> since when."""


class ReplanHandlers:
    """The simulator's re-planning (a mixin of ``Simulator``, through ``ElasticHandlers``)."""

    def _init_replan(self) -> None:
        self.trigger: ReplanTrigger | None = None
        self.replans: list[dict] = []
        """What each re-plan considered (:meth:`planner.trigger.Replan.summary` plus the switch)."""
        self._switch: _Switch | None = None

    def enable_replan(self, trigger: ReplanTrigger, build_workers: WorkerBuilder) -> None:
        """Drive ``trigger`` (``build_simulator`` makes it from the spec and the plan);
        ``build_workers`` makes the simulated workers of a new plan."""
        self.trigger = trigger
        self._build_workers = build_workers
        self.handlers.update({ReplanPoll: self.on_replan_poll, NodeAppears: self.on_node_appears,
                              LayersLoaded: self.on_layers_loaded})

    def _replan_events(self) -> list[Event]:
        """The first poll and the joins of nodes that hold no layers yet."""
        if self.trigger is None:
            return []
        first = [ReplanPoll(self.config.replan.poll_s)]
        return first + [NodeAppears(j.at_s, j.node) for j in self.config.joins
                        if j.node not in self.workers]

    # --- what the trigger is told ------------------------------------------------------------------
    def replan_observe(self, now_s: float, request) -> None:
        """A request completed (the engine calls this from its finish handler)."""
        if self.trigger is not None:
            self.trigger.observe(now_s, request.prompt_tokens, request.output_tokens)

    def _membership(self, now_s: float, node: str, joined: bool) -> list[Event]:
        if self.trigger is None:
            return []
        if joined:
            self.trigger.node_joined(now_s, node)
        else:
            self.trigger.node_left(now_s, node)
        return [ReplanPoll(now_s, recurring=False)]

    def on_node_appears(self, ev: NodeAppears) -> Iterable[Event]:
        self._mark(ev.time_s, f"join {ev.node}")
        return self._membership(ev.time_s, ev.node, joined=True)

    # --- polls and the switch ----------------------------------------------------------------------
    def on_replan_poll(self, ev: ReplanPoll) -> Iterable[Event]:
        now_s = ev.time_s
        out: list[Event] = []
        if ev.recurring and self.metrics.requests_completed + self.rejected < len(self.workload):
            out.append(ReplanPoll(now_s + self.config.replan.poll_s))
        if self._switch is not None:
            return out   # polled again after the switch
        replan = self.trigger.poll(now_s)
        if replan is None:
            return out
        number = len(self.replans) + 1
        record = {"number": number, **replan.summary(), "switched_s": None, "stopped_node_s": 0.0,
                  "moved_nodes": [m.node for m in replan.decision.moves], "stopped_nodes": {}}
        self.replans.append(record)
        if replan.adopted:
            out.extend(self._begin(now_s, number, replan))
        return out

    def _begin(self, now_s: float, number: int, replan: Replan) -> list[Event]:
        """Stop what must stop, start the loads (module docstring)."""
        moves = replan.decision.moves
        self._mark(now_s, f"re-plan {number}: {len(moves)} node(s) move")
        switch = self._switch = _Switch(number, replan, {m.node: m.load_s for m in moves}, {})
        out: list[Event] = []
        for m in moves:
            if m.old is None or (m.beside and m.new is not None):
                out.append(LayersLoaded(now_s + m.load_s, m.node, number))
                continue
            switch.stopped[m.node] = now_s
            self.draining.add(m.node)   # no new requests; loads once its requests are done
            self.absent.add(m.node)     # back at the switch: requests wait for it, not refused
            self.drained_s.pop(m.node, None)
            self._mask(m.node)
        self._reflow()
        self.note_drained(now_s)
        if not moves:
            out.extend(self._finish(now_s))
        return out

    def replan_node_empty(self, now_s: float, node: str) -> None:
        """A stopped node has no request left: it starts loading (``note_drained`` calls this)."""
        switch = self._switch
        if switch is not None and node in switch.stopped and node in switch.waiting:
            self.push(LayersLoaded(now_s + switch.waiting[node], node, switch.number))
            self.replans[switch.number - 1]["stopped_nodes"][node] = {
                "stopped_s": switch.stopped[node], "empty_s": now_s, "load_s": switch.waiting[node]}

    def on_layers_loaded(self, ev: LayersLoaded) -> Iterable[Event]:
        switch = self._switch
        if switch is None or ev.number != switch.number:
            return NO_EVENTS
        switch.waiting.pop(ev.node, None)
        return NO_EVENTS if switch.waiting else self._finish(ev.time_s)

    def _finish(self, now_s: float) -> list[Event]:
        """Every moved node has loaded: the new plan's workers, KV pools and flows take over."""
        switch, self._switch = self._switch, None
        replan = switch.replan
        plan, spec = replan.plan, replan.spec
        fresh = self._build_workers(spec, plan)
        changed = {m.node for m in replan.decision.moves}
        kv = self.scheduler.kv
        sizes = {}
        for name in changed:
            w = fresh.get(name)
            old = self.workers.get(name)
            if w is None:
                continue   # holds no layers now: it stays drained
            if old is not None:   # its numbers go on (the old object runs its requests in flight)
                w.busy_s, w.num_steps, w.routed = old.busy_s, old.num_steps, old.routed
                w.first_routed_s, w.last_routed_s = old.first_routed_s, old.last_routed_s
            self.workers[name] = w
            sizes[name] = w.kv_capacity_tokens * (w.end - w.start)
            self.draining.discard(name)
            self.drained_s.pop(name, None)
            self.absent.discard(name)
        self.absent -= set(switch.stopped)
        kv.resize(sizes)
        for name in sizes:
            kv.observe(name, 0.0)   # unmasked; its reservations in flight still count
        self._flow_plan, self._flows = plan, None
        self._reflow()
        record = self.replans[switch.number - 1]
        record["switched_s"] = now_s
        record["stopped_node_s"] = sum(now_s - t for t in switch.stopped.values())
        self._mark(now_s, f"switch to re-plan {switch.number}")
        # Joins or leaves that came meanwhile are considered now.
        return [*self._kick_coordinator(now_s), ReplanPoll(now_s, recurring=False)]
