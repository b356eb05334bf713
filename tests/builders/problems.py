"""Tiny hand-made placement problems for planner tests (no spec parsing involved)."""

from __future__ import annotations

import itertools
import random

from planner.flowgraph import max_flow
from planner.search.baselines import fits
from planner.problem import COORDINATOR, Link, NodeCapacity, PlacementProblem


def make_node(name: str, table, *, gpu: str = "G", region: str = "r0", max_layers: int | None = None,
              first: int | None = None, last: int | None = None, both: int | None = None):
    k = len(table) if max_layers is None else max_layers
    return NodeCapacity(name=name, gpu=gpu, region=region, throughput_tokens_per_s=tuple(table),
                        max_layers=k, max_layers_first=k if first is None else first,
                        max_layers_last=k if last is None else last,
                        max_layers_first_last=k if both is None else both, layer_latency_s=1e-3)


def make_problem(nodes, num_layers: int, node_cap: float = 1e9, coord_cap: float = 1e9,
                 inter_region_cap: float | None = None, drop=()) -> PlacementProblem:
    links = {}
    for a in nodes:
        links[(COORDINATOR, a.name)] = Link(coord_cap, 1e-3)
        links[(a.name, COORDINATOR)] = Link(coord_cap, 1e-3)
        for b in nodes:
            if a.name == b.name or (a.name, b.name) in drop:
                continue
            cap = node_cap if (a.region == b.region or inter_region_cap is None) else inter_region_cap
            links[(a.name, b.name)] = Link(cap, 1e-3 if a.region == b.region else 5e-2)
    return PlacementProblem("tiny", num_layers, tuple(nodes), links)


def random_table(rng: random.Random, kmax: int) -> tuple[float, ...]:
    """A decreasing table T(1..kmax), roughly T(1)/k with noise."""
    t1 = rng.uniform(50, 400)
    vals, prev = [], float("inf")
    for k in range(1, kmax + 1):
        v = min(prev * 0.98, t1 / k * rng.uniform(0.8, 1.2))
        vals.append(round(v, 3))
        prev = v
    return tuple(vals)


def random_problem(rng: random.Random, num_nodes: int, num_layers: int, kmax: int = 3,
                   regions: int = 1, inter_region_cap: float | None = None) -> PlacementProblem:
    kinds = [random_table(rng, rng.randint(1, kmax)) for _ in range(2)]
    nodes = []
    for i in range(num_nodes):
        kind = rng.randrange(len(kinds))
        table = kinds[kind]
        nodes.append(make_node(f"n{i}", table, gpu=f"K{kind}", region=f"r{rng.randrange(regions)}",
                               first=max(1, len(table) - rng.randint(0, 1))))
    return make_problem(nodes, num_layers, inter_region_cap=inter_region_cap)


def brute_force(problem: PlacementProblem, partial: bool) -> float:
    """Best max flow over every placement (each node unused or any range it fits)."""
    L = problem.num_layers
    options = []
    for n in problem.nodes:
        opts = [None] + [(s, e) for s in range(L) for e in range(s + 1, L + 1) if fits(n, s, e, L)]
        options.append(opts)
    best = 0.0
    for combo in itertools.product(*options):
        ranges = [r for r in combo if r is not None]
        if not _covers(ranges, L):
            continue
        placement = {n.name: r for n, r in zip(problem.nodes, combo) if r is not None}
        best = max(best, max_flow(problem, placement, partial).value_tokens_per_s)
    return best


def _covers(ranges, L: int) -> bool:
    """Cheap necessary condition for a positive flow: some chain of ranges reaches L from 0."""
    reach = {0}
    changed = True
    while changed:
        changed = False
        for s, e in ranges:
            if e not in reach and any(s <= b < e for b in reach):
                reach.add(e)
                changed = True
    return L in reach
