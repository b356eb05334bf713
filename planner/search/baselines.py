"""Heuristic placements: the baselines the paper compares against, and structured warm starts.

Each takes a :class:`PlacementProblem` and returns a :class:`Placement` (node -> [start, end)) that
respects every node's memory limits; its throughput is always measured with the same max flow
(``planner.flowgraph.max_flow``). A heuristic that cannot place the model returns an empty placement.

* ``petals``   - Petals' rule (its paper, appendix D) as the Helix artifact implements it: nodes in a
  seeded random order each take as many layers as they can hold, at the window whose per-layer
  served throughput, sorted ascending, is lexicographically smallest (the worst-served window).
* ``swarm``    - SWARM's rule as the artifact implements it: as few equal stages as every node can
  hold; nodes, fastest first at the stage size, join the stage with the least total throughput.
* ``separate`` - one independent pipeline per GPU kind, layers split evenly inside it.
* ``uniform``  - one chain of all nodes, layers in proportion to per-layer capacity T(1).
* ``pipelines`` (warm start, not a paper baseline) - for a target flow F every node can run
  k_i(F) = max{k : T_i(k) >= F} layers; nodes are packed into as many full pipelines as possible
  (bin covering, largest first), the F with the most total flow wins, leftovers repeat at a lower F.
"""

from __future__ import annotations

import math
import random
from typing import Callable, Sequence

from planner.flowgraph import Placement
from planner.problem import NodeCapacity, PlacementProblem


def fits(node: NodeCapacity, start: int, end: int, num_layers: int) -> bool:
    """Whether ``node`` can hold ``[start, end)`` (memory by position and table length)."""
    k = end - start
    return (0 <= start < end <= num_layers and k <= len(node.throughput_tokens_per_s)
            and node.throughput(k) > 0 and k <= node.max_layers_for(start == 0, end == num_layers))


def _most_layers(node: NodeCapacity, L: int) -> int:
    return min(len(node.throughput_tokens_per_s), L)


def petals(problem: PlacementProblem, seed: int = 0) -> Placement:
    """Petals-style placement (the Helix artifact's ``PetalsLayout``; published layouts reproduce).

    The artifact shuffles (T(k_max), node index) pairs with Python's ``random.seed(seed)`` and
    ``random.shuffle``; ``random.Random(seed).shuffle`` draws the same order. A node that cannot
    hold k_max layers at any position (its first or last stage also holds the embedding or the LM
    head) takes the largest count that fits somewhere: the artifact has no such case."""
    L = problem.num_layers
    order = [(n.throughput(_most_layers(n, L)), i) for i, n in enumerate(problem.nodes)]
    random.Random(seed).shuffle(order)
    served = [0.0] * L
    placement: dict[str, tuple[int, int]] = {}
    for _, i in order:
        node = problem.nodes[i]
        window = _worst_served_window(node, served, L)
        if window is None:
            continue
        s, k = window
        placement[node.name] = (s, s + k)
        for layer in range(s, s + k):
            served[layer] += node.throughput(k)
    return placement


def _worst_served_window(node: NodeCapacity, served: list[float], L: int
                         ) -> tuple[int, int] | None:
    """(start, k): the most layers the node can hold, at the earliest window whose sorted served
    throughputs are lexicographically smallest."""
    for k in range(_most_layers(node, L), 0, -1):
        best = None
        for s in range(L - k + 1):
            if fits(node, s, s + k, L):
                key = sorted(served[s:s + k])
                if best is None or key < best[0]:
                    best = (key, s)
        if best is not None:
            return best[1], k
    return None


def swarm_stages(problem: PlacementProblem) -> list[tuple[int, int]]:
    """The artifact's stage count, "as few as possible": the fewest equal stages (the count
    divides L) that every node able to hold a layer can hold. When that gives more stages than
    nodes (L has no fitting divisor), ceil(L / size) stages of sizes differing by at most one."""
    L = problem.num_layers
    able = [n for n in problem.nodes if n.throughput(1) > 0]
    if not able:
        return []
    size = min(_most_layers(n, L) for n in able)
    count = next(c for c in range(1, L + 1) if L % c == 0 and L // c <= size)
    if count > len(able):
        count = math.ceil(L / size)
    bounds = [round(i * L / count) for i in range(count + 1)]
    return list(zip(bounds, bounds[1:]))


def swarm(problem: PlacementProblem, seed: int = 0) -> Placement:
    """SWARM-style placement (the Helix artifact's ``SwarmLayout``; published layouts reproduce).

    Nodes sorted by (T(stage size), index), fastest first (the artifact sorts those pairs in
    reverse, so equal nodes go highest index first), each joining the stage with the least total
    throughput so far (the first such stage). A node that cannot hold a stage (memory with the
    embedding or LM head) joins the least-served stage it can hold, or none."""
    L = problem.num_layers
    stages = swarm_stages(problem)
    if not stages:
        return {}
    size = max(e - s for s, e in stages)
    ranked = sorted(((n.throughput(size), i) for i, n in enumerate(problem.nodes)), reverse=True)
    total = [0.0] * len(stages)
    placement: dict[str, tuple[int, int]] = {}
    for _, i in ranked:
        node = problem.nodes[i]
        options = [j for j, (s, e) in enumerate(stages) if fits(node, s, e, L)]
        if not options:
            continue
        j = min(options, key=lambda j: (total[j], j))
        placement[node.name] = stages[j]
        total[j] += node.throughput(stages[j][1] - stages[j][0])
    return placement


def chain(nodes: Sequence[NodeCapacity], weights: Sequence[float], L: int) -> Placement:
    """One pipeline through ``nodes`` in order, layer counts ~ weights, within memory limits.

    Returns {} when the nodes cannot hold the model between them."""
    n = len(nodes)
    if n == 0:
        return {}
    if n > L:
        idx = sorted(range(n), key=lambda i: -weights[i])[:L]
        return chain([nodes[i] for i in sorted(idx)], [weights[i] for i in sorted(idx)], L)
    caps = [min(len(x.throughput_tokens_per_s), x.max_layers_for(i == 0, i == n - 1) if n > 1
                else x.max_layers_first_last) for i, x in enumerate(nodes)]
    if sum(caps) < L or min(caps) < 1:
        return {}
    counts = [1] * n
    left = L - n
    while left > 0:  # water-filling: give the next layer to the node furthest below its share
        total_w = sum(weights) or 1.0
        cands = [i for i in range(n) if counts[i] < caps[i]]
        i = max(cands, key=lambda j: (weights[j] / total_w * L - counts[j], -j))
        counts[i] += 1
        left -= 1
    out, s = {}, 0
    for x, k in zip(nodes, counts):
        out[x.name] = (s, s + k)
        s += k
    return out


def separate(problem: PlacementProblem, seed: int = 0) -> Placement:
    placement: dict[str, tuple[int, int]] = {}
    kinds = sorted({n.gpu for n in problem.nodes})
    for kind in kinds:
        group = sorted((n for n in problem.nodes if n.gpu == kind), key=lambda n: n.name)
        placement.update(chain(group, [1.0] * len(group), problem.num_layers))
    return placement


def uniform(problem: PlacementProblem, seed: int = 0) -> Placement:
    nodes = sorted(problem.nodes, key=lambda n: (n.region, n.gpu, n.name))
    return chain(nodes, [n.throughput(1) for n in nodes], problem.num_layers)


def _k_at(node: NodeCapacity, F: float, L: int) -> int:
    """Most layers the node can hold in the middle of a pipeline while still running F tokens/s."""
    best = 0
    for k in range(1, min(len(node.throughput_tokens_per_s), node.max_layers, L) + 1):
        if node.throughput(k) >= F:
            best = k
    return best


def _cover(nodes: list[NodeCapacity], F: float, L: int) -> list[list[tuple[NodeCapacity, int]]]:
    """Pack nodes into pipelines of >= L layers at flow F (largest first, then smallest that closes)."""
    items = sorted(((n, _k_at(n, F, L)) for n in nodes), key=lambda t: (-t[1], t[0].name))
    items = [t for t in items if t[1] > 0]
    pipes = []
    while items and sum(k for _, k in items) >= L:
        pipe, total = [], 0
        while total < L:
            need = L - total
            closing = [t for t in items if t[1] >= need]
            pick = min(closing, key=lambda t: t[1]) if closing else items[0]
            items.remove(pick)
            pipe.append(pick)
            total += pick[1]
        pipes.append(pipe)
    return pipes


def _layout(pipe: list[tuple[NodeCapacity, int]], L: int) -> Placement:
    nodes = sorted((n for n, _ in pipe), key=lambda n: -n.throughput(1))
    weights = [k for _, k in sorted(pipe, key=lambda t: -t[0].throughput(1))]
    return chain(nodes, weights, L)


def pipelines(problem: PlacementProblem, seed: int = 0) -> Placement:
    L = problem.num_layers
    left = list(problem.nodes)
    placement: dict[str, tuple[int, int]] = {}
    while left:
        targets = sorted({t for n in left for t in n.throughput_tokens_per_s if t > 0})
        best = max(((F * len(_cover(left, F, L)), F) for F in targets), default=(0.0, 0.0))
        if best[0] <= 0:
            break
        for pipe in _cover(left, best[1], L):
            laid = _layout(pipe, L)
            placement.update(laid)
            used = {n.name for n, _ in pipe}
            left = [n for n in left if n.name not in used]
    return placement


HEURISTICS: dict[str, Callable[[PlacementProblem, int], Placement]] = {
    "petals": petals, "swarm": swarm, "separate": separate, "uniform": uniform,
}
WARM_STARTS: dict[str, Callable[[PlacementProblem, int], Placement]] = {
    **HEURISTICS, "pipelines": pipelines,
}
