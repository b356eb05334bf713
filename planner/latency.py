"""Pipeline depth and per-token latency along the flow-carrying paths of a max flow.

The arc flows are decomposed into source-to-sink paths (standard flow decomposition). A path's
latency is the sum of its links' latencies and of each node's compute for the layers it runs there
(``layers run * layer_latency(k)``, the node's per-layer latency while it holds its k layers; with
partial inference a stage runs only the layers its predecessor did not). Figures are flow-weighted
means and maxima over the paths.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.flowgraph import FlowResult, Placement
from planner.problem import COORDINATOR, PlacementProblem


@dataclass(frozen=True)
class PathStats:
    depth_max: int
    """Most nodes on any flow-carrying path (hops per request)."""
    depth_mean: float
    latency_mean_s: float
    """Flow-weighted per-token latency (compute + links) of one pass through the pipeline."""
    latency_max_s: float
    num_paths: int


def decompose(flows: FlowResult, tol: float = 1e-9) -> list[tuple[list[str], float]]:
    """Split the arc flows into coordinator -> ... -> coordinator paths with their tokens/s."""
    rest = {a: f for a, f in flows.arc_flows.items() if f > tol}
    out_of: dict[str, list[str]] = {}
    for (u, v) in rest:
        out_of.setdefault(u, []).append(v)
    paths = []
    for _ in range(10 * len(rest) + 1):
        path, u = [COORDINATOR], COORDINATOR
        while True:
            nxt = [v for v in out_of.get(u, ()) if rest.get((u, v), 0.0) > tol]
            if not nxt:
                break
            v = max(nxt, key=lambda w: rest[(u, w)])
            path.append(v)
            u = v
            if v == COORDINATOR or len(path) > len(flows.node_flows) + 2:
                break
        if len(path) < 3 or path[-1] != COORDINATOR:
            break
        f = min(rest[(a, b)] for a, b in zip(path, path[1:]))
        for a, b in zip(path, path[1:]):
            rest[(a, b)] -= f
        paths.append((path, f))
    return paths


def path_stats(problem: PlacementProblem, placement: Placement, flows: FlowResult) -> PathStats:
    paths = decompose(flows)
    if not paths:
        return PathStats(0, 0.0, 0.0, 0.0, 0)
    total = sum(f for _, f in paths)
    lat, depth = [], []
    for path, f in paths:
        t, done = 0.0, 0
        for a, b in zip(path, path[1:]):
            link = problem.link(a, b)
            t += link.latency_s if link else 0.0
            if b != COORDINATOR:
                start, end = placement[b]
                t += (end - done) * problem.node(b).layer_latency(end - start)
                done = end
        lat.append(t)
        depth.append(len(path) - 2)
    return PathStats(depth_max=max(depth),
                     depth_mean=sum(d * f for d, (_, f) in zip(depth, paths)) / total,
                     latency_mean_s=sum(x * f for x, (_, f) in zip(lat, paths)) / total,
                     latency_max_s=max(lat), num_paths=len(paths))
