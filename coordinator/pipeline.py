"""Per-request pipelines: the stages a request visits, and the topology they are drawn from.

A :class:`Pipeline` is a source-to-sink path through a placement: stage ``i`` runs layers
``[start, end)`` on one node. Consecutive stages are contiguous (``stages[i].end ==
stages[i+1].start``), the first starts at layer 0 and the last ends at the model's last layer. Where
two nodes' ranges overlap, the next stage starts where the previous one stopped and runs only the
layers it lacks (*partial inference*, Helix section 5); so a stage may start inside its node's range.

:class:`Topology` is the graph the pipeline builders walk: vertices are node names plus
:data:`COORDINATOR`, arcs are the hops a request may take. Because a stage always runs to its node's
``end``, whether a node can still reach the sink does not depend on where the request entered it,
so "which nodes can finish the request under the current mask?" is a function of the mask alone.
The decision path runs on bitmasks (node ``i`` of :attr:`Topology.nodes` is bit ``1 << i``): the KV
mask comes in as an int (:class:`~coordinator.kv_estimator.FitMask`), the finishing set is cached
by mask and otherwise updated from the last one (:meth:`Topology.finishing_mask`), and a walk step
is an ``and`` of two ints plus the scheduler's pick.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from helix.core.pipelines import hop_usable
from helix.core.plan import COORDINATOR, Plan
from helix.core.slices import LayerSlice, Placement, as_placement

Pick = Callable[[int], int] | int
"""What a walk does at one vertex (:meth:`Topology.walk_mask`)."""

_FINISHING_CACHE_SIZE = 256
"""Allowed masks whose finishing sets a topology remembers (a few KiB)."""

_PATH_CACHE_SIZE = 4096
"""Pipelines a topology keeps to hand out again for the same path (a few MiB at most)."""


@dataclass(frozen=True)
class Pipeline:
    """The stages of one request, in order, covering layers ``[0, num_layers)`` exactly once."""

    stages: tuple[LayerSlice, ...]
    """Stage ``i`` runs layers ``[start, end)`` of the request on its node."""

    @cached_property   # Topology.walk_mask hands out one Pipeline object per path, reused
    def nodes(self) -> tuple[str, ...]:
        return tuple(s.node for s in self.stages)

    def check(self, num_layers: int) -> None:
        """AssertionError unless the stages cover every layer exactly once, in order."""
        assert self.stages, "empty pipeline"
        assert self.stages[0].start == 0, self.stages
        assert self.stages[-1].end == num_layers, self.stages
        for a, b in zip(self.stages, self.stages[1:]):
            assert a.end == b.start and b.start < b.end, self.stages


@dataclass(frozen=True)
class RequestInfo:
    """What a scheduler knows about a request when it picks a pipeline."""

    request_id: int
    prompt_tokens: int
    expected_output_tokens: int
    """Output length to reserve KV for (workload mean, or ``max_tokens`` when smaller)."""

    @property
    def kv_tokens(self) -> int:
        return self.prompt_tokens + self.expected_output_tokens


class Topology:
    """Layer ranges of every node and the arcs a request may follow between vertices.

    ``arcs[v]`` lists the vertices a request may go to after ``v`` (in a fixed order). An arc
    ``u -> w`` between nodes is usable when ``w`` holds layer ``u.end`` (``w.start <= u.end < w.end``;
    with ``partial_inference`` off, ``w.start == u.end``) and ``w`` does not hold layer 0; the
    coordinator feeds nodes starting at layer 0 and collects from nodes ending at the last layer.

    A node holding layer 0 is only ever a *first* stage: it embeds token ids, and the worker engine
    cannot enter such a slice in the middle (``worker.engine``). The rule lives here so that the
    simulator's schedulers and the live coordinator build the same pipelines.

    Threads: no lock, by construction. The graph is fixed at construction, and what a topology
    caches (finishing sets by mask, one Pipeline per path) is a pure function of the key it is
    stored under: a racing writer stores the same answer, the last finishing answer is one
    ``(mask, answer)`` tuple replaced whole (no reader pairs one call's mask with another's
    answer), and cache eviction tolerates a concurrent one. So several schedulers and threads may
    share a topology without a lock. Chosen over a lock because the scheduler asks once per
    decision (the hot path) while the other walkers (the live coordinator's health checks, on HTTP
    threads) are rare, and with no lock they neither slow the decisions nor wait for them.
    """

    def __init__(self, num_layers: int, ranges: Placement,
                 arcs: Mapping[str, Iterable[str]], partial_inference: bool = True) -> None:
        self.num_layers = num_layers
        self.ranges = dict(ranges)
        self.partial_inference = partial_inference
        self.arcs: dict[str, tuple[str, ...]] = {
            v: tuple(w for w in ws if self.usable(v, w)) for v, ws in arcs.items()}
        self.arcs.setdefault(COORDINATOR, ())
        for node in self.ranges:
            self.arcs.setdefault(node, ())
        # Nodes by decreasing end: every usable arc u -> w has w.end > u.end, so w comes first.
        self.nodes_by_end_desc = tuple(sorted(self.ranges, key=lambda n: -self.ranges[n][1]))
        # Integer view for the decision path: node i is bit 1 << i, the coordinator (source and
        # sink) is vertex len(nodes), bit 1 << len(nodes).
        self.nodes: tuple[str, ...] = tuple(self.ranges)
        """Node ``i`` is vertex number ``i`` and bit ``1 << i`` of the decision path's masks."""
        self.vertices: tuple[str, ...] = (*self.nodes, COORDINATOR)
        """Names by vertex number: the nodes, then the coordinator (number ``len(nodes)``)."""
        self.index: dict[str, int] = {v: i for i, v in enumerate(self.vertices)}
        """Vertex numbers by name."""
        index = self.index
        self._source = source = index[COORDINATOR]

        def mask(vertices: Iterable[str]) -> int:
            return sum(1 << index[w] for w in set(vertices))
        out = [self.arcs[v] for v in self.vertices]
        self._next_mask = [mask(w for w in ws if w != COORDINATOR) for ws in out]
        self._next_bits = [tuple((w, 1 << index[w]) for w in ws if w != COORDINATOR) for ws in out]
        self._is_last = [COORDINATOR in ws for ws in out]
        self._finish_steps = tuple((1 << index[v], mask(self.arcs[v])) for v in self.nodes_by_end_desc)
        self._outs = [mask(ws) for ws in out]   # out-arcs, the coordinator's bit standing for the sink
        self._preds = [mask(u for u in self.nodes if v in self.arcs[u]) for v in self.nodes]
        self._sink = 1 << source
        # finishing_mask's answers by allowed mask (oldest first), and the last one asked for as
        # one (allowed, finishing) pair: a single attribute, so that a thread reading it while
        # another writes (the live coordinator's health checks walk the scheduler's topology
        # from other threads) never pairs one call's mask with another's answer.
        self._finishing: dict[int, int] = {0: 0}
        self._last = (0, 0)
        # walk_mask's pipelines by path code (see there).
        self._paths: dict[int, Pipeline] = {}

    def usable(self, src: str, dst: str) -> bool:
        """Whether a request may hop ``src -> dst`` given the layer ranges (the rule lives in
        :func:`helix.core.pipelines.hop_usable`, which the planner's prediction shares; a layer-0 node
        is a first stage only, see the class docstring)."""
        return hop_usable(self.ranges, self.num_layers, self.partial_inference, src, dst)

    @classmethod
    def from_plan(cls, plan: Plan, connected: Callable[[str, str], bool] | None = None,
                  flows_only: bool = True) -> "Topology":
        """Arcs of the plan's max-flow solution with positive flow (``flows_only``), or every usable
        pair of vertices that ``connected`` allows (all pairs when None)."""
        ranges = as_placement(plan.placements)
        vertices = [COORDINATOR, *ranges]
        arcs: dict[str, list[str]] = {v: [] for v in vertices}
        if flows_only:
            for a in plan.arc_flows:
                if a.flow_tokens_per_s > 0 and a.src in arcs and a.dst not in arcs[a.src]:
                    arcs[a.src].append(a.dst)
        else:
            for u in vertices:
                for w in vertices:
                    if u != w and (connected is None or connected(u, w)):
                        arcs[u].append(w)
        return cls(plan.num_layers, ranges, arcs, partial_inference=plan.partial_inference)

    def stage(self, src: str, dst: str) -> LayerSlice:
        """The stage run on ``dst`` when a request arrives from ``src``."""
        at_layer = 0 if src == COORDINATOR else self.ranges[src][1]
        return LayerSlice(dst, at_layer, self.ranges[dst][1])

    def mask_of(self, nodes: Iterable[str]) -> int:
        """The bitmask of ``nodes`` (bit ``1 << i`` for ``self.nodes[i]``)."""
        index = self.index
        return sum(1 << index[n] for n in set(nodes))

    def finishing_mask(self, allowed: int) -> int:
        """Bitmask of the nodes from which some path of ``allowed`` nodes reaches the sink
        (``allowed`` included).

        A pure function of ``allowed``, cached (so topologies may be shared). Near saturation the
        masks repeat (a node fills, a request finishes, it opens again), so most answers come from
        the cache; the others are derived from the previous answer, since a decision changes the KV
        room of a few nodes and fewer still cross a mask boundary: only the nodes whose ``allowed``
        bit flipped and the ancestors whose answer changes with them are looked at."""
        last_allowed, last_finishing = self._last
        if allowed == last_allowed:
            return last_finishing
        ok = self._finishing.get(allowed)
        if ok is None:
            flips = allowed ^ last_allowed
            sink = self._sink
            if flips.bit_count() > 8:   # e.g. a new request size: one pass is cheaper
                ok = sink
                for bit, outs in self._finish_steps:   # successors first (nodes_by_end_desc)
                    if allowed & bit and ok & outs:
                        ok |= bit
            else:
                ok = last_finishing | sink
                ok = self._add(self._remove(ok, flips & ~allowed & ok), allowed, flips & allowed)
            ok ^= sink
            memo = self._finishing
            if len(memo) >= _FINISHING_CACHE_SIZE:
                try:
                    del memo[next(iter(memo))]
                except (RuntimeError, StopIteration, KeyError):   # another thread got there first
                    pass
            memo[allowed] = ok
        self._last = (allowed, ok)
        return ok

    def _remove(self, ok: int, lost: int) -> int:
        """``ok`` without the nodes ``lost`` and the ancestors left without a finishing next hop."""
        preds, outs = self._preds, self._outs
        ok &= ~lost
        while lost:
            bit = lost & -lost
            lost ^= bit
            check = preds[bit.bit_length() - 1] & ok
            while check:
                p = check & -check
                check ^= p
                if not outs[p.bit_length() - 1] & ok:
                    ok ^= p
                    lost |= p
        return ok

    def _add(self, ok: int, allowed: int, gained: int) -> int:
        """``ok`` with the ``allowed`` nodes that now finish through the newly allowed ``gained``."""
        preds, outs = self._preds, self._outs
        todo = gained & ~ok
        while todo:
            bit = todo & -todo
            todo ^= bit
            i = bit.bit_length() - 1
            if outs[i] & ok and not ok & bit:
                ok |= bit
                todo |= preds[i] & allowed & ~ok
        return ok

    def has_path(self, allowed: int) -> bool:
        """Whether some pipeline runs on ``allowed`` nodes only (a bitmask, :meth:`mask_of`)."""
        return bool(self._next_mask[self._source] & self.finishing_mask(allowed))

    def next_mask(self, vertex: int) -> int:
        """Bitmask of the nodes ``vertex`` (a number) has arcs to."""
        return self._next_mask[vertex]

    def candidates(self, vertex: int, mask: int) -> list[str]:
        """Names of ``vertex``'s next nodes in ``mask``, in arc order."""
        return [w for w, bit in self._next_bits[vertex] if mask & bit]

    def picks(self, choose: Callable[[str, list[str]], str]) -> list[Pick]:
        """``choose(vertex, candidates)`` (names, candidates in arc order) as :meth:`walk_mask`'s
        table: one function per vertex number."""
        def pick_at(v: int) -> Callable[[int], int]:
            name, index, candidates = self.vertices[v], self.index, self.candidates
            return lambda mask: index[choose(name, candidates(v, mask))]
        return [pick_at(v) for v in range(len(self.vertices))]

    def walk_mask(self, picks: Sequence[Pick], allowed: int) -> Pipeline | None:
        """Build a pipeline of ``allowed`` nodes (a bitmask), None when there is none. At each vertex
        the candidates are its out-arcs to allowed nodes that can still finish
        (:meth:`finishing_mask`); ``picks[v]`` says what to do at vertex number ``v``: either the
        number of the node to go to (where that is the only hop and choosing it changes no state),
        or a function from the candidates (a non-empty bitmask) to the number of the node chosen."""
        finishing = self.finishing_mask(allowed)
        next_mask, is_last = self._next_mask, self._is_last
        here = self._source
        candidates = next_mask[here] & finishing
        if not candidates:
            return None
        # The path as the digits of one int, base len(vertices) after a leading 1: cheaper to
        # build than a list of stages, and the key of the Pipeline made for it the first time.
        base = here + 1
        code = 1
        while True:
            # Every candidate can finish, so the next vertex has candidates too unless it is last.
            nxt = picks[here]
            if nxt.__class__ is not int:
                nxt = nxt(candidates)
            code = code * base + nxt
            if is_last[nxt]:
                pipeline = self._paths.get(code)
                return self._pipeline(code) if pipeline is None else pipeline
            here = nxt
            candidates = next_mask[here] & finishing

    def _pipeline(self, code: int) -> Pipeline:
        """The Pipeline of path ``code`` (:meth:`walk_mask`), made and remembered."""
        base, path, rest = self._source + 1, [], code
        while rest > 1:
            rest, v = divmod(rest, base)
            path.append(v)
        vertices = [self.vertices[v] for v in (self._source, *reversed(path))]
        pipeline = Pipeline(tuple(self.stage(u, w) for u, w in zip(vertices, vertices[1:])))
        if len(self._paths) >= _PATH_CACHE_SIZE:
            self._paths.clear()
        self._paths[code] = pipeline
        return pipeline
