"""Crossing bound: where every token must change regions, the crossing costs layer coverage.

The fixed point (``planner.search.bounds``) lets every node carry the whole flow at its best layer
count; on the reference's 3-region cluster that is a chain of 24 single nodes (2,045.6 tokens/s),
which cannot cross between regions, because one link there carries at most ~915 tokens/s.

The argument, at a target X (a placement whose max flow is >= X, its flow scaled down to X):

* Coverage. Node i holding k layers runs at most ``cap_i = min(T_i(k), X, in_i, out_i)`` tokens/s
  (in/out: its link totals; ``out`` is the coordinator link alone when its range ends at the last
  layer, where every token it runs leaves for the coordinator). Every token runs layer l once, so
  ``cov_l = sum_{i runs l} cap_i / X >= 1`` for every layer (the cover argument,
  ``planner.milp.cover_model``).
* Slack. With ``u_i = k_i cap_i / X`` (0 for an unused node) and ``u*_i`` its largest value over
  every (k, position) the node allows, ``sum_l (cov_l - 1) + sum_i (u*_i - u_i) = sum_i u*_i - L
  =: s(X)``: every term on the left is >= 0 (waste on a layer, a node below its best).
* Crossing. If no region's nodes can hold all L layers between them, some token runs layer b-1
  in one region and layer b in another, for some b. If only one node i runs layer b-1 and only
  one node j runs layer b, every token goes over the one link i -> j: X <= c_ij. So when X exceeds
  every link between regions, some layer is run by two distinct nodes a, b, and
  ``s(X) >= max(0, (cap_a + cap_b) / X - 1) + (u*_a - u_a) + (u*_b - u_b)``.

So X is refuted (no placement reaches it) when the least right-hand side over every pair of nodes
and every (k, position) of each exceeds s(X). Any refuted X is a valid bound. Letting a node's
options include ones the placement could not use (an unlikely position) only raises u* and
lowers the minimum: the test stays a relaxation. On 3cluster24: 2,045.6 -> 1,994.5.
"""

from __future__ import annotations

from collections import Counter

from planner.problem import COORDINATOR, NodeCapacity, PlacementProblem
from planner.search.bounds import layer_counts

def crossing_bound(problem: PlacementProblem, upper: float, min_layers: int = 1) -> float | None:
    """The least target <= ``upper`` found refuted (scanned down in 0.25 % steps, then bisected
    to 1e-4), or None when the argument does not apply (a region can hold the model, or no
    target at ``upper`` or just below it is refuted)."""
    L = problem.num_layers
    c_max = sharing_threshold(problem)
    if c_max is None:
        return None
    kinds = _kinds(problem, min_layers)

    def refuted(X: float) -> bool:
        return X > c_max and _refutes(kinds, L, X)

    if not refuted(upper):
        return None
    lo, hi = None, upper   # hi: refuted; lo: not refuted
    for i in range(1, 400):
        X = upper * (1 - 0.0025 * i)
        if not refuted(X):
            lo = X
            break
        hi = X
    if lo is None:
        return hi
    while hi - lo > 1e-4 * hi:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if refuted(mid) else (mid, hi)
    return hi


def sharing_threshold(problem: PlacementProblem) -> float | None:
    """Where no region's nodes can hold all layers between them: the largest link between
    regions (above it, some layer has two holders in every placement: a chain of single holders
    sends every token over one such link); otherwise None."""
    L = problem.num_layers
    region_layers: Counter = Counter()
    for n in problem.nodes:
        region_layers[n.region] += max(layer_counts(n, L), default=0)
    if not region_layers or max(region_layers.values()) >= L:
        return None
    return _cross_link_max(problem)


def _cross_link_max(problem: PlacementProblem) -> float:
    region = {n.name: n.region for n in problem.nodes}
    return max((link.capacity_tokens_per_s for (a, b), link in problem.links.items()
                if a in region and b in region and region[a] != region[b]), default=0.0)


def _kinds(problem: PlacementProblem, min_layers: int) -> Counter:
    """Nodes with one table and memory limits, as ((k, least cap, largest cap), ...) -> count,
    one entry per layer count and kind of position.

    Members differ only in their links, so in the caps. A kind's u* is its members' largest and
    a member's point is (least cap, u* - k * largest cap / X): the slack only grows and every
    member's real (cap, shortfall) is dominated, so the test stays a relaxation, and a
    1,000-node cluster has a few dozen kinds, not a thousand."""
    caps: dict[tuple, dict[tuple[int, str], list[float]]] = {}
    counts: Counter = Counter()
    for n in problem.nodes:
        key = (n.throughput_tokens_per_s, n.max_layers, n.max_layers_first, n.max_layers_last,
               n.max_layers_first_last)
        counts[key] += 1
        per_k = caps.setdefault(key, {})
        for k, where, cap in _options(problem, n, min_layers):
            per_k.setdefault((k, where), []).append(cap)
    kinds: Counter = Counter()
    for key, per_k in caps.items():
        opts = tuple(sorted((k, min(cs), max(cs)) for (k, _), cs in per_k.items()))
        if opts:   # nodes that can carry nothing add nothing to u* nor to a pair
            kinds[opts] += counts[key]
    return kinds


def _options(problem: PlacementProblem, node: NodeCapacity, min_layers: int):
    """(k, "end" | "other", cap) for every layer count the node allows, with its range ending at
    the last layer (every token it runs leaves for the coordinator) or not."""
    L = problem.num_layers
    into, out = problem.link_totals()
    base = min(into.get(node.name, 0.0), out.get(node.name, 0.0))
    link = problem.link(node.name, COORDINATOR)
    to_coord = link.capacity_tokens_per_s if link is not None else 0.0
    opts = set()
    for k in layer_counts(node, L):
        if k < min_layers:
            continue
        if k >= L:   # the whole model: first and last at once
            opts.add((k, "end", min(node.throughput(k), base, to_coord)))
            continue
        if k <= node.max_layers or k <= node.max_layers_first:
            opts.add((k, "other", min(node.throughput(k), base)))
        if k <= node.max_layers_last:
            opts.add((k, "end", min(node.throughput(k), base, to_coord)))
    return sorted(o for o in opts if o[2] > 0)


def _refutes(kinds: Counter, L: int, X: float) -> bool:
    """Whether the least pair loss exceeds the slack s(X) (see the module docstring)."""
    fronts = []   # per kind: [(cap / X, loss u* - u)], Pareto-minimal in both, and its count
    slack = -float(L)
    for opts, count in kinds.items():
        best = max(k * min(hi, X) / X for k, _, hi in opts)
        slack += count * best
        fronts.append((_pareto([(min(lo, X) / X, best - k * min(hi, X) / X)
                                for k, lo, hi in opts]), count))
    if slack < 0:
        return True
    least = float("inf")
    for i, (fa, na) in enumerate(fronts):
        for j in range(i, len(fronts)):
            fb, nb = fronts[j]
            if i == j and na < 2:
                continue
            for ca, la in fa:
                for cb, lb in fb:
                    least = min(least, max(0.0, ca + cb - 1.0) + la + lb)
    return least > slack * (1 + 1e-9) + 1e-12


def _pareto(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The (cap, loss) points no other point beats in both (smaller is better in each)."""
    out: list[tuple[float, float]] = []
    for c, loss in sorted(points):
        if not out or loss < out[-1][1]:
            out.append((c, loss))
    return out
