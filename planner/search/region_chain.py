"""Region chains: a warm start for clusters whose slow links between regions bind.

Where no region can hold the model, every token crosses between regions, and a crossing is one
link between one sender and one receiver (a few hundred tokens/s on a 100 Mb/s link for a 70B
hidden state). A chain of single nodes then serves no more than one link carries. So, for a target
flow F and an order of the regions, the chain runs through the regions in turn and, at each
crossing, the last stage of one region (m_out nodes holding the same layers) meets the first stage
of the next (m_in nodes) so that m_out * m_in * c >= F (c: the typical link between the two
regions). Inside a region, nodes form stages of interchangeable nodes, chosen per group by the
stage knapsack of ``planner.search.construct`` (m nodes holding k layers carry m T(k) >= F).

The largest F (scanned down from the bound) whose stages cover every layer wins; each candidate is
measured by the exact max flow and the best is returned, so the rough link figure c only guides
the search.
"""

from __future__ import annotations

import itertools
import statistics
from collections import defaultdict

from planner.flowgraph import Placement, max_flow
from planner.problem import NodeCapacity, PlacementProblem
from planner.search.baselines import fits
from planner.search.bounds import fixed_point_bound
from planner.search.construct import class_stage_dp

Group = tuple[NodeCapacity, tuple[str, ...]]  # (a member, every member's name)


def region_chain(problem: PlacementProblem, seed: int = 0, partial: bool = True) -> Placement:
    regions = sorted({n.region for n in problem.nodes})
    if len(regions) < 2 or len(regions) > 4:
        return {}
    groups = _groups(problem)
    links = _typical_links(problem)
    upper = fixed_point_bound(problem)
    best: tuple[float, Placement] = (0.0, {})
    for F in (upper * (1 - 0.01 * i) for i in range(80)):
        found = [p for order in itertools.permutations(regions)
                 for p in [_chain(problem, groups, links, order, F)] if p]
        for placement in found:
            value = max_flow(problem, placement, partial).value_tokens_per_s
            if value > best[0]:
                best = (value, placement)
        if best[0] > 0 and F < best[0]:
            break  # lower targets cannot serve more than the best already measured
    return best[1]


def _groups(problem: PlacementProblem) -> dict[str, list[Group]]:
    """Per region, nodes with the same table and memory limits, strongest first."""
    by_key: dict[tuple, list[NodeCapacity]] = defaultdict(list)
    for n in problem.nodes:
        by_key[(n.region, n.throughput_tokens_per_s, n.max_layers, n.max_layers_first,
                n.max_layers_last)].append(n)
    out: dict[str, list[Group]] = defaultdict(list)
    for (region, *_), members in sorted(by_key.items(), key=lambda kv: kv[1][0].name):
        members.sort(key=lambda n: n.name)
        out[region].append((members[0], tuple(m.name for m in members)))
    for region in out:
        out[region].sort(key=lambda g: (-g[0].throughput(1), g[1][0]))
    return out


def _typical_links(problem: PlacementProblem) -> dict[tuple[str, str], float]:
    """(region r, region q) -> median capacity of the links from r's nodes to q's."""
    region = {n.name: n.region for n in problem.nodes}
    caps: dict[tuple[str, str], list[float]] = defaultdict(list)
    for (a, b), link in problem.links.items():
        if a in region and b in region and region[a] != region[b]:
            caps[region[a], region[b]].append(link.capacity_tokens_per_s)
    return {k: statistics.median(v) for k, v in caps.items()}


def _largest_k(node: NodeCapacity, m: int, F: float, L: int) -> int:
    """Most layers m such nodes hold side by side while carrying F between them."""
    return max((k for k in range(1, min(len(node.throughput_tokens_per_s), node.max_layers, L) + 1)
                if m * node.throughput(k) >= F), default=0)


def _chain(problem, groups, links, order, F) -> Placement:
    """Stages region by region for target F, or {} when they cannot cover every layer."""
    L = problem.num_layers
    plan: list[tuple[Group, int, int]] = []  # (group, k, m) in chain order
    m_prev = None
    for t, region in enumerate(order):
        left = {g[1]: len(g[1]) for g in groups[region]}
        head = []
        if m_prev is not None:  # the first stage takes the crossing from the previous region
            c = links.get((order[t - 1], region), 0.0)
            stage = _crossing_stage(groups[region], left, F, c * m_prev, L)
            if stage is None:
                return {}
            head = [stage]
        body = [(g, k, m) for g in groups[region]
                for k, m in class_stage_dp(g[0], left[g[1]], F, L)]
        last = t == len(order) - 1
        if not last and body:  # the widest stage goes last: it sends over the slow links
            widest = max(range(len(body)), key=lambda i: (body[i][2], -i))
            body.append(body.pop(widest))
        stages = head + body
        if not stages:
            return {}
        plan += stages
        m_prev = stages[-1][2]
    return _lay_out(problem, plan, L)


def _crossing_stage(region_groups, left, F, carried_per_receiver, L):
    """The first stage of a region: nodes of one group that take F over ``carried_per_receiver``
    each, chosen for the most layers the whole region then covers (this stage plus the stages
    of the nodes left, ``class_stage_dp``): the nodes it takes would hold layers there too (on
    3cluster24 three T4 x 4 layers beat three L4 x 6: the L4s hold 3 layers each at F alone)."""
    if carried_per_receiver <= 0:
        return None
    need = -int(-F // carried_per_receiver)
    best, best_cover = None, -1
    for g in region_groups:
        for m in range(max(1, need), left[g[1]] + 1):
            k = _largest_k(g[0], m, F, L)
            if k > 0:
                rest = {**left, g[1]: left[g[1]] - m}
                cover = k + sum(kk for h in region_groups
                                for kk, _ in class_stage_dp(h[0], rest[h[1]], F, L))
                if cover > best_cover:
                    best, best_cover = (g, k, m), cover
                break
    if best is not None:
        left[best[0][1]] -= best[2]
    return best


def _lay_out(problem, plan, L) -> Placement:
    """Consecutive layer ranges along ``plan``; the overshoot is trimmed from the largest stages."""
    plan = list(plan)
    over = sum(k for _, k, _ in plan) - L
    if over < 0:
        return {}
    while over > 0:
        i = max(range(len(plan)), key=lambda j: plan[j][1])
        g, k, m = plan[i]
        if k <= 1:
            return {}
        cut = min(over, k - 1)
        plan[i] = (g, k - cut, m)
        over -= cut
    used: dict[tuple[str, ...], int] = defaultdict(int)
    placement: dict[str, tuple[int, int]] = {}
    s = 0
    for (proto, names), k, m in plan:
        e = s + k
        for _ in range(m):
            if used[names] >= len(names):
                return {}
            name = names[used[names]]
            used[names] += 1
            if fits(problem.node(name), s, e, L):
                placement[name] = (s, e)
        s = e
    return placement
