"""The max flow of a plan re-solved on the nodes that are still alive: routing around a dead node at
once, with IWRR weights that fit the surviving placement.

``helix plan`` writes the flow graph's capacities into the plan (``extras["flow_capacities"]``:
each node's tokens/s for the layers it holds, each usable arc's tokens/s, the coordinator as the
source and sink). :func:`surviving_flows` solves the max flow over the live nodes only (networkx,
node capacities as in/out arcs, as the planner builds its graph) and returns arc flows in the plan's
form; :func:`rebuilt` builds a scheduler on them that takes over the old one's reservations, so
requests in flight keep their KV accounting. A plan without capacities (hand-made ones) keeps its
flows: dead nodes are then only masked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import networkx as nx

from coordinator.kv_estimator import KVEstimator
from coordinator.schedulers import HelixScheduler
from helix.core.plan import COORDINATOR, ArcFlow, Plan

_SOURCE, _SINK = ("coordinator", "source"), ("coordinator", "sink")


def surviving_flows(plan: Plan, alive: set[str]) -> tuple[ArcFlow, ...] | None:
    """Arc flows of the max flow over ``alive`` nodes with the plan's capacities; None when the plan
    carries no capacities or nothing can flow (no pipeline is left)."""
    table = plan.extras.get("flow_capacities")
    if not table:
        return None
    g = nx.DiGraph()
    for node, cap in table["nodes"].items():
        if node in alive:
            g.add_edge((node, "in"), (node, "out"), capacity=float(cap))
    for src, dst, cap in table["arcs"]:
        if (src != COORDINATOR and src not in alive) or (dst != COORDINATOR and dst not in alive):
            continue
        u = _SOURCE if src == COORDINATOR else (src, "out")
        v = _SINK if dst == COORDINATOR else (dst, "in")
        g.add_edge(u, v, capacity=float(cap))
    if _SOURCE not in g or _SINK not in g or not nx.has_path(g, _SOURCE, _SINK):
        return None
    value, flow = nx.maximum_flow(g, _SOURCE, _SINK)
    if value <= 0:
        return None
    arcs = []
    for u, targets in sorted(flow.items(), key=lambda kv: str(kv[0])):
        for v, f in sorted(targets.items(), key=lambda kv: str(kv[0])):
            if f > 0 and not (u[0] == v[0] and u[1] == "in"):   # not a node's own in -> out arc
                arcs.append(ArcFlow(COORDINATOR if u == _SOURCE else u[0],
                                    COORDINATOR if v == _SINK else v[0], f))
    return tuple(arcs)


def rebuilt(old: HelixScheduler, plan: Plan, flows: tuple[ArcFlow, ...], kv: KVEstimator,
            make: Callable[[Plan, KVEstimator], HelixScheduler]) -> HelixScheduler:
    """A scheduler for ``plan`` with ``flows`` (``make`` builds it, on the same KV estimator) that
    keeps the old one's requests in flight: their pipelines and per-node counts carry over, so
    releasing them later frees exactly what they reserved."""
    total = sum(a.flow_tokens_per_s for a in flows if a.src == COORDINATOR)
    new = make(dataclasses.replace(plan, arc_flows=flows, max_flow_tokens_per_s=total), kv)
    new.take_over(old)
    return new
