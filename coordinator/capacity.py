"""How much of a plan's capacity a set of nodes still serves (``/health``, the
``helix:cluster_capacity_fraction`` gauge, and the waiting queue's bound).

The plan's capacity is its max flow (tokens/s from the coordinator through the pipelines and back).
With the flow graph's capacities in the plan (``extras["flow_capacities"]``, as ``helix plan``
writes them) the max flow is solved again over the serving nodes only
(:func:`coordinator.reflow.surviving_flows`, the flow the coordinator then routes on), so a node
that others can stand in for costs less than its own share. Without them, each of the plan's
pipelines (:func:`helix.core.pipelines.enumerate_pipelines`) counts with its share of the requests when
all its nodes serve.

Pure: a plan and a set of node names in, a number out; results are kept per set of nodes.
"""

from __future__ import annotations

from collections.abc import Iterable

from coordinator.reflow import surviving_flows
from helix.core.pipelines import enumerate_pipelines
from helix.core.plan import COORDINATOR, Plan


class Capacity:
    """The serving share of one plan's capacity, per set of serving nodes."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self._everyone = frozenset(p.node for p in plan.placements if p.end > p.start)
        self._has_table = bool(plan.extras.get("flow_capacities"))
        self._pipelines = None if self._has_table else enumerate_pipelines(plan)
        self._cache: dict[frozenset[str], float] = {}
        self.full_tokens_per_s = self._flow(self._everyone) if self._has_table else \
            plan.max_flow_tokens_per_s
        """The plan's capacity with every node serving (tokens/s)."""

    def _flow(self, nodes: frozenset[str]) -> float:
        flows = surviving_flows(self.plan, set(nodes))
        return 0.0 if flows is None else sum(a.flow_tokens_per_s for a in flows if a.src == COORDINATOR)

    def fraction(self, serving: Iterable[str]) -> float:
        """The share (0..1) of the plan's capacity that the ``serving`` nodes carry."""
        nodes = frozenset(serving) & self._everyone
        cached = self._cache.get(nodes)
        if cached is not None:
            return cached
        if nodes == self._everyone:
            value = 1.0
        elif self._has_table:
            full = self.full_tokens_per_s
            value = min(1.0, self._flow(nodes) / full) if full > 0 else 0.0
        else:
            value = min(1.0, sum(p.share for p in self._pipelines if set(p.nodes) <= nodes))
        self._cache[nodes] = value
        return value

    def tokens_per_s(self, serving: Iterable[str]) -> float:
        """The plan's capacity that the ``serving`` nodes carry (tokens/s)."""
        return self.fraction(serving) * self.full_tokens_per_s
