"""Node classes: nodes that are interchangeable for the planner.

Two nodes are in one class when they have the same GPU kind, region, throughput table, memory limits
and decode latency, and the same links (capacity and latency) to the coordinator and to every other
class, counted per class. The class MILP plans counts of nodes per layer range; any assignment of a
class's real nodes to those ranges is then equivalent, which removes the symmetry between them.

Per class we also keep the *largest* link capacities its members have towards each region: the
class model's network constraints use them, so it stays a relaxation (a valid upper bound) even
when members differ slightly.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from planner.problem import COORDINATOR, NodeCapacity, PlacementProblem


@dataclass(frozen=True)
class NodeClass:
    key: str
    """Readable label, e.g. ``A100-40G@us-east#0``."""
    proto: NodeCapacity
    """A representative member (all members share its capacities)."""
    members: tuple[str, ...]
    region: str
    coord_in_tokens_per_s: float
    """Largest coordinator -> member link capacity (0 = no link)."""
    coord_out_tokens_per_s: float
    out_to_region_tokens_per_s: dict[str, float]
    """Largest total capacity from one member to all nodes of a region (its own region included)."""
    in_from_region_tokens_per_s: dict[str, float]
    """Largest total capacity from all nodes of a region into one member."""

    @property
    def count(self) -> int:
        return len(self.members)


def _signature(problem: PlacementProblem, node: NodeCapacity, label: dict[str, str]):
    def links(direction: int):
        acc: dict[tuple, int] = defaultdict(int)
        for other in problem.nodes:
            if other.name == node.name:
                continue
            pair = (node.name, other.name) if direction else (other.name, node.name)
            link = problem.link(*pair)
            acc[(label[other.name], None if link is None else
                 (round(link.capacity_tokens_per_s, 6), round(link.latency_s, 9)))] += 1
        return tuple(sorted(acc.items(), key=repr))

    c_in, c_out = problem.link(COORDINATOR, node.name), problem.link(node.name, COORDINATOR)
    return (label[node.name], c_in, c_out, links(1), links(0))


def node_classes(problem: PlacementProblem) -> list[NodeClass]:
    """Partition the nodes into classes of interchangeable nodes (refined until stable).

    Computed once per problem and kept on it: the refinement compares every pair of nodes, seconds
    at 1,000 nodes, and the warm starts and the class MILP each ask for it."""
    cached = problem.__dict__.get("_node_classes")
    if cached is None:
        cached = _node_classes(problem)
        object.__setattr__(problem, "_node_classes", cached)
    return list(cached)


def _node_classes(problem: PlacementProblem) -> list[NodeClass]:
    label = {n.name: repr((n.gpu, n.region, n.throughput_tokens_per_s, n.max_layers,
                           n.max_layers_first, n.max_layers_last, n.max_layers_first_last,
                           n.layer_latency_s, n.layer_latency_s_by_k)) for n in problem.nodes}
    for _ in range(len(problem.nodes)):  # colour refinement; stops when no class splits
        sigs = {n.name: repr(_signature(problem, n, label)) for n in problem.nodes}
        if len(set(sigs.values())) == len(set(label.values())):
            break
        label = sigs
    groups: dict[str, list[NodeCapacity]] = defaultdict(list)
    for n in problem.nodes:
        groups[label[n.name]].append(n)
    ordered = sorted(groups.values(), key=lambda g: (g[0].region, g[0].gpu, g[0].name))
    regions = sorted({n.region for n in problem.nodes})
    out = []
    per_kind: dict[tuple[str, str], int] = defaultdict(int)
    for members in ordered:
        proto = members[0]
        tag = (proto.gpu, proto.region)
        key = f"{proto.gpu}@{proto.region}#{per_kind[tag]}"
        per_kind[tag] += 1
        out.append(_make_class(problem, key, members, regions))
    return out


def _cap(problem: PlacementProblem, src: str, dst: str) -> float:
    link = problem.link(src, dst)
    return 0.0 if link is None else link.capacity_tokens_per_s


def _make_class(problem: PlacementProblem, key: str, members: list[NodeCapacity],
                regions: list[str]) -> NodeClass:
    names = tuple(m.name for m in members)
    out_to: dict[str, float] = {}
    in_from: dict[str, float] = {}
    for r in regions:
        in_r = [n.name for n in problem.nodes if n.region == r]
        out_to[r] = max(sum(_cap(problem, m, o) for o in in_r if o != m) for m in names)
        in_from[r] = max(sum(_cap(problem, o, m) for o in in_r if o != m) for m in names)
    return NodeClass(key=key, proto=members[0], members=names, region=members[0].region,
                     coord_in_tokens_per_s=max(_cap(problem, COORDINATOR, m) for m in names),
                     coord_out_tokens_per_s=max(_cap(problem, m, COORDINATOR) for m in names),
                     out_to_region_tokens_per_s=out_to, in_from_region_tokens_per_s=in_from)
