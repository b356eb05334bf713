"""Request schedulers: given a request, pick its pipeline (or None: wait in the queue).

All schedulers share the same walk over a :class:`~coordinator.pipeline.Topology` and the same KV
masking (:class:`~coordinator.kv_estimator.KVEstimator`), so a baseline never crashes a node's KV
cache the Helix scheduler would have protected; they differ only in how the next hop is chosen:

- ``helix``: IWRR per vertex over the max-flow arcs, weighted by their flows (Helix section 5).
- ``swarm``: per node, the next hop with the lowest running average of observed per-hop delay
  (SWARM parallelism's stochastic wiring, as the Helix paper's baseline). Unobserved hops first.
- ``random``: uniformly random next hop (seeded).
- ``shortest-queue``: the next hop with the fewest requests currently assigned to it.

Contract for drivers (simulator and live coordinator alike): call :meth:`Scheduler.schedule` for a
waiting request; a Pipeline means it is admitted and its KV is reserved; None means nothing fits now
(try again after a :meth:`Scheduler.release`). Call ``release`` when the request finishes or is
cancelled, and ``observe_hop`` with measured per-hop delays (only ``swarm`` uses them). Pure: no
clock; randomness only from the seed given.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping

from coordinator.iwrr import IWRR
from coordinator.kv_estimator import KVEstimator
from coordinator.pipeline import Pipeline, RequestInfo, Topology
from helix.errors import HelixUserError
from helix.plan import COORDINATOR, Plan

SCHEDULERS = ("helix", "swarm", "random", "shortest-queue")


class Scheduler:
    """Base: KV-masked walk over ``topology``; subclasses implement :meth:`choose`."""

    name = "base"
    uses_hop_delays = False
    """Whether the driver should report per-hop delays (``observe_hop``)."""

    def __init__(self, topology: Topology, kv: KVEstimator) -> None:
        self.topology = topology
        self.kv = kv
        self.assigned: dict[str, int] = {n: 0 for n in topology.ranges}
        """Requests currently holding a stage on each node."""
        self._pipelines: dict[int, Pipeline] = {}
        # A worker's paged cache gives a request blocks on *every* layer it holds (worker.kv_blocks),
        # even when the request enters mid-slice, so reservations count the node's whole range.
        self._layers = {n: end - start for n, (start, end) in topology.ranges.items()}

    def choose(self, vertex: str, candidates: list[str]) -> str:
        raise NotImplementedError

    def schedule(self, request: RequestInfo) -> Pipeline | None:
        """A pipeline for ``request`` with its KV reserved, or None when every path is masked."""
        return self._schedule_on(self.topology, request, self.choose)

    def _schedule_on(self, topology: Topology, request: RequestInfo,
                     choose: Callable[[str, list[str]], str]) -> Pipeline | None:
        kv, layers, tokens = self.kv, self._layers, request.kv_tokens
        pipeline = topology.walk(choose, kv.fits_request(tokens, layers))
        if pipeline is None:
            return None
        kv.reserve(request.request_id, [(s.node, tokens * layers[s.node]) for s in pipeline.stages])
        assigned = self.assigned
        for s in pipeline.stages:
            assigned[s.node] += 1
        self._pipelines[request.request_id] = pipeline
        return pipeline

    def release(self, request_id: int) -> None:
        """The request finished or was cancelled: free its KV reservation and queue slots."""
        pipeline = self._pipelines.pop(request_id, None)
        if pipeline is None:
            return
        self.kv.release(request_id)
        for s in pipeline.stages:
            self.assigned[s.node] -= 1

    def observe_hop(self, src: str, dst: str, delay_s: float) -> None:
        """A measured delay from ``src`` handing a request to ``dst`` until ``dst`` finished it."""

    @property
    def num_admitted(self) -> int:
        return len(self._pipelines)


class HelixScheduler(Scheduler):
    """IWRR at every vertex weighted by the plan's arc flows.

    With a ``fallback`` topology (every usable hop of the placement), a request whose max-flow
    paths are all masked is not held back while other paths have KV room: it takes the flow arcs
    that are still open (by IWRR) and otherwise the open hop whose node has the lowest estimated KV
    use. The max-flow solution knows nothing of KV, and its paths often cross between pipelines
    (e.g. L4 -> A100 -> L4), so one full node would otherwise idle every node behind it. Only when
    no path at all has room does the request wait.
    """

    name = "helix"

    def __init__(self, topology: Topology, kv: KVEstimator,
                 flows: Mapping[tuple[str, str], float], fallback: Topology | None = None) -> None:
        super().__init__(topology, kv)
        self.fallback = fallback
        self._iwrr: dict[str, IWRR] = {}
        for v, outs in topology.arcs.items():
            weights = {w: flows.get((v, w), 0.0) for w in outs}
            if any(x > 0 for x in weights.values()):
                self._iwrr[v] = IWRR(weights)
        if fallback is not None:
            for node, (start, end) in fallback.ranges.items():
                self.assigned.setdefault(node, 0)
                self._layers.setdefault(node, end - start)

    def choose(self, vertex: str, candidates: list[str]) -> str:
        pick = self._iwrr[vertex].pick(candidates)
        assert pick is not None, (vertex, candidates)  # candidates come from positive-flow arcs
        return pick

    def schedule(self, request: RequestInfo) -> Pipeline | None:
        pipeline = self._schedule_on(self.topology, request, self.choose)
        if pipeline is None and self.fallback is not None:
            pipeline = self._schedule_on(self.fallback, request, self._choose_fallback)
        return pipeline

    def _choose_fallback(self, vertex: str, candidates: list[str]) -> str:
        iwrr = self._iwrr.get(vertex)
        pick = iwrr.pick(candidates) if iwrr is not None else None
        if pick is not None:
            return pick
        if candidates == [COORDINATOR]:
            return COORDINATOR
        return min(candidates, key=self.kv.usage_fraction)


class RandomScheduler(Scheduler):
    name = "random"

    def __init__(self, topology: Topology, kv: KVEstimator, seed: int = 0) -> None:
        super().__init__(topology, kv)
        self._rng = random.Random(seed)

    def choose(self, vertex: str, candidates: list[str]) -> str:
        return candidates[self._rng.randrange(len(candidates))]


class ShortestQueueScheduler(Scheduler):
    name = "shortest-queue"

    def choose(self, vertex: str, candidates: list[str]) -> str:
        if candidates == [COORDINATOR]:
            return COORDINATOR
        return min(candidates, key=lambda n: self.assigned.get(n, 0))


class SwarmScheduler(Scheduler):
    """Lowest exponentially weighted running average of observed per-hop delay; ties by order."""

    name = "swarm"
    uses_hop_delays = True

    def __init__(self, topology: Topology, kv: KVEstimator, smoothing: float = 0.1) -> None:
        super().__init__(topology, kv)
        self.smoothing = smoothing
        self._delay_s: dict[tuple[str, str], float] = {}

    def choose(self, vertex: str, candidates: list[str]) -> str:
        delays = self._delay_s
        # Unobserved hops read as 0 s, so every hop is tried before averages take over.
        return min(candidates, key=lambda w: delays.get((vertex, w), 0.0))

    def observe_hop(self, src: str, dst: str, delay_s: float) -> None:
        key = (src, dst)
        old = self._delay_s.get(key)
        self._delay_s[key] = delay_s if old is None else old + self.smoothing * (delay_s - old)


def make_scheduler(name: str, plan: Plan, kv: KVEstimator, seed: int = 0,
                   connected: Callable[[str, str], bool] | None = None,
                   helix_fallback: bool = True) -> Scheduler:
    """Build scheduler ``name`` for ``plan``. Helix follows the plan's flows (falling back to other
    usable hops when its flow paths are all masked, unless ``helix_fallback`` is False); the
    baselines may use every usable hop that ``connected`` allows (placement, not flow solution)."""
    topology = Topology.from_plan(plan, connected=connected, flows_only=False)
    if name == "helix":
        flows = {(a.src, a.dst): a.flow_tokens_per_s for a in plan.arc_flows}
        return HelixScheduler(Topology.from_plan(plan, flows_only=True), kv, flows,
                              fallback=topology if helix_fallback else None)
    if name == "random":
        return RandomScheduler(topology, kv, seed=seed)
    if name == "shortest-queue":
        return ShortestQueueScheduler(topology, kv)
    if name == "swarm":
        return SwarmScheduler(topology, kv)
    raise HelixUserError(f"unknown scheduler {name!r}; known: {', '.join(SCHEDULERS)}")
