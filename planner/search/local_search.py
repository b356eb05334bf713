"""Local search on the exact objective: hill climbing over placements, scored by the real max flow.

Moves: grow or shrink one node's range by a layer at either end; shift the boundary between two
consecutive stages (``end_i == start_j``) by one layer; move a range by one layer; swap the ranges
of two nodes of different GPU kinds (a sample), or hand a node's range to an unused node. First improvement
wins; the search stops at a local optimum or the deadline. Because each move is scored by
``planner.flowgraph.max_flow`` on the real graph, slow links and coordinator links count exactly,
which the class MILP only bounds.
"""

from __future__ import annotations

import random
import time

from planner.flowgraph import FlowResult, Placement, max_flow
from planner.search.baselines import fits
from planner.problem import PlacementProblem


def _moves(problem: PlacementProblem, placement: Placement, rng: random.Random):
    for name, (s, e) in placement.items():
        for ns, ne in ((s - 1, e), (s + 1, e), (s, e - 1), (s, e + 1), (s - 1, e - 1), (s + 1, e + 1)):
            yield {name: (ns, ne)}
    ends: dict[int, list[str]] = {}
    for name, (s, e) in placement.items():
        ends.setdefault(e, []).append(name)
    for j, (s, e) in placement.items():
        for i in ends.get(s, ()):  # i feeds j exactly at boundary s
            si, ei = placement[i]
            for d in (-1, 1):
                yield {i: (si, ei + d), j: (s + d, e)}
    names = sorted(placement)
    unused = sorted(n.name for n in problem.nodes if n.name not in placement)
    for _ in range(2 * len(names)):  # swap two nodes' ranges, or hand a range to an unused node
        a = rng.choice(names)
        b = rng.choice(names + unused)
        if a != b and problem.node(a).gpu != problem.node(b).gpu:
            yield ({a: placement[b], b: placement[a]} if b in placement else {b: placement[a], a: None})


def _valid(problem: PlacementProblem, change: dict, min_layers: int) -> bool:
    L = problem.num_layers
    return all(r is None or (fits(problem.node(n), r[0], r[1], L) and r[1] - r[0] >= min_layers)
               for n, r in change.items())


def improve(problem: PlacementProblem, placement: Placement, flows: FlowResult, partial: bool,
            deadline_s: float, seed: int = 0, target: float = float("inf"),
            min_layers: int = 1) -> tuple[Placement, FlowResult]:
    """Hill-climb from ``placement`` until no move helps, the flow reaches ``target`` or
    ``time.perf_counter() > deadline_s``. Ranges keep at least ``min_layers`` layers."""
    rng = random.Random(seed)
    best, best_flows = dict(placement), flows
    while time.perf_counter() < deadline_s and best_flows.value_tokens_per_s < target:
        moves = [m for m in _moves(problem, best, rng) if _valid(problem, m, min_layers)]
        rng.shuffle(moves)
        for change in moves:
            if time.perf_counter() >= deadline_s:
                return best, best_flows
            cand = {n: r for n, r in {**best, **change}.items() if r is not None}
            res = max_flow(problem, cand, partial)
            if res.value_tokens_per_s > best_flows.value_tokens_per_s * (1 + 1e-9) + 1e-9:
                best, best_flows = cand, res
                break
        else:
            return best, best_flows  # local optimum
    return best, best_flows
