"""Proven upper bounds on the max flow of *any* placement.

Every token passes every layer exactly once and visits a node at most once (ranges strictly advance).
So if node i holds k_i layers and carries f_i tokens/s, ``L * F <= sum_i k_i f_i`` with
``f_i <= min(F, T_i(k_i), in_i, out_i)`` (in_i / out_i: total link capacity into / out of node i).
Hence ``F <= (1/L) * sum_i g_i(F)`` with ``g_i(F) = max_k k * min(F, T_i(k), in_i, out_i)`` over the
layer counts the node's memory allows. The bound is the largest F satisfying it (a fixed point),
far tighter than the reference's ``sum_i max_k k T_i(k) / L``.

Network cuts: the work done inside a region R is at most L times the tokens/s that enter R (each
visit runs at most L layers), and tokens enter R only over links from outside it (the coordinator
included). So ``g_R(F) <= L * in_R`` per region. And F never exceeds the coordinator's out- or
in-link totals.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from planner.problem import COORDINATOR, NodeCapacity, PlacementProblem


def layer_counts(node: NodeCapacity, num_layers: int) -> list[int]:
    """Layer counts the node can hold in some position (memory and table permitting)."""
    kmax = max(node.max_layers, node.max_layers_first, node.max_layers_last,
               node.max_layers_first_last if node.max_layers_first_last >= num_layers else 0)
    kmax = min(kmax, len(node.throughput_tokens_per_s), num_layers)
    return [k for k in range(1, kmax + 1) if node.throughput(k) > 0
            and (k < num_layers or node.max_layers_first_last >= num_layers)]


def _link_total(problem: PlacementProblem, name: str, incoming: bool) -> float:
    into, out = problem.link_totals()
    return (into if incoming else out).get(name, 0.0)


def _work_pairs(problem: PlacementProblem, node: NodeCapacity,
                min_layers: int) -> tuple[tuple[int, float], ...]:
    """(k, cap_i(k)) for every layer count k the node can hold: g_i is a function of these alone."""
    cap_links = min(_link_total(problem, node.name, True), _link_total(problem, node.name, False))
    return tuple((k, min(node.throughput(k), cap_links))
                 for k in layer_counts(node, problem.num_layers) if k >= min_layers)


def node_work_fn(problem: PlacementProblem, node: NodeCapacity, min_layers: int = 1):
    """g_i(F) = max_k k * min(F, cap_i(k)): the most layer-tokens/s node i can do at total flow F."""
    pairs = _work_pairs(problem, node, min_layers)

    def g(F: float) -> float:
        return max((k * min(F, c) for k, c in pairs), default=0.0)

    return g, [c for _, c in pairs]


def fixed_point_bound(problem: PlacementProblem, min_layers: int = 1) -> float:
    """Largest F with ``L * F <= sum_R min(sum_{i in R} g_i(F), L * in_R)``, and the coordinator cuts.

    ``min`` over regions makes the right side non-convex, so each choice S of regions whose cut is
    applied is solved on its own (each is convex between breakpoints, so its largest root is exact)
    and the smallest result is returned: it is >= the joint fixed point, hence still an upper bound.
    ``min_layers``: only placements where every used node holds at least that many (--max-depth).
    """
    L = problem.num_layers
    # Nodes with the same (k, cap) pairs have the same g: summed once with their count (a
    # 1,000-node cluster has a few dozen), and each region's sum is kept per F, as every cut
    # subset scans the same breakpoints.
    kinds: dict[str, Counter] = defaultdict(Counter)
    for n in problem.nodes:
        kinds[n.region][_work_pairs(problem, n, min_layers)] += 1
    breaks = {0.0} | {c for per in kinds.values() for pairs in per for _, c in pairs}
    by_region = {r: _region_work_fn(per) for r, per in kinds.items()}
    region_in = _region_inflow(problem)
    coord = min(_link_total(problem, COORDINATOR, False), _link_total(problem, COORDINATOR, True))
    pts = sorted({b for b in breaks if b <= coord} | {coord})
    regions = sorted(by_region)
    subsets = [()] + [(r,) for r in regions]
    if len(regions) <= 6:
        subsets = [tuple(r for i, r in enumerate(regions) if mask >> i & 1)
                   for mask in range(1 << len(regions))]
    best = coord
    for cut in subsets:
        def h(F: float, cut=cut) -> float:
            work = sum(L * region_in[r] if r in cut else by_region[r](F) for r in regions)
            return work / L - F
        best = min(best, _largest_root(h, pts))
    return best


def _region_work_fn(kinds: Counter):
    """F -> sum over a region's nodes of g_i(F), given its node kinds' (k, cap) pairs and counts."""
    seen: dict[float, float] = {}

    def work(F: float) -> float:
        if F not in seen:
            seen[F] = sum(count * max((k * min(F, c) for k, c in pairs), default=0.0)
                          for pairs, count in kinds.items())
        return seen[F]

    return work


def _largest_root(h, pts: list[float]) -> float:
    """Largest F in [pts[0], pts[-1]] with h(F) >= 0, for h convex between consecutive pts.

    Returns a value >= the true root (the upper end of the final bisection bracket). Values of h
    within rounding of 0 count as >= 0, which can only raise the bound (keeps it valid)."""
    def ok(F: float) -> bool:
        return h(F) >= -1e-9 * max(1.0, F)

    if ok(pts[-1]):
        return pts[-1]
    for a, b in zip(reversed(pts[:-1]), reversed(pts[1:])):
        if ok(a):  # convex, >= 0 at a and < 0 at b: exactly one crossing inside
            lo, hi = a, b
            for _ in range(200):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if ok(mid) else (lo, mid)
                if hi - lo <= 1e-9 * max(1.0, hi):
                    break
            return hi
    return pts[0]


def _region_inflow(problem: PlacementProblem) -> dict[str, float]:
    region = {n.name: n.region for n in problem.nodes}
    inflow: dict[str, float] = defaultdict(float)
    for (src, dst), link in problem.links.items():
        if dst in region and region.get(src) != region[dst]:
            inflow[region[dst]] += link.capacity_tokens_per_s
    return inflow
