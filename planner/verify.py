"""Independent checks run after every solve. A failure is a bug in the planner and raises.

* the placement respects every node's memory limit and the model's layer range;
* the arc flows form a feasible flow of the claimed value on the rebuilt graph (capacities,
  conservation, validity of every arc for the ranges);
* a second max-flow algorithm (not the preflow-push that produced the flows) gets the same value,
  to 1e-6 relative: Edmonds-Karp on small graphs, the max-flow LP solved by HiGHS's simplex above
  :data:`LP_MIN_ARCS` arcs (Edmonds-Karp took 105 s on a 1,000-node placement's 57k arcs, the
  LP a second);
* where the MILP's objective is exact for this placement, it matches too.
"""

from __future__ import annotations

import highspy
import networkx as nx
import numpy as np
from networkx.algorithms.flow import edmonds_karp

from planner.flowgraph import SINK, SOURCE, FlowResult, Placement, arc_valid, build_graph
from planner.search.baselines import fits
from planner.problem import COORDINATOR, PlacementProblem

REL_TOL = 1e-6
#: Graphs with more arcs than this are checked with the LP instead of Edmonds-Karp.
LP_MIN_ARCS = 5_000


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
    if g.number_of_edges() > LP_MIN_ARCS:
        other, how = lp_max_flow_value(g), "the max-flow LP (HiGHS)"
    else:
        how = "Edmonds-Karp"
        other = nx.maximum_flow_value(g, SOURCE, SINK, flow_func=edmonds_karp) if placement else 0.0
    if not _close(other, flows.value_tokens_per_s):
        raise PlannerBug(f"max flow mismatch: preflow-push {flows.value_tokens_per_s}, {how} {other}")
    if exact_objective is not None and not _close(exact_objective, flows.value_tokens_per_s):
        raise PlannerBug(f"solver objective {exact_objective} != max flow {flows.value_tokens_per_s}")


def lp_max_flow_value(g: nx.DiGraph) -> float:
    """Max flow from ``SOURCE`` to ``SINK`` of ``g`` as a linear program solved by HiGHS: one
    variable per arc in [0, capacity], conservation at every other vertex, maximize what leaves
    the source (nothing enters it: the flow graph has no arc into ``SOURCE``)."""
    index = {v: i for i, v in enumerate(v for v in g if v not in (SOURCE, SINK))}
    edges = list(g.edges(data="capacity"))
    rows, cols, vals = [], [], []
    for e, (u, v, _) in enumerate(edges):
        for vertex, sign in ((u, -1.0), (v, 1.0)):
            if vertex in index:
                rows.append(index[vertex])
                cols.append(e)
                vals.append(sign)
    order = np.lexsort((np.asarray(rows), np.asarray(cols)))   # column-wise, by column then row
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = len(edges), len(index)
    lp.sense_ = highspy.ObjSense.kMaximize
    lp.col_cost_ = np.array([1.0 if u == SOURCE else 0.0 for u, _, _ in edges])
    lp.col_lower_ = np.zeros(len(edges))
    lp.col_upper_ = np.array([cap for _, _, cap in edges], dtype=float)
    lp.row_lower_ = lp.row_upper_ = np.zeros(len(index))
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = len(edges), len(index)
    lp.a_matrix_.start_ = np.searchsorted(np.asarray(cols)[order], np.arange(len(edges) + 1)
                                          ).astype(np.int32)
    lp.a_matrix_.index_ = np.asarray(rows, dtype=np.int32)[order]
    lp.a_matrix_.value_ = np.asarray(vals)[order]
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)
    h.passModel(lp)
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        raise PlannerBug(f"the max-flow LP check ended {h.modelStatusToString(h.getModelStatus())}")
    return float(h.getInfo().objective_function_value)
