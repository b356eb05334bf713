"""Independent checks run after every solve. A failure is a bug in the planner and raises.

* the placement respects every node's memory limit and the model's layer range;
* the arc flows form a feasible flow of the claimed value on the rebuilt graph (capacities,
  conservation, validity of every arc for the ranges);
* the value is the max flow, to 1e-6 relative: a second max-flow algorithm (Edmonds-Karp, not the
  preflow-push that produced the flows) gets it on small graphs; above :data:`CUT_MIN_ARCS` arcs
  the flow must leave a cut of that capacity (:func:`cut_capacity`, a proof in linear time);
* where the MILP's objective is exact for this placement, it matches too.
"""

from __future__ import annotations

import networkx as nx
from networkx.algorithms.flow import edmonds_karp

from planner.flowgraph import SINK, SOURCE, FlowResult, Placement, arc_valid, build_graph
from planner.search.baselines import fits
from planner.problem import COORDINATOR, PlacementProblem

REL_TOL = 1e-6
#: Graphs with more arcs than this are checked with a min-cut certificate instead of Edmonds-Karp.
CUT_MIN_ARCS = 5_000


class PlannerBug(AssertionError):
    """The planner produced something inconsistent: never a user error."""


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= REL_TOL * max(1.0, abs(a), abs(b))


def check_placement(problem: PlacementProblem, placement: Placement) -> None:
    names = {n.name for n in problem.nodes}
    for name, (s, e) in placement.items():
        if name not in names:
            raise PlannerBug(f"placement names unknown node {name!r}")
        if not fits(problem.node(name), s, e, problem.num_layers):
            raise PlannerBug(f"{name} cannot hold [{s}, {e}) (memory or table limit)")


def check_flow(problem: PlacementProblem, placement: Placement, flows: FlowResult,
               partial_inference: bool) -> None:
    L = problem.num_layers
    net_in: dict[str, float] = {n: 0.0 for n in placement}
    net_out: dict[str, float] = {n: 0.0 for n in placement}
    src_total = sink_total = 0.0
    for (u, v), f in flows.arc_flows.items():
        link = problem.link(u, v)
        if link is None or f > link.capacity_tokens_per_s * (1 + REL_TOL) + REL_TOL:
            raise PlannerBug(f"arc {u}->{v} carries {f} over its capacity")
        if u == COORDINATOR:
            if placement[v][0] != 0:
                raise PlannerBug(f"coordinator feeds {v} which does not start at layer 0")
            src_total += f
        elif v == COORDINATOR:
            if placement[u][1] != L:
                raise PlannerBug(f"{u} returns to the coordinator without the last layer")
            sink_total += f
        elif not arc_valid(placement[u][1], *placement[v], partial_inference):
            raise PlannerBug(f"arc {u}->{v} is not valid for {placement[u]} -> {placement[v]}")
        if u != COORDINATOR:
            net_out[u] += f
        if v != COORDINATOR:
            net_in[v] += f
    for n in placement:
        (s, e) = placement[n]
        if not _close(net_in[n], net_out[n]):
            raise PlannerBug(f"flow not conserved at {n}: in {net_in[n]}, out {net_out[n]}")
        if net_in[n] > problem.node(n).throughput(e - s) * (1 + REL_TOL) + REL_TOL:
            raise PlannerBug(f"{n} carries {net_in[n]} over T({e - s})")
    if not (_close(src_total, flows.value_tokens_per_s) and _close(sink_total, src_total)):
        raise PlannerBug(f"flow value {flows.value_tokens_per_s} but source sends {src_total}, "
                         f"sink gets {sink_total}")


def verify(problem: PlacementProblem, placement: Placement, flows: FlowResult,
           partial_inference: bool, exact_objective: float | None = None) -> None:
    """Run every check; ``exact_objective`` is a solver value that must equal the max flow."""
    check_placement(problem, placement)
    check_flow(problem, placement, flows, partial_inference)
    g = build_graph(problem, placement, partial_inference)
    if g.number_of_edges() > CUT_MIN_ARCS:
        other, how = cut_capacity(g, flows), "the min cut it leaves, of capacity"
    else:
        how = "Edmonds-Karp"
        other = nx.maximum_flow_value(g, SOURCE, SINK, flow_func=edmonds_karp) if placement else 0.0
    if not _close(other, flows.value_tokens_per_s):
        raise PlannerBug(f"max flow mismatch: preflow-push {flows.value_tokens_per_s}, {how} {other}")
    if exact_objective is not None and not _close(exact_objective, flows.value_tokens_per_s):
        raise PlannerBug(f"solver objective {exact_objective} != max flow {flows.value_tokens_per_s}")


def cut_capacity(g: nx.DiGraph, flows: FlowResult) -> float:
    """Capacity of the cut that ``flows`` leaves in ``g`` (max-flow min-cut certificate).

    The vertices reachable from ``SOURCE`` in the residual graph of the claimed flow form a cut; if
    ``SINK`` is among them an augmenting path remains (PlannerBug). Every flow is at most any cut's
    capacity, so a feasible flow (``check_flow``) whose value equals this capacity is maximal: a
    proof in O(arcs), where Edmonds-Karp took 105 s on a 1,000-node placement's 57k arcs. Hub
    vertices (``planner.flowgraph``) carry the sum of their pairs' flows."""
    def on(u, v) -> float:   # the claimed flow on arc u -> v of g (hub arcs: see below)
        if u == SOURCE:
            return flows.arc_flows.get((COORDINATOR, v[0]), 0.0)
        if v == SINK:
            return flows.arc_flows.get((u[0], COORDINATOR), 0.0)
        if u[0] == v[0] and u[-1] == "in":
            return flows.node_flows.get(u[0], 0.0)
        return flows.arc_flows.get((u[0], v[0]), 0.0)

    hub_flow: dict[tuple, float] = {}
    receivers = {h: set(w[0] for w in g.successors(h)) for h in g if len(h) > 2}
    for (i, j), f in flows.arc_flows.items():
        if COORDINATOR in (i, j) or g.has_edge((i, "out"), (j, "in")):
            continue
        hub = next((h for h in g.successors((i, "out")) if len(h) > 2 and j in receivers[h]), None)
        if hub is None:
            raise PlannerBug(f"arc {i}->{j} carries {f} but the flow graph has no path for it")
        hub_flow[((i, "out"), hub)] = hub_flow.get(((i, "out"), hub), 0.0) + f
        hub_flow[(hub, (j, "in"))] = hub_flow.get((hub, (j, "in")), 0.0) + f
    residual: dict = {}
    for u, v, cap in g.edges(data="capacity"):
        f = hub_flow.get((u, v), 0.0) if len(u) > 2 or len(v) > 2 else on(u, v)
        tol = 1e-9 * max(1.0, cap)
        if cap - f > tol:
            residual.setdefault(u, []).append(v)
        if f > tol:
            residual.setdefault(v, []).append(u)
    reached, todo = {SOURCE}, [SOURCE]
    while todo:
        for w in residual.get(todo.pop(), ()):
            if w not in reached:
                reached.add(w)
                todo.append(w)
    if SINK in reached:
        raise PlannerBug(f"the flow of {flows.value_tokens_per_s} is not maximal: an augmenting "
                         "path remains")
    return sum(cap for u, v, cap in g.edges(data="capacity") if u in reached and v not in reached)
