"""Per-request pipelines: the stages a request visits, and the topology they are drawn from.

A :class:`Pipeline` is a source-to-sink path through a placement: stage ``i`` runs layers
``[start, end)`` on one node. Consecutive stages are contiguous (``stages[i].end ==
stages[i+1].start``), the first starts at layer 0 and the last ends at the model's last layer. Where
two nodes' ranges overlap, the next stage starts where the previous one stopped and runs only the
layers it lacks (*partial inference*, Helix section 5); so a stage may start inside its node's range.

:class:`Topology` is the graph the pipeline builders walk: vertices are node names plus
:data:`COORDINATOR`, arcs are the hops a request may take. Because a stage always runs to its node's
``end``, whether a node can still reach the sink does not depend on where the request entered it,
so the "can this node finish the request under the current mask?" test is one memoized depth-first
search, asked only for the vertices a walk actually considers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from helix.plan import COORDINATOR, Plan


@dataclass(frozen=True)
class Stage:
    """Run layers ``[start, end)`` of one request on ``node``."""

    node: str
    start: int
    end: int

    @property
    def num_layers(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Pipeline:
    """The stages of one request, in order, covering layers ``[0, num_layers)`` exactly once."""

    stages: tuple[Stage, ...]

    @property
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
    """

    def __init__(self, num_layers: int, ranges: Mapping[str, tuple[int, int]],
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
        # Derived once for the decision path (walk).
        self._next_nodes = {v: tuple(w for w in ws if w != COORDINATOR)
                            for v, ws in self.arcs.items()}
        self._last_stages = frozenset(n for n in self.ranges if COORDINATOR in self.arcs[n])
        self._stages = {(v, w): self.stage(v, w) for v, ws in self._next_nodes.items() for w in ws}

    def usable(self, src: str, dst: str) -> bool:
        """Whether a request may hop ``src -> dst`` given the layer ranges."""
        if src == dst:
            return False
        at_layer = 0 if src == COORDINATOR else self.ranges[src][1]
        if dst == COORDINATOR:
            return src != COORDINATOR and at_layer == self.num_layers
        if dst not in self.ranges:
            return False
        start, end = self.ranges[dst]
        if src == COORDINATOR:
            return start == 0
        if start == 0:   # a layer-0 node is a first stage only (see the class docstring)
            return False
        if self.partial_inference:
            return start <= at_layer < end
        return start == at_layer

    @classmethod
    def from_plan(cls, plan: Plan, connected: Callable[[str, str], bool] | None = None,
                  flows_only: bool = True) -> "Topology":
        """Arcs of the plan's max-flow solution with positive flow (``flows_only``), or every usable
        pair of vertices that ``connected`` allows (all pairs when None)."""
        ranges = {p.node: (p.start, p.end) for p in plan.placements}
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

    def stage(self, src: str, dst: str) -> Stage:
        """The stage run on ``dst`` when a request arrives from ``src``."""
        at_layer = 0 if src == COORDINATOR else self.ranges[src][1]
        return Stage(dst, at_layer, self.ranges[dst][1])

    def finishing_nodes(self, allowed: Callable[[str], bool]) -> set[str]:
        """Nodes from which some path of ``allowed`` nodes reaches the sink (``allowed`` included)."""
        ok: set[str] = set()
        arcs = self.arcs
        for node in self.nodes_by_end_desc:
            if not allowed(node):
                continue
            for w in arcs[node]:
                if w == COORDINATOR or w in ok:
                    ok.add(node)
                    break
        return ok

    def walk(self, choose: Callable[[str, list[str]], str], allowed: Callable[[str], bool]
             ) -> Pipeline | None:
        """Build a pipeline by asking ``choose(vertex, candidates)`` at every vertex, candidates being
        the out-arcs to ``allowed`` nodes that can still finish (:meth:`finishing_nodes`). None when
        no pipeline exists. Only the nodes reachable from the candidates the walk meets are tested,
        each at most once (``allowed`` must not change during the walk)."""
        last, next_nodes = self._last_stages, self._next_nodes
        memo: dict[str, bool] = {}

        def finishes(node: str) -> bool:   # memo-less call; callers look in memo first
            ok = False
            if allowed(node):
                if node in last:
                    ok = True
                else:
                    for w in next_nodes[node]:
                        if memo[w] if w in memo else finishes(w):
                            ok = True
                            break
            memo[node] = ok
            return ok

        stages: list[Stage] = []
        here = COORDINATOR
        while here not in last:
            candidates = [w for w in next_nodes[here]
                          if (memo[w] if w in memo else finishes(w))]
            if not candidates:
                return None
            nxt = choose(here, candidates)
            stages.append(self._stages[here, nxt])
            here = nxt
        return Pipeline(tuple(stages))
