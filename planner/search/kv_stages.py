"""KV stages: one copy of the weights as a chain of one-kind stages, split to hold the most requests.

Users get the requests in flight over the round trip (``helix.core.costmodel``, *Inside a pipeline*);
on a cluster whose nodes hold the model only a few times over, the requests in flight are bound
by the KV of the stage that keeps the least of it per layer it holds. The max flow rewards every
copy of the weights and every layer a node can hold, so its placements (the capped-KV re-solve
too) leave that bound where the biggest GPUs are: on single24 the four A100s hold 46 layers and
keep KV for ~270 requests while the L4s and T4s behind them use a quarter of theirs.

A candidate here is a chain of stages, each GPU kind (nodes with the same GPU and GPU count)
cut into ``s`` stages of ``n / s`` nodes (``s`` a divisor of its ``n``) holding ``l`` layers
each, kinds in order of their memory (most first: the first stage also holds the embedding, the
biggest nodes the most layers), ``sum over kinds of s * l`` = the model's layers, at most
:data:`MAX_STAGES` stages. For each choice of stage counts, the layer splits that hold the most
requests in flight are kept: a stage of ``w`` nodes with ``l`` layers holds
``w * kv_capacity_tokens(node, l)`` tokens on each layer (every request passes one of its
nodes), and the chain holds the least of its stages'. Their compute
is left to the caller's prediction, which scores every candidate (``planner.predicted``).

On a cluster of several regions a chain runs over one or more regions in a given order (each
region's kinds by memory, most first or least first: which stages meet at a slow link decides
how many node pairs share its traffic), crossing each slow link once; :func:`region_partitions`
lists the ways to cut the regions into chains (``planner.predicted.kv_stage_candidates`` keeps,
per chain, the split predicted to serve the most among those holding the most, and scores each
way as a whole): on geo24 one chain through all three regions, the US-East A100s first, holds
KV for ~570 requests where the A100s alone held ~30 and a chain over the EU and US-West ~260.
At most :data:`MAX_CHOICES` choices of stage counts per chain (the product over its kinds of
their divisors: 72 on single24, 288 for geo24's three regions together; hetero42's seven kinds
give 6,912 and are skipped) and
:data:`MAX_REGIONS` regions. Pure and deterministic, unless a caller's deadline stops the search.
"""

from __future__ import annotations

import itertools
import time

from helix.core.costmodel import CostModel
from helix.core.spec import ClusterSpec, NodeSpec

#: Choices of per-kind stage counts enumerated at most (each gives up to :data:`PER_CHOICE`
#: candidates, each scored by a prediction of ~30 ms on 24 nodes).
MAX_CHOICES = 512

#: Layer splits kept per choice of stage counts (the ones holding the most requests).
PER_CHOICE = 2

#: Stages in a chain at most. The prediction that scores the candidates takes a pipeline's
#: decodes to travel in two waves (``planner.prediction.DECODE_WAVES``, measured on 10- and
#: 12-stage chains); deeper chains keep more waves apart and it overstates them (single24,
#: 300 s offline at a 256-token budget: 16 stages predicted 783 decode tokens/s, simulated 591;
#: 18 stages 768 vs 508; 12 stages 726 vs 633), so choosing among them by it would not hold.
#: 14 stages still hold where slow links set the round trip: geo24's chains through all three
#: regions (600 s offline at 256: 457 predicted, 480 simulated; 457 vs 477), and single24 keeps
#: its 12-stage pick (its best 14-stage chain is predicted 1 % below).
MAX_STAGES = 14

#: Regions at most for chains across regions (5 regions have 501 ways to form chains).
MAX_REGIONS = 4


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _kinds(nodes: list[NodeSpec]) -> list[list[NodeSpec]]:
    """``nodes`` grouped by (GPU, GPU count), most memory per node first (ties: given order)."""
    groups: dict[tuple[str, int], list[NodeSpec]] = {}
    for n in nodes:
        groups.setdefault((n.gpu, n.num_gpus), []).append(n)
    return sorted(groups.values(), key=lambda g: -g[0].vram_bytes)


def chain_placements(spec: ClusterSpec, cost: CostModel, num_layers: int,
                     regions: tuple[str, ...], most_holding: int | None = None,
                     deadline_s: float | None = None
                     ) -> list[tuple[str, dict[str, tuple[int, int]]]]:
    """Chains over the nodes of ``regions``, in that order (each region's kinds by memory, most
    first; over several regions also least first, :func:`_kind_orders`), as ``(name, {node:
    (start, end)})`` in a fixed order; [] when there are more than :data:`MAX_CHOICES` choices of
    stage counts or none holds the model. ``most_holding``: only that many, the ones whose KV
    holds the most tokens per layer (ties: the earlier), in the same order. ``deadline_s``
    (``time.perf_counter``'s clock): the search stops there with the chains found so far."""
    orders = _kind_orders(spec, regions)   # the same kinds in each order: one count of choices
    if not orders[0] or _product(len(_divisors(len(g))) for g in orders[0]) > MAX_CHOICES:
        return []
    found: list[tuple[float, str, dict[str, tuple[int, int]]]] = []
    for kinds in orders:
        # Most layers a node of each kind holds anywhere in the chain (first / last stage too).
        most = [min(cost.max_layers(g[0], first=f, last=la) for f in (False, True)
                    for la in (False, True)) for g in kinds]
        for stages in itertools.product(*(_divisors(len(g)) for g in kinds)):
            if sum(stages) > MAX_STAGES:
                continue
            if deadline_s is not None and time.perf_counter() > deadline_s:
                break
            for held, layers in _splits(kinds, stages, most, cost, num_layers, deadline_s):
                found.append((held, _name(kinds, stages, layers, len(regions) > 1),
                              _layout(kinds, stages, layers)))
    if most_holding is not None and len(found) > most_holding:
        keep = sorted(range(len(found)), key=lambda i: -found[i][0])[:most_holding]
        found = [found[i] for i in sorted(keep)]
    return [(name, layout) for _, name, layout in found]


def _kind_orders(spec: ClusterSpec, regions: tuple[str, ...]) -> list[list[list[NodeSpec]]]:
    """The kinds of a chain over ``regions``, in order: each region's by memory, most first; in a
    chain over several regions also least first (every combination over the regions of more
    than one kind). Where the chain crosses a slow link, every node pair of the two stages
    there is a link, and a prompt's hidden states take a second per pair (geo24); which kinds
    meet there decides how many pairs share that traffic (the A100s then 8 US-West T4s, 4 pairs
    at the first stage of 2x4, rather than 2 L4s, 2 pairs: 480 against 322 decode tokens/s
    simulated, BENCHMARKS.md, *Plan vs simulator*)."""
    per_region = [_kinds([n for n in spec.nodes if spec.region_of(n.name) == r]) for r in regions]
    if len(regions) == 1:
        return [per_region[0]]
    options = [[g] if len(g) < 2 else [g, g[::-1]] for g in per_region]
    return [[k for region in choice for k in region] for choice in itertools.product(*options)]


def kv_stage_placements(spec: ClusterSpec, cost: CostModel, num_layers: int
                        ) -> list[tuple[str, dict[str, tuple[int, int]]]]:
    """Candidate placements of a single-region cluster (module docstring); [] for a cluster of
    several regions (:func:`region_chains` and :func:`region_partitions` build those) or too
    many choices."""
    regions = sorted({spec.region_of(n.name) for n in spec.nodes})
    return chain_placements(spec, cost, num_layers, tuple(regions)) if len(regions) == 1 else []


def region_partitions(regions: list[str]) -> list[list[tuple[str, ...]]]:
    """Every way to cut ``regions`` into chains: a set partition, each block in every order
    (3 regions: 13 ways, 4: 73), in a fixed order; [] for more than :data:`MAX_REGIONS`. A
    chain crosses from one region to the next once."""
    if len(regions) > MAX_REGIONS:
        return []
    return _partitions(regions)


def _partitions(regions: list[str]) -> list[list[tuple[str, ...]]]:
    if not regions:
        return [[]]
    first, rest = regions[0], regions[1:]
    out = []
    for size in range(len(rest) + 1):
        for others in itertools.combinations(rest, size):
            left = [r for r in rest if r not in others]
            for tail in _partitions(left):
                for block in itertools.permutations((first, *others)):
                    out.append([block, *tail])
    return out


def _product(values) -> int:
    out = 1
    for v in values:
        out *= v
    return out


def _splits(kinds: list[list[NodeSpec]], stages: tuple[int, ...], most: list[int],
            cost: CostModel, num_layers: int, deadline_s: float | None = None
            ) -> list[tuple[float, tuple[int, ...]]]:
    """The :data:`PER_CHOICE` layer splits (layers per stage of each kind, each >= 1, within
    ``most``, ``sum s * l = num_layers``) whose chain holds the most tokens per layer (ties: the
    first in lexicographic order). Depth-first in lexicographic order, pruned where no completion
    can enter the kept list: a kind's held tokens only bound the chain's from above, and the
    layers left must fit the kinds left (the same answer as trying every split; a test checks).
    Past ``deadline_s``, the splits found so far."""
    held_by = [{l: len(g) // s * cost.kv_capacity_tokens(g[0], l) for l in range(1, m + 1)}
               for g, s, m in zip(kinds, stages, most)]
    n = len(kinds)
    # Layers the kinds from i on can take at least / at most.
    low = [sum(stages[i:]) for i in range(n + 1)]
    high = [sum(s * m for s, m in zip(stages[i:], most[i:])) for i in range(n + 1)]
    found: list[tuple[float, tuple[int, ...]]] = []   # best first; ties: the earlier first

    def full() -> bool:
        return len(found) >= PER_CHOICE

    def visit(i: int, left: int, held: float, head: tuple[int, ...]) -> None:
        if full() and held <= found[-1][0]:
            return   # every completion holds <= held: it cannot displace the kept ones
        if deadline_s is not None and time.perf_counter() > deadline_s:
            return
        if i == n - 1:
            if left % stages[i] or not 1 <= left // stages[i] <= most[i]:
                return
            l = left // stages[i]
            value = min(held, held_by[i][l])
            if value > 0 and not (full() and value <= found[-1][0]):
                found.append((value, (*head, l)))
                found.sort(key=lambda t: -t[0])   # stable: the earlier first among ties
                del found[PER_CHOICE:]
            return
        for l in range(1, most[i] + 1):
            rest = left - stages[i] * l
            if rest < low[i + 1]:
                break
            if rest > high[i + 1]:
                continue
            visit(i + 1, rest, min(held, held_by[i][l]), (*head, l))

    visit(0, num_layers, float("inf"), ())
    return found


def _layout(kinds: list[list[NodeSpec]], stages: tuple[int, ...], layers: tuple[int, ...]
            ) -> dict[str, tuple[int, int]]:
    out, at = {}, 0
    for group, s, l in zip(kinds, stages, layers):
        width = len(group) // s
        for i in range(s):
            for node in group[i * width:(i + 1) * width]:
                out[node.name] = (at, at + l)
            at += l
    return out


def _name(kinds: list[list[NodeSpec]], stages: tuple[int, ...], layers: tuple[int, ...],
          regions: bool = False) -> str:
    parts = [f"{s}x{len(g) // s} {g[0].gpu}{f' ({g[0].region})' if regions else ''} x {l}"
             for g, s, l in zip(kinds, stages, layers)]
    return "kv stages: " + ", ".join(parts)

