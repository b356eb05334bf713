"""When to re-plan a running cluster: the policy the simulator and the live
launcher drive with their own clocks.

A :class:`ReplanTrigger` is fed what the coordinator sees, with the time passed in:

- membership: :meth:`~ReplanTrigger.node_joined` (a node of the spec, or a new
  :class:`~helix.core.spec.NodeSpec`), :meth:`~ReplanTrigger.node_left` (gone, or drained for good);
- the workload mix: :meth:`~ReplanTrigger.observe` for every completed request (prompt and output
  tokens). The mix is the mean prompt, mean output and resident prompt (E[p x o] / E[o], the
  prompt of the requests in flight: :class:`helix.core.spec.WorkloadSpec`) of the requests completed in
  the last ``window_s`` seconds.

and :meth:`~ReplanTrigger.poll` says whether to re-plan now. It considers a re-plan

- at once after a membership change (a node that left may have held the only copy of a layer);
- when the mix has drifted: the running placement's max flow with the cost model's node
  capacities T(k) under the observed mix differs from the one under the last decision's mix by
  more than ``drift``, judged only on a window of at least ``min_requests`` requests and no sooner
  than ``min_interval_s`` after the last decision. (The largest change of one node's T(k) was
  tried first: on a geo24 simulation it passed 15 % at most polls, up to 321 %; the placement's
  max flow is the figure re-planning would change.)

Considering means: plan the cluster as it is (nodes present, observed mix) with the planner's one
verb (:func:`planner.plan`, as ``helix plan`` would), warm-started from the running placement, and also the running placement with only its idle nodes (a node that joined)
given layers (:func:`extend`: nobody else moves); :func:`planner.replan.decide` weighs each: adopt
only when the gain over ``horizon_s`` pays for the moves (weights over each node's link) by the
``hysteresis`` margin, the one with the most net gain when both do. A full re-plan of a
geo-distributed cluster often moves every node (hours of weights over slow links); the extension
is what a join can afford.
Either way the decision's mix becomes the reference, so a mix that stays put is not re-planned
again, and a mix that swings back and forth by less than ``drift`` never is (the band is the
trigger's hysteresis; the margin is the decision's: two near-equal plans never alternate).

Pure and deterministic for a given planner result: no clock, no I/O. The planner runs under a time
limit (``time_limit_s``); on a cluster it solves within its gap, that result is deterministic too.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from helix.core.errors import HelixUserError
from helix.core.plan import COORDINATOR, Plan
from helix.core.slices import as_placement
from helix.core.spec import ClusterSpec, NodeSpec, WorkloadSpec
from planner.build import build_problem
from planner.flowgraph import Placement
from planner import predicted
from planner.options import METHODS, PlanOptions
from planner.planning import plan, ready
from planner.problem import PlacementProblem
from planner.replan import HORIZON_S, HYSTERESIS, Decision, decide
from planner.search.baselines import fits

#: ``propose(spec, problem, running placement) -> Plan``: the planner's proposal for the cluster.
Propose = Callable[[ClusterSpec, PlacementProblem, Placement], Plan]


@dataclass(frozen=True)
class TriggerConfig:
    """When to consider a re-plan and how the decision weighs it."""

    drift: float = 0.15
    """Consider a re-plan when the running placement's max flow under the observed mix differs
    from the one under the last decision's mix by more than this fraction (0.15 = 15 %)."""
    window_s: float = 300.0
    """The observed mix: requests completed in the last this many seconds."""
    min_requests: int = 50
    """Fewer completed requests in the window: the mix is not judged (too noisy)."""
    min_interval_s: float = 120.0
    """Seconds between two decisions caused by drift (membership changes do not wait)."""
    horizon_s: float = HORIZON_S
    """Seconds over which a new plan must pay for its moves (:func:`planner.replan.decide`)."""
    hysteresis: float = HYSTERESIS
    """A new plan must beat the running one by this fraction after its moves' cost."""
    time_limit_s: float = 5.0
    """Planner time per re-plan (the default proposal: :attr:`method`, warm-started)."""
    threads: int = 1
    method: str = "milp"
    """The planner method of the default proposal (:func:`default_proposal`)."""

    def __post_init__(self) -> None:
        positive = ("window_s", "horizon_s", "time_limit_s")
        for name in (*positive, "drift", "min_interval_s", "hysteresis"):
            value = getattr(self, name)
            if not (value > 0 if name in positive else value >= 0):
                raise ValueError(f"{name} must be {'> 0' if name in positive else '>= 0'}, "
                                 f"got {value}")
        if self.min_requests < 1 or self.threads < 1:
            raise ValueError(f"min_requests and threads must be >= 1, got {self.min_requests}, "
                             f"{self.threads}")
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}, got {self.method!r}")

    def plan_options(self, start: Placement | None = None) -> PlanOptions:
        """What the default proposal plans with: :attr:`method`, :attr:`time_limit_s`,
        :attr:`threads`, seed 0, warm-started from ``start``."""
        return PlanOptions(method=self.method, time_limit_s=self.time_limit_s,
                           threads=self.threads, seed=0, start=start)


@dataclass(frozen=True)
class Replan:
    """One re-plan the trigger considered."""

    at_s: float
    cause: str
    """``join NODE`` / ``leave NODE`` (comma-joined when several), or ``drift 23 %``."""
    drift: float
    """Relative change of the running placement's max flow since the last decision (0: not
    judged)."""
    mix: WorkloadSpec
    """The mix it planned for."""
    decision: Decision
    plan: Plan
    """The plan to run from now: the proposal when adopted, else the running placement (both
    with serving limits and flow capacities, on :attr:`spec`)."""
    spec: ClusterSpec
    """The cluster as it is now (nodes present, the observed mix)."""
    proposal: str = "full"
    """Which proposal the decision is about: ``full`` (the planner's) or ``extend`` (the running
    placement with the idle nodes given layers, :func:`extend`)."""

    @property
    def adopted(self) -> bool:
        return self.decision.adopt

    def summary(self) -> dict:
        """Plain numbers for results and benchmarks."""
        d = self.decision
        return {"at_s": self.at_s, "cause": self.cause, "drift": self.drift, "adopt": d.adopt,
                "proposal": self.proposal,
                "moves": len(d.moves), "switch_s": d.switch_s, "gain_tokens": d.gain_tokens,
                "cost_tokens": d.cost_tokens, "current_tokens_per_s": d.current_tokens_per_s,
                "proposed_tokens_per_s": d.proposed_tokens_per_s,
                "mean_prompt_tokens": self.mix.mean_prompt_tokens,
                "mean_output_tokens": self.mix.mean_output_tokens}


def default_proposal(config: TriggerConfig) -> Propose:
    """The default proposal: the planner's one verb (:func:`planner.plan`, what ``helix plan``
    gives) with ``config``'s options (:meth:`TriggerConfig.plan_options`), warm-started from the
    running placement."""
    def propose(spec: ClusterSpec, problem: PlacementProblem, running: Placement) -> Plan:
        try:
            return plan(spec, config.plan_options(start=running or None), problem=problem)
        except HelixUserError:   # under another mix a node may keep fewer layers beside its KV
            return plan(spec, config.plan_options(), problem=problem)
    return propose


class ReplanTrigger:
    """The re-plan policy of one running cluster (module docstring). ``spec``: every node that
    may take part (the ones not in ``present`` join later); ``plan``: the running plan."""

    def __init__(self, spec: ClusterSpec, plan: Plan, config: TriggerConfig = TriggerConfig(), *,
                 present: set[str] | None = None, propose: Propose | None = None) -> None:
        self.config = config
        self._spec = spec
        self._nodes: dict[str, NodeSpec] = {n.name: n for n in spec.nodes}
        self.present: set[str] = set(self._nodes) if present is None else set(present)
        unknown = sorted(self.present - set(self._nodes))
        if unknown:
            raise ValueError(f"present names node(s) {unknown} that the spec lacks")
        self.plan = plan
        self.propose: Propose = propose or default_proposal(config)
        """The planner's proposal for the cluster as it is (default: :func:`default_proposal`)."""
        self._window: deque[tuple[float, int, int]] = deque()
        self._pending: list[str] = []
        self.mix: WorkloadSpec = spec.workload
        """The mix of the last decision (the reference drift is measured from)."""
        self._last_s: float | None = None
        self._reference = self._capacity(self.mix)
        self.history: list[Replan] = []

    # --- what the coordinator sees ---------------------------------------------------------------
    def observe(self, now_s: float, prompt_tokens: int, output_tokens: int) -> None:
        """A request completed at ``now_s`` after ``prompt_tokens`` in and ``output_tokens`` out."""
        self._window.append((now_s, int(prompt_tokens), int(output_tokens)))

    def node_joined(self, now_s: float, node: str | NodeSpec) -> None:
        """``node`` (a name of the spec, or a new node with its GPU kind and region) takes part."""
        if isinstance(node, NodeSpec):
            self._nodes[node.name] = node
            node = node.name
        if node not in self._nodes:
            raise ValueError(f"node {node!r} joined but the spec lacks it; pass its NodeSpec")
        if node not in self.present:
            self.present.add(node)
            self._pending.append(f"join {node}")

    def node_left(self, now_s: float, node: str) -> None:
        """``node`` is gone (or drained for good): it takes no part in the next plan."""
        if node in self.present:
            self.present.discard(node)
            self._pending.append(f"leave {node}")

    # --- the decision ------------------------------------------------------------------------------
    def observed_mix(self, now_s: float) -> WorkloadSpec | None:
        """The mix of the requests completed in the window ending at ``now_s`` (None: too few)."""
        window = self._window
        while window and window[0][0] < now_s - self.config.window_s:
            window.popleft()
        if len(window) < self.config.min_requests:
            return None
        n = len(window)
        prompt = sum(p for _, p, _ in window) / n
        output = sum(o for _, _, o in window) / n
        resident = sum(p * o for _, p, o in window) / max(1, sum(o for _, _, o in window))
        return WorkloadSpec(mean_prompt_tokens=max(1.0, prompt), mean_output_tokens=max(1.0, output),
                            resident_prompt_tokens=max(1.0, resident))

    def drift(self, mix: WorkloadSpec) -> float:
        """Relative change of the running placement's max flow under ``mix`` against the last
        decision's (0 when that was 0: a membership change re-plans such a cluster)."""
        ref = self._reference
        return abs(self._capacity(mix) / ref - 1.0) if ref > 0 else 0.0

    def due(self, now_s: float) -> tuple[str, float, WorkloadSpec] | None:
        """``(cause, drift, mix)`` when a re-plan should be considered now, else None."""
        mix = self.observed_mix(now_s)
        drift = 0.0 if mix is None else self.drift(mix)
        if self._pending:
            return ", ".join(self._pending), drift, mix or self.mix
        if mix is None or drift <= self.config.drift:
            return None
        if self._last_s is not None and now_s - self._last_s < self.config.min_interval_s:
            return None
        return f"drift {drift:.0%}", drift, mix

    def poll(self, now_s: float) -> Replan | None:
        """Re-plan now if :meth:`due`: plan, decide, and on adoption make the proposal the running
        plan. Returns what was considered (adopted or not), or None."""
        due = self.due(now_s)
        if due is None:
            return None
        cause, drift, mix = due
        spec = self.cluster(mix)
        problem = build_problem(spec)
        running = self._running()
        dropped = tuple(sorted(p.node for p in self.plan.placements
                               if p.end > p.start and p.node not in self.present))
        unfit = sorted(n for n, (s, e) in running.items()
                       if not fits(problem.node(n), s, e, problem.num_layers))
        if unfit:
            # Under this mix the cost model leaves these nodes too little KV room for the layers
            # they hold (the planner refuses such a placement): the running placement is judged
            # without them, and a proposal that gives them layers counts them as loading anew.
            running = {n: r for n, r in running.items() if n not in unfit}
            cause += f" ({', '.join(unfit)}: too little KV room for their layers under this mix)"
        # Every candidate is judged ready to serve, as the verb's proposal is: at the step budget
        # it would run with (chosen by the prediction under ``chunk_tokens: auto``).
        current = ready(spec, predicted.evaluate(spec, running, problem=problem, source="running"),
                        problem)
        try:
            proposals = [self.propose(spec, problem, running)]
        except HelixUserError:   # e.g. under this mix no placement fits: keep what runs
            proposals = [current]
        extended = extend(problem, running)
        if extended != running:   # the cheap alternative: only the idle nodes get layers
            proposals.append(ready(spec, predicted.evaluate(spec, extended, problem=problem,
                                                            source="extend"), problem))
        decisions = [decide(spec, problem, current, p, horizon_s=self.config.horizon_s,
                            hysteresis=self.config.hysteresis, dropped_nodes=dropped)
                     for p in proposals]
        # The adopted proposal with the most net gain; with none, the full re-plan's verdict.
        def net(i: int) -> tuple:
            d = decisions[i]
            return (d.adopt, d.gain_tokens - d.cost_tokens if d.adopt else 0.0, -i)
        best = max(range(len(proposals)), key=net)
        decision, chosen = decisions[best], proposals[best]
        plan = chosen if decision.adopt else self.plan if unfit else current
        self.plan = plan
        self.mix, self._last_s, self._pending = mix, now_s, []
        self._reference = self._capacity(mix, problem)   # the same nodes and mix
        replan = Replan(now_s, cause, drift, mix, decision, plan, spec,
                        "full" if best == 0 else "extend")
        self.history.append(replan)
        return replan

    # --- helpers -----------------------------------------------------------------------------------
    def cluster(self, mix: WorkloadSpec | None = None) -> ClusterSpec:
        """The spec of the cluster as it is: the nodes present, with ``mix`` (default: the last
        decision's) as its workload."""
        nodes = [self._nodes[n] for n in self._nodes if n in self.present]
        if not nodes:
            raise ValueError("no node is present: nothing to plan")
        return respec(self._spec, nodes, mix or self.mix)

    def _running(self) -> Placement:
        """The running plan's ranges on the nodes present."""
        return as_placement((p for p in self.plan.placements if p.node in self.present),
                            skip_empty=True)

    def _capacity(self, mix: WorkloadSpec, problem: PlacementProblem | None = None) -> float:
        """The max flow (tokens/s) of the running placement, on the nodes present, with the cost
        model's T(k) under ``mix`` (``problem``: that cluster's, when already built)."""
        from planner import max_flow
        problem = problem or build_problem(self.cluster(mix))
        running = self._running()
        return max_flow(problem, running).value_tokens_per_s if running else 0.0


def extend(problem: PlacementProblem, running: Placement, partial: bool = True) -> Placement:
    """``running`` with every node of ``problem`` that holds no layers given, one at a time, the
    range (as many layers as it can hold) that raises the max flow most; nobody else moves, so
    the only moves are loads beside nothing. Unchanged when no range helps."""
    from planner import max_flow
    placement = dict(running)
    L = problem.num_layers
    for node in problem.nodes:
        if node.name in placement or node.max_layers_for(True, True) < 1 and node.max_layers < 1:
            continue
        best, best_flow = None, max_flow(problem, placement, partial).value_tokens_per_s
        for start in range(L):
            k = node.max_layers_for(start == 0, False)
            if start + k >= L:
                k = node.max_layers_for(start == 0, True)
                if start + k < L:
                    continue
            end = min(L, start + k)
            if end <= start:
                continue
            flow = max_flow(problem, {**placement, node.name: (start, end)}, partial).value_tokens_per_s
            if flow > best_flow * (1 + 1e-9):
                best, best_flow = (start, end), flow
        if best is not None:
            placement[node.name] = best
    return placement


def respec(spec: ClusterSpec, nodes: list[NodeSpec], mix: WorkloadSpec) -> ClusterSpec:
    """``spec`` with only ``nodes`` (those of the spec, and new ones) and ``mix`` as its workload,
    validated again; link overrides naming other nodes are left out."""
    if list(spec.nodes) == nodes and spec.workload == mix:
        return spec
    from helix.core.spec import parse_cluster
    data = spec.to_dict()
    data["nodes"] = [n.model_dump(by_alias=True, exclude_none=True, mode="json") for n in nodes]
    names = {n.name for n in nodes}
    data["links"] = [link for link in data.get("links", ())   # overrides of nodes that are here
                     if set(link.get("between") or (link.get("from"), link.get("to")))
                     <= names | {COORDINATOR}]
    data["workload"] = mix.model_dump(exclude_none=True, mode="json")
    return parse_cluster(data, source="re-planned cluster", base_dir=spec._base_dir)

