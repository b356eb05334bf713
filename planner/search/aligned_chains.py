"""Aligned chains: one chain per region, the regions' weak layers lined up against strong ones.

Where several regions can each hold the model, solving each region alone (the regional MILP)
leaves each region's integer waste where it falls: on geo24 (LLaMA-2 70B) the us-west chain runs
at its T4s' T(8) = 1,572 tokens/s while its L4s could carry 2,696. The slow links between regions
(763 tokens/s a pair there) carry too little for a pipeline to cross, but enough to even out a
few hundred tokens/s: a region whose chain is strong on some layers takes the other regions'
overflow there, over one link, and hands it back where its own chain ends.

So the search is over one chain per region (an order of its nodes and a layer count per node,
covering ``[0, L)``), scored by the *layer profile*: the sum over regions of the T(k) of the node
that holds each layer; its minimum is the flow every layer could carry if the links let the
regions even out (an upper limit on the chains' max flow, not a bound on the problem). Simulated
annealing swaps two nodes of a chain or moves layers from one node to another, keeping the
minimum and then the number of layers at it; every restart's best is measured by the exact max
flow (``planner.flowgraph.max_flow``), which alone decides, so the links count exactly.

On geo24 its chains reach the max flow of single24's best placement on the same nodes in one
region, for LLaMA-2 70B and LLaMA-1 30B alike: the regions cost nothing there, where the regional
MILP left each region's integer waste where it fell (BENCHMARKS.md, *Planner*).
"""

from __future__ import annotations

import math
import random
import time

from planner.flowgraph import Placement, max_flow
from planner.problem import NodeCapacity, PlacementProblem

Chain = list[tuple[str, int]]  # (node, layer count) in layer order, covering [0, L)


def aligned_chains(problem: PlacementProblem, seed: int = 0, partial: bool = True,
                   start: Placement | None = None, restarts: int = 4, steps: int = 20_000,
                   deadline_s: float = math.inf, min_layers: int = 1) -> Placement:
    """The best placement found (measured by the exact max flow), or {} when fewer than two
    regions can hold the model as a chain (of at most L nodes). Nodes of other regions keep
    their ``start`` ranges; a region's part of ``start`` that is a chain is where its search
    starts (else a balanced chain of its nodes). Every node of a chain holds >= ``min_layers``
    layers (``--max-depth``).

    ``restarts`` annealing runs of ``steps`` moves each, seeded from ``seed``: the result depends
    on them alone, unless ``time.perf_counter()`` passes ``deadline_s`` (checked between runs and
    every 1,000 moves), which ends the search early."""
    L = problem.num_layers
    chains: dict[str, Chain] = {}
    for region in sorted({n.region for n in problem.nodes}):
        members = [n for n in problem.nodes if n.region == region]
        if len(members) > L:   # a chain holds at most L nodes; such regions want stages
            continue
        chain = _start_chain(problem, members, start, min_layers) or \
            _balanced_chain(problem, members, min_layers)
        if chain:
            chains[region] = chain
    if len(chains) < 2:
        return {}
    fixed = {n: r for n, r in (start or {}).items() if problem.node(n).region not in chains}
    best_value, best = -1.0, {}
    for i in range(restarts):
        if time.perf_counter() >= deadline_s:
            break
        for found in _anneal(problem, chains, random.Random(seed * 1_000 + i), steps,
                             deadline_s, min_layers):
            placement = {**fixed, **_layout(found)}
            value = max_flow(problem, placement, partial).value_tokens_per_s
            if value > best_value:
                best_value, best = value, placement
    return best


def _start_chain(problem: PlacementProblem, members: list[NodeCapacity],
                 start: Placement | None, min_layers: int) -> Chain | None:
    """The region's part of ``start`` when it is one chain covering [0, L) (each layer once)."""
    if not start:
        return None
    ranges = sorted((start[n.name], n.name) for n in members if n.name in start)
    chain, at = [], 0
    for (s, e), name in ranges:
        if s != at:
            return None
        chain.append((name, e - s))
        at = e
    if at != problem.num_layers:
        return None
    return chain if _valid(problem, chain, min_layers) else None


def _balanced_chain(problem: PlacementProblem, members: list[NodeCapacity],
                    min_layers: int) -> Chain | None:
    """The chain of the region's nodes at the largest flow F every node can carry with as many
    layers as it holds anywhere (largest k >= ``min_layers`` with T(k) >= F), the overshoot
    taken off the longest ranges; nodes with no such k stay out. None when the region cannot
    hold the L layers so."""
    L = problem.num_layers

    def counts(F: float) -> list[int]:
        return [max((k for k in range(min_layers, _anywhere(n) + 1) if n.throughput(k) >= F),
                    default=0) for n in members]

    if sum(counts(0.0)) < L:
        return None
    lo, hi = 0.0, max(n.throughput(1) for n in members)
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(counts(mid)) >= L else (lo, mid)
    ks = counts(lo)
    over = sum(ks) - L
    while over > 0:
        i = max(range(len(ks)), key=lambda j: ks[j])
        cut = min(over, ks[i] - min_layers)
        if cut <= 0:   # every node at min_layers: one goes if that leaves L covered
            if over < min_layers:
                return None
            ks[i], cut = 0, 0
            over -= min_layers
        ks[i] -= cut
        over -= cut
    chain = [(n.name, k) for n, k in zip(members, ks) if k > 0]
    return chain if _valid(problem, chain, min_layers) else None


def _anywhere(node: NodeCapacity) -> int:
    """Most layers the node holds at any position of a chain (first, middle or last)."""
    return min(node.max_layers, node.max_layers_first, node.max_layers_last,
               len(node.throughput_tokens_per_s))


def _valid(problem: PlacementProblem, chain: Chain, min_layers: int = 1) -> bool:
    L, at = problem.num_layers, 0
    for name, k in chain:
        node = problem.node(name)
        if k < max(1, min_layers) or node.throughput(k) <= 0 or k > node.max_layers_for(at == 0, at + k == L):
            return False
        at += k
    return at == L


def _profile(problem: PlacementProblem, chain: Chain) -> list[float]:
    """T(k) of the node holding each layer."""
    out: list[float] = []
    for name, k in chain:
        out += [problem.node(name).throughput(k)] * k
    return out


def _score(total: list[float]) -> tuple[float, int]:
    """(least layer capacity, minus the layers within a hair of it): higher is better."""
    least = min(total)
    return least, -sum(1 for x in total if x <= least * (1 + 1e-9) + 1e-9)


#: Distinct best-scored chains of a run measured by the exact max flow: the profile ignores the
#: links, and on geo24 one run's best profile served 12,609 tokens/s where another as good by
#: the profile served 13,304.9.
KEEP = 8


def _anneal(problem: PlacementProblem, chains: dict[str, Chain], rng: random.Random, steps: int,
            deadline_s: float, min_layers: int) -> list[dict[str, Chain]]:
    """Simulated annealing on the layer profile; returns the best (up to ``KEEP``) chains seen,
    best first."""
    cur = {r: list(c) for r, c in chains.items()}
    prof = {r: _profile(problem, c) for r, c in cur.items()}
    L = problem.num_layers
    total = [sum(p[layer] for p in prof.values()) for layer in range(L)]
    score = _score(total)
    var = {r: _variation(p) for r, p in prof.items()}
    top: dict[tuple, tuple[tuple[float, int], dict[str, Chain]]] = {}
    kind = {n.name: (n.gpu, n.throughput_tokens_per_s, n.max_layers, n.max_layers_first,
                     n.max_layers_last) for n in problem.nodes}
    _keep(top, score, cur, kind)
    movable = [r for r in cur if len(cur[r]) > 1]
    if not movable:
        return [c for _, c in top.values()]
    temp0 = 0.003 * max(score[0], 1e-9)  # tokens/s a worse move may lose early on
    for step in range(steps):
        if step % 1_000 == 0 and time.perf_counter() >= deadline_s:
            break
        r = rng.choice(movable)
        chain = cur[r]
        i, j = rng.sample(range(len(chain)), 2)
        old = list(chain)
        if rng.random() < 0.5:
            chain[i], chain[j] = chain[j], chain[i]
        else:
            d = rng.choice((1, 1, 2))
            chain[i] = (chain[i][0], chain[i][1] - d)
            chain[j] = (chain[j][0], chain[j][1] + d)
        if not _valid(problem, chain, min_layers):
            cur[r] = old
            continue
        new_prof = _profile(problem, chain)
        new_total = [t - a + b for t, a, b in zip(total, prof[r], new_prof)]
        new_score = _score(new_total)
        new_var = _variation(new_prof)
        delta = (new_score[0] - score[0]) + 0.5 * temp0 / 30 * (new_score[1] - score[1]) \
            - VARIATION_WEIGHT * (new_var - var[r])
        temp = temp0 * (1 - step / steps) + 1e-9
        if delta >= 0 or rng.random() < math.exp(delta / temp):
            prof[r], total, score, var[r] = new_prof, new_total, new_score, new_var
            _keep(top, score, cur, kind)
        else:
            cur[r] = old
    return [c for _, c in sorted(top.values(), key=lambda t: t[0], reverse=True)]


#: Tokens/s of least layer capacity worth one tokens/s less of the regions' profile variation.
VARIATION_WEIGHT = 0.05


def _variation(profile: list[float]) -> float:
    """Total variation of a region's profile: each step between layers is flow that must
    change regions there, over links of a few hundred tokens/s."""
    return sum(abs(b - a) for a, b in zip(profile, profile[1:]))


def _keep(top: dict, score: tuple[float, int], chains: dict[str, Chain], kind: dict) -> None:
    """Add ``chains`` to the ``KEEP`` best-scored ones in ``top`` that differ in more than which
    of two interchangeable nodes (same ``kind``) holds which range."""
    if len(top) >= KEEP and score <= min(s for s, _ in top.values()):
        return
    key = tuple((r, tuple((kind[n], k) for n, k in c)) for r, c in sorted(chains.items()))
    if key in top:
        return
    top[key] = (score, {r: list(c) for r, c in chains.items()})
    if len(top) > KEEP:
        del top[min(top, key=lambda k: top[k][0])]


def _layout(chains: dict[str, Chain]) -> Placement:
    placement = {}
    for chain in chains.values():
        at = 0
        for name, k in chain:
            placement[name] = (at, at + k)
            at += k
    return placement
