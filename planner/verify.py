"""Independent checks run after every solve. A failure is a bug in the planner and raises.

* the placement respects every node's memory limit and the model's layer range;
* the arc flows form a feasible flow of the claimed value on the rebuilt graph (capacities,
  conservation, validity of every arc for the ranges);
* a second max-flow algorithm (Edmonds-Karp, not the preflow-push that produced the flows) gets the
  same value, to 1e-6 relative;
* where the MILP's objective is exact for this placement, it matches too.
"""

from __future__ import annotations

import networkx as nx
from networkx.algorithms.flow import edmonds_karp

from planner.flowgraph import SINK, SOURCE, FlowResult, Placement, arc_valid, build_graph
from planner.search.baselines import fits
from planner.problem import COORDINATOR, PlacementProblem

REL_TOL = 1e-6


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
    other = nx.maximum_flow_value(g, SOURCE, SINK, flow_func=edmonds_karp) if placement else 0.0
    if not _close(other, flows.value_tokens_per_s):
        raise PlannerBug(f"max flow mismatch: preflow-push {flows.value_tokens_per_s}, "
                         f"Edmonds-Karp {other}")
    if exact_objective is not None and not _close(exact_objective, flows.value_tokens_per_s):
        raise PlannerBug(f"solver objective {exact_objective} != max flow {flows.value_tokens_per_s}")
