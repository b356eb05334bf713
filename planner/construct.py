"""Structured warm starts built on the layer axis (the class MILP's view of a placement).

``sweep``: for a target flow F, walk the layer boundaries from 0 to L. At the lowest boundary b with
tokens still waiting, place the node (and layer count k) that turns the most of its capacity into
useful work: it holds ``[b, b + k)`` and, with partial inference, also absorbs tokens waiting at the
boundaries inside its range (they run only the rest of it). Success means every token reached L; a
binary search finds the largest F that succeeds, and leftover nodes are swept again. Nodes are
handled per class (interchangeable nodes), so one step costs classes x layer counts.

``regional``: the sweep run inside each region separately (the coordinator reaches every region
directly, so a region that can hold the model can serve on its own without crossing slow links).
"""

from __future__ import annotations

from collections import Counter

from planner.bound import node_work_fn
from planner.classes import node_classes
from planner.flowgraph import Placement
from planner.heuristics import fits
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
    from planner.bound import fixed_point_bound
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
