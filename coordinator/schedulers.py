"""Request schedulers: given a request, pick its pipeline (or None: wait in the queue).

All schedulers share the same walk over a :class:`~coordinator.pipeline.Topology` and the same KV
masking (:class:`~coordinator.kv_estimator.KVEstimator`), so a baseline never crashes a node's KV
cache the Helix scheduler would have protected; they differ only in how the next hop is chosen:

- ``helix``: IWRR per vertex over the max-flow arcs, weighted by their flows (Helix section 5).
- ``swarm``: per node, an interleaved weighted round robin over the next hops, each picked in
  inverse proportion to its running average of observed delay (SWARM parallelism's stochastic
  wiring, as the Helix artifact's simulator runs its Swarm baseline).
- ``random``: uniformly random next hop (seeded).
- ``shortest-queue``: the next hop with the fewest requests currently assigned to it.

Contract for drivers (simulator and live coordinator alike): call :meth:`Scheduler.schedule` for a
waiting request; a Pipeline means it is admitted and its KV is reserved; None means nothing fits now
(try again after a :meth:`Scheduler.release`). Call ``release`` when the request finishes or is
cancelled, and ``observe_hop`` with measured per-hop delays (only ``swarm`` uses them). Pure: no
clock; randomness only from the seed given.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping

from coordinator.iwrr import IWRR
from coordinator.kv_estimator import FitMask, KVEstimator
from coordinator.pipeline import Pick, Pipeline, RequestInfo, Topology
from helix.core.errors import HelixUserError
from helix.core.plan import COORDINATOR, Plan

SCHEDULERS = ("helix", "swarm", "random", "shortest-queue")

_AMOUNTS_CACHE_SIZE = 4096
"""(pipeline, request size) pairs whose KV reservations a scheduler keeps ready."""


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
        self._fit_masks: dict[Topology, FitMask] = {}
        self._amounts: dict[tuple, tuple[Pipeline, tuple[tuple[str, int], ...]]] = {}
        self._only_masks: dict[tuple[int, frozenset[str]], int] = {}   # node sets as bitmasks
        self._picks = self._picks_on(topology)

    def choose(self, vertex: str, candidates: list[str]) -> str:
        raise NotImplementedError

    def __deepcopy__(self, memo: dict) -> Scheduler:
        # The pick tables close over this instance's IWRR credits and methods: a deep copy would
        # share them with the original without saying so.
        raise TypeError(f"{type(self).__name__} cannot be deep-copied; build a new scheduler")

    def schedule(self, request: RequestInfo, only: frozenset[str] | None = None) -> Pipeline | None:
        """A pipeline for ``request`` with its KV reserved, or None when every path is masked.
        ``only``: every stage must be one of these nodes (those holding the request's task,
        :class:`~coordinator.task_placement.TaskPlacement`); None: any node."""
        return self._schedule_on(self.topology, request, self._picks, only)

    def _picks_on(self, topology: Topology) -> list[Pick]:
        """How to choose at each vertex of ``topology`` (:meth:`Topology.walk_mask`)."""
        return topology.picks(self.choose)

    def _schedule_on(self, topology: Topology, request: RequestInfo, picks: list[Pick],
                     only: frozenset[str] | None = None) -> Pipeline | None:
        tokens = request.kv_tokens
        fit = self._fit_masks.get(topology)   # by identity: hashing the node tuple costs more
        if fit is None:   # one per node order; topologies of one plan share it
            fit = next((f for t, f in self._fit_masks.items() if t.nodes == topology.nodes), None) \
                or FitMask(self.kv, topology.nodes, self._layers)
            self._fit_masks[topology] = fit
        allowed = fit.allowed(tokens)
        if only is not None:
            allowed &= self._only_mask(topology, only)
        pipeline = topology.walk_mask(picks, allowed)
        if pipeline is None:
            return None
        # Topologies hand out one Pipeline object per path, so the amounts repeat. The entry holds
        # the pipeline, which keeps its id from being reused while the entry exists.
        key = (id(pipeline), tokens, tokens.__class__)
        entry = self._amounts.get(key)
        if entry is None:
            if len(self._amounts) >= _AMOUNTS_CACHE_SIZE:
                self._amounts.clear()
            layers = self._layers
            entry = self._amounts[key] = \
                (pipeline, tuple((n, tokens * layers[n]) for n in pipeline.nodes))
        self.kv.reserve(request.request_id, entry[1])
        assigned = self.assigned
        for n in pipeline.nodes:
            assigned[n] += 1
        self._pipelines[request.request_id] = pipeline
        return pipeline

    def _only_mask(self, topology: Topology, only: frozenset[str]) -> int:
        key = (id(topology), only)
        mask = self._only_masks.get(key)
        if mask is None:
            if len(self._only_masks) >= _AMOUNTS_CACHE_SIZE:
                self._only_masks.clear()
            mask = self._only_masks[key] = topology.mask_of(n for n in only if n in topology.index)
        return mask

    def release(self, request_id: int) -> None:
        """The request finished or was cancelled: free its KV reservation and queue slots."""
        pipeline = self._pipelines.pop(request_id, None)
        if pipeline is None:
            return
        self.kv.release(request_id)
        assigned = self.assigned
        for n in pipeline.nodes:
            assigned[n] -= 1

    def take_over(self, old: "Scheduler") -> None:
        """Adopt ``old``'s requests in flight (a scheduler rebuilt on new flows, same KV estimator):
        their pipelines and per-node counts, so releasing them frees what they reserved."""
        self._pipelines.update(old._pipelines)
        for node, n in old.assigned.items():
            self.assigned[node] = n

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
        self._iwrr: dict[str, IWRR] = {}
        for v, outs in topology.arcs.items():
            weights = {w: flows.get((v, w), 0.0) for w in outs}
            if any(x > 0 for x in weights.values()):
                self._iwrr[v] = IWRR(weights)
        super().__init__(topology, kv)
        self.fallback = fallback
        if fallback is not None:
            for node, (start, end) in fallback.ranges.items():
                self.assigned.setdefault(node, 0)
                self._layers.setdefault(node, end - start)
            self._fallback_picks = self._iwrr_picks(fallback, self._choose_by_kv)

    def _picks_on(self, topology: Topology) -> list[Pick]:
        return self._iwrr_picks(topology, None)

    def _iwrr_picks(self, topology: Topology, otherwise: Callable[[str, list[str]], str] | None
                    ) -> list[Pick]:
        """Per vertex of ``topology``: pick by the vertex's IWRR, and where it allows none of the
        candidates, by ``otherwise`` (None: the flow topology, where that cannot happen)."""
        return [self._iwrr_pick(topology, v, otherwise) for v in range(len(topology.vertices))]

    def _iwrr_pick(self, topology: Topology, v: int,
                   otherwise: Callable[[str, list[str]], str] | None) -> Pick:
        name, index, nexts = topology.vertices[v], topology.index, topology.next_mask(v)
        iwrr = self._iwrr.get(name)
        # A choice that is no vertex of this topology gets bit 0 (never a candidate).
        bits = [] if iwrr is None else [1 << index[w] if w in index else 0 for w in iwrr.choices]
        covered = sum(bits) & nexts == nexts   # some choice is always allowed: never `otherwise`
        # The only hop, and taking it changes no state: a lone IWRR choice's credit stays 0.0
        # (0.0 + w - w for finite w), and `otherwise` has nothing to compare.
        stateless = otherwise is not None if iwrr is None else \
            covered and len(bits) == 1 and math.isfinite(iwrr.weight(iwrr.choices[0]))
        if nexts.bit_count() == 1 and stateless:
            return nexts.bit_length() - 1
        pick = None if iwrr is None else iwrr.picker(bits, [index.get(w, -1) for w in iwrr.choices])
        if covered:
            return pick

        def pick_or_else(mask: int) -> int:
            nxt = None if pick is None else pick(mask)
            if nxt is not None:
                return nxt
            assert otherwise is not None, (name, topology.candidates(v, mask))  # flows cover arcs
            return index[otherwise(name, topology.candidates(v, mask))]
        return pick_or_else

    def schedule(self, request: RequestInfo, only: frozenset[str] | None = None) -> Pipeline | None:
        pipeline = self._schedule_on(self.topology, request, self._picks, only)
        if pipeline is None and self.fallback is not None:
            pipeline = self._schedule_on(self.fallback, request, self._fallback_picks, only)
        return pipeline

    def _choose_by_kv(self, vertex: str, candidates: list[str]) -> str:
        """Fallback hop where the vertex's IWRR allows no candidate: the least used node."""
        if candidates == [COORDINATOR]:
            return COORDINATOR
        return self.kv.least_used(candidates)


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
    """SWARM parallelism's stochastic wiring as the Helix artifact's simulator runs it (its
    ``SwarmScheduler``, after SWARM's appendix C): at every vertex an interleaved weighted round
    robin over the next hops. Each hop carries a priority that grows by the hop's running average
    of observed delay every time it is picked, and the hop with the lowest priority goes next, so
    hops are picked in inverse proportion to their delay. Averages start at ``initial_s`` and move
    by ``smoothing`` x (new - old) per observation; the driver reports a request's delay on a hop
    once, on its first pass (the prompt), as the artifact does. Ties go to the first candidate."""

    name = "swarm"
    uses_hop_delays = True

    def __init__(self, topology: Topology, kv: KVEstimator, smoothing: float = 0.8,
                 initial_s: float = 0.05) -> None:
        super().__init__(topology, kv)
        self.smoothing = smoothing
        self.initial_s = initial_s
        self._delay_s: dict[tuple[str, str], float] = {}
        self._priority: dict[tuple[str, str], float] = {}

    def choose(self, vertex: str, candidates: list[str]) -> str:
        priority = self._priority
        initial = self.initial_s
        w = min(candidates, key=lambda c: priority.get((vertex, c), initial))
        key = (vertex, w)
        priority[key] = priority.get(key, initial) + self._delay_s.get(key, initial)
        return w

    def observe_hop(self, src: str, dst: str, delay_s: float) -> None:
        key = (src, dst)
        old = self._delay_s.get(key, self.initial_s)
        self._delay_s[key] = old + self.smoothing * (delay_s - old)


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
