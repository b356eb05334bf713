"""Structured warm starts built on the layer axis (the class MILP's view of a placement).

``sweep``: for a target flow F, walk the layer boundaries from 0 to L. At the lowest boundary b with
tokens still waiting, place the node (and layer count k) that turns the most of its capacity into
useful work: it holds ``[b, b + k)`` and, with partial inference, also absorbs tokens waiting at the
boundaries inside its range (they run only the rest of it). Success means every token reached L; a
binary search finds the largest F that succeeds, and leftover nodes are swept again. Nodes are
handled per class (interchangeable nodes), so one step costs classes x layer counts.

``stages``: a chain of stages, each of m interchangeable nodes holding the same k layers (m T(k) >= F),
chosen per class by an unbounded-knapsack DP for the largest F whose stages cover all layers.

``regional``: the sweep run inside each region separately (the coordinator reaches every region
directly, so a region that can hold the model can serve on its own without crossing slow links).
"""

from __future__ import annotations

from collections import Counter

from planner.search.bounds import fixed_point_bound, node_work_fn
from planner.milp.classes import node_classes
from planner.flowgraph import Placement
from planner.search.baselines import fits
from planner.problem import PlacementProblem

EPS = 1e-9


def _sweep_once(problem: PlacementProblem, classes, left: Counter, F: float, partial: bool):
    """Try to route F tokens/s; returns [(class index, s, e)] or None when the nodes run out."""
    L = problem.num_layers
    pending = [0.0] * (L + 1)
    pending[0] = F
    best_work = {ci: max(node_work_fn(problem, c.proto)[0](F), EPS) for ci, c in enumerate(classes)}
    left = Counter(left)
    placed = []
    b = 0
    while True:
        while b < L and pending[b] <= EPS * max(1.0, F):
            b += 1
        if b >= L:
            return placed
        choice = None
        for ci, c in enumerate(classes):
            if left[ci] <= 0:
                continue
            for k in range(1, min(len(c.proto.throughput_tokens_per_s), L - b) + 1):
                if not fits(c.proto, b, b + k, L):
                    continue
                cap = min(c.proto.throughput(k), F)
                work, take = 0.0, cap
                for bb in (range(b, b + k) if partial else (b,)):
                    got = min(take, pending[bb])
                    work += got * (b + k - bb)
                    take -= got
                score = (work / best_work[ci], work)
                if choice is None or score > choice[0]:
                    choice = (score, ci, k, cap)
        if choice is None:
            return None
        _, ci, k, cap = choice
        left[ci] -= 1
        placed.append((ci, b, b + k))
        for bb in (range(b, b + k) if partial else (b,)):
            got = min(cap, pending[bb])
            pending[bb] -= got
            pending[b + k] += got
            cap -= got


def _best_sweep(problem, classes, left: Counter, upper: float, partial: bool):
    """Largest F (from the table breakpoints and a 0.5 % grid below ``upper``) the sweep routes.

    Success is not monotone in F (a greedy), so candidates are scanned from the top, not bisected."""
    grid = {upper * (1 - 0.005 * i) for i in range(100)}
    grid |= {t for ci, c in enumerate(classes) if left[ci] > 0
             for t in c.proto.throughput_tokens_per_s if upper / 2 <= t <= upper}
    for F in sorted(grid, reverse=True):
        placed = _sweep_once(problem, classes, left, F, partial)
        if placed is not None:
            return placed
    return None


def sweep(problem: PlacementProblem, seed: int = 0, partial: bool = True,
          upper: float | None = None) -> Placement:
    classes = node_classes(problem)
    left = Counter({ci: c.count for ci, c in enumerate(classes)})
    upper = fixed_point_bound(problem) if upper is None else upper
    free = {ci: list(c.members) for ci, c in enumerate(classes)}
    placement: dict[str, tuple[int, int]] = {}
    for _ in range(4):  # leftover nodes get further rounds
        placed = _best_sweep(problem, classes, left, upper, partial)
        if not placed:
            break
        for ci, s, e in placed:
            placement[free[ci].pop(0)] = (s, e)
            left[ci] -= 1
    return placement


def regional(problem: PlacementProblem, seed: int = 0, partial: bool = True) -> Placement:
    regions = sorted({n.region for n in problem.nodes})
    if len(regions) < 2:
        return {}
    placement: dict[str, tuple[int, int]] = {}
    for r in regions:
        placement.update(sweep(region_problem(problem, r), seed, partial))
    return placement


def region_problem(problem: PlacementProblem, region: str) -> PlacementProblem:
    """The sub-problem of one region's nodes, with the links among them and the coordinator."""
    nodes = tuple(n for n in problem.nodes if n.region == region)
    names = {n.name for n in nodes} | {"coordinator"}
    links = {k: v for k, v in problem.links.items() if k[0] in names and k[1] in names}
    return PlacementProblem(problem.model, problem.num_layers, nodes, links, problem.spec_hash)


def class_stage_dp(node, count: int, F: float, L: int) -> list[tuple[int, int]]:
    """Most layers a class covers at flow F with ``count`` nodes, as stages (k layers, m nodes).

    A stage of m nodes holding the same k layers carries m T(k); it needs m = ceil(F / T(k)).
    Unbounded knapsack over stage types, weight m, value k."""
    types = []
    for k in range(1, min(len(node.throughput_tokens_per_s), node.max_layers, L) + 1):
        t = node.throughput(k)
        if t > 0:
            types.append((k, max(1, -int(-F // t))))
    best = [(0, [])] * (count + 1)
    for j in range(1, count + 1):
        cand = best[j - 1]
        for k, m in types:
            if m <= j and best[j - m][0] + k > cand[0]:
                cand = (best[j - m][0] + k, best[j - m][1] + [(k, m)])
        best[j] = cand
    return best[count][1]


def stages(problem: PlacementProblem, seed: int = 0, partial: bool = True) -> Placement:
    """A chain of stages of interchangeable nodes (one class per stage), found by dynamic programming
    for the largest target flow F (scanned down from the bound) whose stages cover all L layers."""
    L = problem.num_layers
    classes = node_classes(problem)
    upper = fixed_point_bound(problem)
    for F in (upper * (1 - 0.005 * i) for i in range(200)):
        plan = [(ci, k, m) for ci, c in enumerate(classes)
                for k, m in class_stage_dp(c.proto, c.count, F, L)]
        if sum(k for _, k, _ in plan) >= L:
            return _lay_out_stages(problem, classes, plan, L)
    return {}


def _lay_out_stages(problem, classes, plan, L) -> Placement:
    # Largest stages first (fast GPUs near the embedding); trim the overshoot from the biggest k.
    plan = sorted(plan, key=lambda t: (-classes[t[0]].proto.throughput(1), -t[1]))
    over = sum(k for _, k, _ in plan) - L
    while over > 0:
        i = max(range(len(plan)), key=lambda j: plan[j][1])
        ci, k, m = plan[i]
        cut = min(over, k - 1)
        if cut <= 0:
            plan.pop(i)
            over -= k
            continue
        plan[i] = (ci, k - cut, m)
        over -= cut
    free = {ci: list(c.members) for ci, c in enumerate(classes)}
    placement: dict[str, tuple[int, int]] = {}
    s = 0
    for ci, k, m in plan:
        e = min(L, s + k)
        for _ in range(m):
            name = free[ci].pop(0)
            if fits(problem.node(name), s, e, L):
                placement[name] = (s, e)
        s = e
    return placement
