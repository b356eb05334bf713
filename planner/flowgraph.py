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
from networkx.algorithms.flow import preflow_push

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
    """The flow graph (capacities in tokens/s) of ``placement`` on ``problem``'s cluster."""
    g = nx.DiGraph()
    g.add_node(SOURCE)
    g.add_node(SINK)
    L = problem.num_layers
    for name, (start, end) in placement.items():
        cap = problem.node(name).throughput(end - start)
        g.add_edge((name, "in"), (name, "out"), capacity=cap)
        if start == 0:
            _add_link(g, problem, COORDINATOR, name, SOURCE, (name, "in"))
        if end == L:
            _add_link(g, problem, name, COORDINATOR, (name, "out"), SINK)
    for i, (_, end_i) in placement.items():
        if end_i >= L:
            continue
        for j, (start_j, end_j) in placement.items():
            if i != j and arc_valid(end_i, start_j, end_j, partial_inference):
                _add_link(g, problem, i, j, (i, "out"), (j, "in"))
    return g


def _add_link(g: nx.DiGraph, problem: PlacementProblem, src: str, dst: str, u, v) -> None:
    link = problem.link(src, dst)
    if link is not None and link.capacity_tokens_per_s > 0:
        g.add_edge(u, v, capacity=link.capacity_tokens_per_s)


def max_flow(problem: PlacementProblem, placement: Placement,
             partial_inference: bool = True) -> FlowResult:
    """Max flow (tokens/s) of ``placement`` with every arc's flow, by networkx preflow-push."""
    g = build_graph(problem, placement, partial_inference)
    if not nx.has_path(g, SOURCE, SINK):
        return FlowResult(0.0, {}, {name: 0.0 for name in placement})
    # preflow-push keeps vertices in sets; with string-keyed vertices their order (and so which of
    # several equal-value flows comes out) would change with PYTHONHASHSEED. Integer labels, in
    # the graph's insertion order, make the arc flows the same in every process.
    keys = list(g.nodes)
    h = nx.relabel_nodes(g, {v: i for i, v in enumerate(keys)}, copy=True)
    value, flow = nx.maximum_flow(h, keys.index(SOURCE), keys.index(SINK), flow_func=preflow_push)
    arcs: dict[tuple[str, str], float] = {}
    nodes: dict[str, float] = {name: 0.0 for name in placement}
    for ui, out in flow.items():
        for vi, f in out.items():
            if f <= 0:
                continue
            u, v = keys[ui], keys[vi]
            if u[-1] == "in" and v[-1] == "out":
                nodes[u[0]] = f
                continue
            src = COORDINATOR if u == SOURCE else u[0]
            dst = COORDINATOR if v == SINK else v[0]
            arcs[(src, dst)] = f
    return FlowResult(float(value), arcs, nodes)
