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
from typing import Mapping

import networkx as nx
from networkx.algorithms.flow import edmonds_karp, preflow_push

from planner.problem import COORDINATOR, PlacementProblem

#: node name -> half-open layer range [start, end). Nodes absent from the mapping hold nothing.
Placement = Mapping[str, tuple[int, int]]

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
                partial_inference: bool = True) -> nx.DiGraph:
    """The flow graph (capacities in tokens/s) of ``placement`` on ``problem``'s cluster, its
    vertices named ``SOURCE``, ``SINK``, ``(node, "in")`` and ``(node, "out")``."""
    g, names = _int_graph(problem, placement, partial_inference)
    return nx.relabel_nodes(g, dict(enumerate(names)), copy=True)


def _int_graph(problem: PlacementProblem, placement: Placement,
               partial_inference: bool) -> tuple[nx.DiGraph, list[tuple]]:
    """The flow graph on integer vertices, and each vertex's name by number: 0 is ``SOURCE``, 1
    ``SINK``, then ``(node, "in")``, ``(node, "out")`` for each node in ``placement``'s order.

    preflow-push keeps vertices in sets; with the names as vertices their order (and so which of
    several equal-value flows comes out) would change with PYTHONHASHSEED. Integers, numbered in
    insertion order, make the arc flows the same in every process; the graph is built on them
    directly because relabelling a copy costs as much again as building it."""
    names: list[tuple] = [SOURCE, SINK]
    arcs: list[tuple[int, int, float]] = []   # (u, v, capacity tokens/s), in a fixed order
    L = problem.num_layers
    link = problem.link
    for name, (start, end) in placement.items():
        v_in = len(names)
        names += ((name, "in"), (name, "out"))
        arcs.append((v_in, v_in + 1, problem.node(name).throughput(end - start)))
        if start == 0:
            _add_link(arcs, link(COORDINATOR, name), 0, v_in)
        if end == L:
            _add_link(arcs, link(name, COORDINATOR), v_in + 1, 1)
    ins = range(2, len(names), 2)   # (node, "in") of placement's nodes, in order
    for (i, (_, end_i)), i_in in zip(placement.items(), ins):
        if end_i >= L:
            continue
        for (j, (start_j, end_j)), j_in in zip(placement.items(), ins):
            if i != j and arc_valid(end_i, start_j, end_j, partial_inference):
                _add_link(arcs, link(i, j), i_in + 1, j_in)
    g = nx.DiGraph()
    g.add_nodes_from(range(len(names)))
    g.add_weighted_edges_from(arcs, weight="capacity")
    return g, names


def capacity_table(problem: PlacementProblem, placement: Placement,
                   partial_inference: bool = True) -> dict:
    """The flow graph's capacities in plan-file form, so a server can re-solve the max flow on the
    nodes that are still alive: ``{"nodes": {node: tokens/s}, "arcs": [[src, dst, tokens/s]]}``
    with the coordinator as ``src`` of first-stage arcs and ``dst`` of last-stage ones."""
    g, names = _int_graph(problem, placement, partial_inference)
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
    placement = {p.node: (p.start, p.end) for p in plan.placements}
    table = capacity_table(problem, placement, plan.partial_inference)
    return dataclasses.replace(plan, extras={**plan.extras, "flow_capacities": table})


def _add_link(arcs: list[tuple[int, int, float]], link, u: int, v: int) -> None:
    if link is not None and link.capacity_tokens_per_s > 0:
        arcs.append((u, v, link.capacity_tokens_per_s))


def max_flow(problem: PlacementProblem, placement: Placement,
             partial_inference: bool = True) -> FlowResult:
    """Max flow (tokens/s) of ``placement`` with every arc's flow, by networkx preflow-push."""
    g, names = _int_graph(problem, placement, partial_inference)
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
    for ui, out in flow.items():
        for vi, f in out.items():
            if f <= 0:
                continue
            u, v = names[ui], names[vi]
            if u[-1] == "in" and v[-1] == "out":
                nodes[u[0]] = f
                continue
            src = COORDINATOR if u == SOURCE else u[0]
            dst = COORDINATOR if v == SINK else v[0]
            arcs[(src, dst)] = f
    return FlowResult(float(value), arcs, nodes)
