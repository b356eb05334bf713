"""The flow graph of a placement and its max flow (networkx preflow-push).

Vertices: the coordinator is split into a source (tokens leave it for the first stage) and a sink
(tokens come back from the last stage); every node holding layers is split into ``in`` and ``out``
joined by an arc of capacity T(k). Network arcs carry the link capacity in tokens/s (already divided
by the bytes per token in ``planner.build``: token ids on coordinator links, hidden states between
nodes; an arc where both may travel uses the larger size, so the capacity is the smaller one).

An arc ``i -> j`` exists only where ``j`` can continue where ``i`` stops: ``start_j == end_i``, or,
with partial inference, ``start_j <= end_i < end_j`` (``j`` then runs only the layers ``i`` did not).
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx
from networkx.algorithms.flow import edmonds_karp, preflow_push

from helix.core.slices import Placement, as_placement
from planner.problem import COORDINATOR, PlacementProblem

SOURCE = ("source",)
SINK = ("sink",)


@dataclass(frozen=True)
class FlowResult:
    """A max flow: its value and the flow on every network arc (coordinator = source and sink)."""

    value_tokens_per_s: float
    arc_flows: dict[tuple[str, str], float]
    node_flows: dict[str, float]


def arc_valid(end_i: int, start_j: int, end_j: int, partial_inference: bool) -> bool:
    """Whether tokens leaving a stage that ends at ``end_i`` can continue on ``[start_j, end_j)``."""
    if partial_inference:
        return start_j <= end_i < end_j
    return start_j == end_i


def build_graph(problem: PlacementProblem, placement: Placement,
                partial_inference: bool = True, hubs: bool | None = None) -> nx.DiGraph:
    """The flow graph (capacities in tokens/s) of ``placement`` on ``problem``'s cluster, its
    vertices named ``SOURCE``, ``SINK``, ``(node, "in")``, ``(node, "out")`` and, where arcs are
    merged (``hubs``, see :func:`_int_graph`), ``("hub", layer, region, region, side)``."""
    g, names = _int_graph(problem, placement, partial_inference, hubs)
    return nx.relabel_nodes(g, dict(enumerate(names)), copy=True)


#: Above this many node-to-node arcs the flow graph merges arcs that cannot bind through hubs.
HUB_MIN_ARCS = 20_000


def _int_graph(problem: PlacementProblem, placement: Placement, partial_inference: bool,
               hubs: bool | None = None) -> tuple[nx.DiGraph, list[tuple]]:
    """The flow graph on integer vertices, and each vertex's name by number: 0 is ``SOURCE``, 1
    ``SINK``, then ``(node, "in")``, ``(node, "out")`` for each node in ``placement``'s order, then
    any hubs.

    preflow-push keeps vertices in sets; with the names as vertices their order (and so which of
    several equal-value flows comes out) would change with PYTHONHASHSEED. Integers, numbered in
    insertion order, make the arc flows the same in every process; the graph is built on them
    directly because relabelling a copy costs as much again as building it.

    Hubs (``hubs=None``: when there would be more than :data:`HUB_MIN_ARCS` node-to-node arcs): the
    arcs from the nodes of region A that end at layer b to the nodes of region B that can continue
    at b form a complete bipartite block. An arc never carries more than either of its nodes'
    T(k), so an arc whose link is at least that cannot bind; such arcs of a block go through a hub
    vertex (|S| + |R| arcs instead of |S| x |R|, see :func:`_block`), each hub arc carrying the
    T(k) of its node. A flow through a hub splits into pair flows of at most min(T_i, T_j) each, so
    the max flow is the same; :func:`max_flow` does that split."""
    names: list[tuple] = [SOURCE, SINK]
    arcs: list[tuple[int, int, float]] = []   # (u, v, capacity tokens/s), in a fixed order
    L = problem.num_layers
    link = problem.link
    cap: dict[str, float] = {}
    for name, (start, end) in placement.items():
        v_in = len(names)
        names += ((name, "in"), (name, "out"))
        cap[name] = problem.node(name).throughput(end - start)
        arcs.append((v_in, v_in + 1, cap[name]))
        if start == 0:
            _add_link(arcs, link(COORDINATOR, name), 0, v_in)
        if end == L:
            _add_link(arcs, link(name, COORDINATOR), v_in + 1, 1)
    vertex = {name: 2 + 2 * i for i, name in enumerate(placement)}   # (node, "in")
    ending: dict[int, list[str]] = {}     # layer b -> nodes whose range ends at b (b < L)
    taking: dict[int, list[str]] = {}     # layer b -> nodes that can continue at b
    for name, (start, end) in placement.items():
        if end < L:
            ending.setdefault(end, []).append(name)
        for b in (range(start, end) if partial_inference else (start,)):
            taking.setdefault(b, []).append(name)
    if hubs is None:
        hubs = sum(len(ending[b]) * len(taking.get(b, ())) for b in ending) > HUB_MIN_ARCS
    for b in sorted(ending):
        senders, receivers = ending[b], taking.get(b, [])
        if not hubs:
            for i in senders:
                for j in receivers:
                    _add_link(arcs, link(i, j), vertex[i] + 1, vertex[j])
            continue
        regions = sorted({problem.node(n).region for n in senders + receivers})
        by_region = {r: ([i for i in senders if problem.node(i).region == r],
                         [j for j in receivers if problem.node(j).region == r]) for r in regions}
        for ra in regions:
            for rb in regions:
                s_block, r_block = by_region[ra][0], by_region[rb][1]
                if s_block and r_block:
                    _block(arcs, names, link, cap, vertex, (b, ra, rb), s_block, r_block)
    g = nx.DiGraph()
    g.add_nodes_from(range(len(names)))
    g.add_weighted_edges_from(arcs, weight="capacity")
    return g, names


def _block(arcs, names, link, cap, vertex, where, senders: list[str], receivers: list[str]) -> None:
    """The arcs from ``senders`` to ``receivers`` (every pair valid), through hubs where exact.

    A sender whose links to every receiver are at least its own T(k) reaches them all through hub
    ``("hub", *where, "from")``; of the other senders, each receiver whose links from all of them
    are at least its own T(k) is reached through hub ``("hub", *where, "to")``; the pairs left
    (both ends faster than their link, or no link) keep their own arcs. Each pair is in exactly
    one of the three, and a hub's pairs are arcs that cannot bind."""
    def loose(i: str, j: str, by: str) -> bool:
        arc = link(i, j)
        return arc is not None and arc.capacity_tokens_per_s >= cap[by]

    free_senders = [i for i in senders if all(loose(i, j, i) for j in receivers)]
    rest = [i for i in senders if i not in set(free_senders)]
    free_receivers = [j for j in receivers if rest and all(loose(i, j, j) for i in rest)]
    for hub_senders, hub_receivers, side in ((free_senders, receivers, "from"),
                                            (rest, free_receivers, "to")):
        if hub_senders and hub_receivers:
            hub = len(names)
            names.append(("hub", *where, side))
            arcs.extend((vertex[i] + 1, hub, cap[i]) for i in hub_senders)
            arcs.extend((hub, vertex[j], cap[j]) for j in hub_receivers)
    taken = set(free_receivers)
    for i in rest:
        for j in receivers:
            if j not in taken:
                _add_link(arcs, link(i, j), vertex[i] + 1, vertex[j])


def capacity_table(problem: PlacementProblem, placement: Placement,
                   partial_inference: bool = True) -> dict:
    """The flow graph's capacities in plan-file form, so a server can re-solve the max flow on the
    nodes that are still alive: ``{"nodes": {node: tokens/s}, "arcs": [[src, dst, tokens/s]]}``
    with the coordinator as ``src`` of first-stage arcs and ``dst`` of last-stage ones."""
    g, names = _int_graph(problem, placement, partial_inference, hubs=False)
    nodes, arcs = {}, []
    for u, v, cap in g.edges(data="capacity"):
        a, b = names[u], names[v]
        if a != SOURCE and b != SINK and a[0] == b[0]:   # (node, "in") -> (node, "out")
            nodes[a[0]] = cap
        else:
            arcs.append([COORDINATOR if a == SOURCE else a[0], COORDINATOR if b == SINK else b[0], cap])
    return {"nodes": nodes, "arcs": arcs}


def with_flow_capacities(plan, problem: PlacementProblem):
    """``plan`` with its flow graph's capacities in ``extras["flow_capacities"]`` (see
    :func:`capacity_table`): what ``helix serve`` re-solves the max flow with when nodes die."""
    import dataclasses
    placement = as_placement(plan.placements)
    table = capacity_table(problem, placement, plan.partial_inference)
    return dataclasses.replace(plan, extras={**plan.extras, "flow_capacities": table})


def _add_link(arcs: list[tuple[int, int, float]], link, u: int, v: int) -> None:
    if link is not None and link.capacity_tokens_per_s > 0:
        arcs.append((u, v, link.capacity_tokens_per_s))


def max_flow(problem: PlacementProblem, placement: Placement,
             partial_inference: bool = True, hubs: bool | None = None) -> FlowResult:
    """Max flow (tokens/s) of ``placement`` with every arc's flow, by networkx preflow-push."""
    g, names = _int_graph(problem, placement, partial_inference, hubs)
    if not nx.has_path(g, 0, 1):
        return FlowResult(0.0, {}, {name: 0.0 for name in placement})
    try:
        value, flow = nx.maximum_flow(g, 0, 1, flow_func=preflow_push)
    except (IndexError, ValueError):
        # networkx's preflow-push can trip over floating-point residue (an excess of ~1e-11 left
        # at a vertex with no residual arc, networkx#7775), rarely, on float capacities. Edmonds-
        # Karp, an augmenting-path method, keeps no excess to go astray.
        value, flow = nx.maximum_flow(g, 0, 1, flow_func=edmonds_karp)
    arcs: dict[tuple[str, str], float] = {}
    nodes: dict[str, float] = {name: 0.0 for name in placement}
    through: dict[int, tuple[list, list]] = {}   # hub -> ([(sender, f)], [(receiver, f)])
    for ui, out in flow.items():
        for vi, f in out.items():
            if f <= 0:
                continue
            u, v = names[ui], names[vi]
            if len(v) > 2:   # ("hub", b, region, region, side); nodes are (name, "in" | "out")
                through.setdefault(vi, ([], []))[0].append((u[0], f))
            elif len(u) > 2:
                through.setdefault(ui, ([], []))[1].append((v[0], f))
            elif u[-1] == "in" and v[-1] == "out":
                nodes[u[0]] = f
            else:
                arcs[(COORDINATOR if u == SOURCE else u[0], COORDINATOR if v == SINK else v[0])] = f
    for hub in sorted(through):
        arcs.update(_split(*through[hub]))
    return FlowResult(float(value), arcs, nodes)


def _split(ins: list[tuple[str, float]], outs: list[tuple[str, float]]) -> dict:
    """Pair flows carrying a hub's inflows to its outflows (north-west corner: in order, each
    pair gets what is left of both; at most len(ins) + len(outs) - 1 pairs). Every pair's flow is
    at most its sender's and its receiver's, hence within the link (the hub's precondition)."""
    pairs: dict[tuple[str, str], float] = {}
    ins, outs = sorted(ins), sorted(outs)
    a = b = 0
    left_in, left_out = (ins[0][1] if ins else 0.0), (outs[0][1] if outs else 0.0)
    while a < len(ins) and b < len(outs):
        f = min(left_in, left_out)
        if f > 0:
            pairs[(ins[a][0], outs[b][0])] = pairs.get((ins[a][0], outs[b][0]), 0.0) + f
        left_in -= f
        left_out -= f
        # Rounding can leave one side a hair above 0 when both should be empty: move on at once.
        if left_in <= 1e-12 * max(1.0, ins[a][1]):
            a += 1
            left_in = ins[a][1] if a < len(ins) else 0.0
        if left_out <= 1e-12 * max(1.0, outs[b][1]):
            b += 1
            left_out = outs[b][1] if b < len(outs) else 0.0
    return pairs
