"""The placement problem: everything the planner needs, as plain numbers.

A :class:`PlacementProblem` is what the flow graph, the MILP, the bound and the heuristics read. It is
solver-agnostic and spec-agnostic: ``build_problem(spec)`` (in ``planner.build``) turns a validated
``ClusterSpec`` plus its cost model into one, and tests can write one by hand.

Arc capacities are already in tokens/s: a link's bandwidth divided by the bytes one token needs on
it (token ids on coordinator links, hidden states between nodes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from helix.core.plan import COORDINATOR

__all__ = ["COORDINATOR", "NodeCapacity", "Link", "PlacementProblem"]


@dataclass(frozen=True)
class NodeCapacity:
    """One compute node as the planner sees it."""

    name: str
    gpu: str
    """GPU kind label, with the count for multi-GPU nodes (``"L4"``, ``"T4x4"``)."""
    region: str
    throughput_tokens_per_s: tuple[float, ...]
    """T(k) for k = 1..len: tokens/s (prompt + decode) the node processes while holding k layers."""
    max_layers: int
    """Most layers it can hold when it holds neither the embedding nor the LM head (0 = none)."""
    max_layers_first: int
    """Most layers when its range starts at layer 0 (it also holds the embedding)."""
    max_layers_last: int
    """Most layers when its range ends at the last layer (it also holds the LM head)."""
    max_layers_first_last: int
    """Most layers when it holds both ends (only possible with k = num_layers)."""
    layer_latency_s: float = 0.0
    """Time of one layer in a decode step at the node's planned batch (for latency estimates), at a
    typical layer count; used for any k that ``layer_latency_s_by_k`` does not cover."""
    memory_bytes: float = 0.0
    """Usable memory of the node (for infeasibility messages; 0 when unknown)."""
    layer_latency_s_by_k: tuple[float, ...] = ()
    """Per-layer decode latency while holding k layers, for k = 1..len: the batch a node can keep
    (hence its step time per layer) depends strongly on k (a T4 with 4 layers: 73 ms per layer;
    with 8: 10.6 ms). Empty when unknown."""

    def throughput(self, k: int) -> float:
        """T(k), 0 outside the table."""
        if 1 <= k <= len(self.throughput_tokens_per_s):
            return self.throughput_tokens_per_s[k - 1]
        return 0.0

    def layer_latency(self, k: int) -> float:
        """Seconds one layer adds to a token's latency while the node holds ``k`` layers."""
        if 1 <= k <= len(self.layer_latency_s_by_k):
            return self.layer_latency_s_by_k[k - 1]
        return self.layer_latency_s

    def max_layers_for(self, first: bool, last: bool) -> int:
        if first and last:
            return self.max_layers_first_last
        if first:
            return self.max_layers_first
        if last:
            return self.max_layers_last
        return self.max_layers


@dataclass(frozen=True)
class Link:
    """A directed network arc between two vertices (node names or :data:`COORDINATOR`)."""

    capacity_tokens_per_s: float
    latency_s: float = 0.0


@dataclass(frozen=True)
class PlacementProblem:
    """Nodes, directed links and the model's layer count. A missing link means no connection."""

    model: str
    num_layers: int
    nodes: tuple[NodeCapacity, ...]
    links: Mapping[tuple[str, str], Link] = field(hash=False)
    spec_hash: str | None = None
    layer_bytes: float = 0.0
    """Weight bytes of one layer (for infeasibility messages; 0 when unknown)."""

    def __post_init__(self) -> None:
        # node(name) is called per node of every flow graph: a scan would make those quadratic.
        object.__setattr__(self, "_by_name", {n.name: n for n in self.nodes})

    def node(self, name: str) -> NodeCapacity:
        return self._by_name[name]  # type: ignore[attr-defined]

    def link(self, src: str, dst: str) -> Link | None:
        return self.links.get((src, dst))

    def link_totals(self) -> tuple[dict[str, float], dict[str, float]]:
        """Total link capacity (tokens/s) into and out of every vertex, computed once per problem
        (kept on the instance: hashing the problem for a cache costs more than the sum)."""
        cached = self.__dict__.get("_link_totals")
        if cached is None:
            into: dict[str, float] = {}
            out: dict[str, float] = {}
            for (src, dst), link in self.links.items():
                if src != dst:
                    into[dst] = into.get(dst, 0.0) + link.capacity_tokens_per_s
                    out[src] = out.get(src, 0.0) + link.capacity_tokens_per_s
            cached = (into, out)
            object.__setattr__(self, "_link_totals", cached)
        return cached
