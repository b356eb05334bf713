"""The pipelines a plan creates: the source-to-sink paths of its max-flow solution, with the share of
requests each one gets. Pure (a :class:`~helix.core.plan.Plan` in, paths out), so the planner, the
throughput prediction (:mod:`planner.prediction`) and the coordinator can all use it.

A request's pipeline is drawn hop by hop: at every vertex the coordinator's scheduler picks the next
node by interleaved weighted round robin over the out-arcs that carry flow, weighted by those flows
(Helix section 5). Over many requests a path's share is therefore the product, over its hops, of
the arc's flow divided by the vertex's out-flow. Which hops a request may take is decided here, for
the coordinator too (:func:`hop_usable`, used by ``coordinator.pipeline.Topology``): a node
holding layer 0 is only ever a first stage, and with partial inference the next stage starts where
the previous one stopped, inside its node's range.
"""

from __future__ import annotations

from dataclasses import dataclass

from helix.core.plan import COORDINATOR, Plan
from helix.core.slices import LayerSlice, Placement, as_placement

#: Paths whose share is below this are dropped (their shares go to the others): a 42-node plan
#: can have tens of thousands of paths, almost all of them negligible.
MIN_SHARE = 1e-4

#: At most this many paths are kept, the most used first.
MAX_PATHS = 2000


@dataclass(frozen=True)
class PlanPipeline:
    """One source-to-sink path of the plan and the fraction of requests that take it."""

    stages: tuple[LayerSlice, ...]
    """Layers ``[start, end)`` of a request run on each node (``end`` is the node's own end)."""
    share: float

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(s.node for s in self.stages)


def hop_usable(ranges: Placement, num_layers: int, partial_inference: bool,
               src: str, dst: str) -> bool:
    """Whether a request may go ``src -> dst`` given the layer ranges (vertices: node names and
    :data:`~helix.core.plan.COORDINATOR`, which is the source and the sink)."""
    if src == dst:
        return False
    at = 0 if src == COORDINATOR else ranges[src][1]
    if dst == COORDINATOR:
        return src != COORDINATOR and at == num_layers
    if dst not in ranges:
        return False
    start, end = ranges[dst]
    if src == COORDINATOR:
        return start == 0
    if start == 0:
        return False
    return start <= at < end if partial_inference else start == at


def enumerate_pipelines(plan: Plan, min_share: float = MIN_SHARE,
                        max_paths: int = MAX_PATHS) -> tuple[PlanPipeline, ...]:
    """The plan's pipelines, most used first (ties by node names), shares summing to 1.

    Empty when no flow reaches the sink. Deterministic: same plan, same paths in the same order."""
    ranges = as_placement(plan.placements, skip_empty=True)
    out: dict[str, list[tuple[str, float]]] = {}
    for a in plan.arc_flows:
        if a.flow_tokens_per_s > 0 and (a.src == COORDINATOR or a.src in ranges) and \
                hop_usable(ranges, plan.num_layers, plan.partial_inference, a.src, a.dst):
            out.setdefault(a.src, []).append((a.dst, a.flow_tokens_per_s))
    split = {v: [(w, f / sum(x for _, x in ws)) for w, f in sorted(ws)] for v, ws in out.items()}
    found: list[PlanPipeline] = []
    # Every usable hop moves to a higher layer, so the walk ends.
    stack: list[tuple[str, int, tuple[LayerSlice, ...], float]] = [(COORDINATOR, 0, (), 1.0)]
    while stack:
        vertex, at, stages, share = stack.pop()
        for nxt, fraction in split.get(vertex, ()):
            s = share * fraction
            if s < min_share:
                continue
            if nxt == COORDINATOR:
                found.append(PlanPipeline(stages, s))
            else:
                end = ranges[nxt][1]
                stack.append((nxt, end, stages + (LayerSlice(nxt, at, end),), s))
    found.sort(key=lambda p: (-p.share, p.nodes))
    found = found[:max_paths]
    total = sum(p.share for p in found)
    return tuple(PlanPipeline(p.stages, p.share / total) for p in found) if total > 0 else ()
