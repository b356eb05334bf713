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

import numpy as np

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
    names = [n.name for n in problem.nodes]
    own = {n.name: repr((n.gpu, n.region, n.throughput_tokens_per_s, n.max_layers,
                         n.max_layers_first, n.max_layers_last, n.max_layers_first_last,
                         n.layer_latency_s, n.layer_latency_s_by_k)) for n in problem.nodes}
    kind, cap = _link_matrices(problem, names)
    # Colour refinement: a node's new colour is its colour, its coordinator links, and the multiset
    # of (colour of the other node, link kind) over every other node, both directions. Rows are
    # sorted codes, so the multiset compares as bytes; the diagonal is one constant code.
    label = _renumber([own[n] for n in names])
    coord = [(repr(problem.link(COORDINATOR, n)), repr(problem.link(n, COORDINATOR))) for n in names]
    label = _renumber([(label[i], coord[i]) for i in range(len(names))])
    kinds = int(kind.max()) + 2
    for _ in range(len(names)):  # stops when no class splits
        colour = np.asarray(label, dtype=np.int64)
        out_codes = np.sort(colour[None, :] * kinds + kind, axis=1)
        in_codes = np.sort(colour[:, None] * kinds + kind, axis=0).T
        new = _renumber([(label[i], out_codes[i].tobytes(), in_codes[i].tobytes())
                         for i in range(len(names))])
        if len(set(new)) == len(set(label)):
            break
        label = new
    groups: dict[int, list[NodeCapacity]] = defaultdict(list)
    for i, n in enumerate(problem.nodes):
        groups[label[i]].append(n)
    ordered = sorted(groups.values(), key=lambda g: (g[0].region, g[0].gpu, g[0].name))
    regions = sorted({n.region for n in problem.nodes})
    index = {n: i for i, n in enumerate(names)}
    in_region = {r: np.array([n.region == r for n in problem.nodes]) for r in regions}
    out = []
    per_kind: dict[tuple[str, str], int] = defaultdict(int)
    for members in ordered:
        proto = members[0]
        tag = (proto.gpu, proto.region)
        key = f"{proto.gpu}@{proto.region}#{per_kind[tag]}"
        per_kind[tag] += 1
        out.append(_make_class(problem, key, members, in_region,
                               cap, [index[m.name] for m in members]))
    return out


def _renumber(labels: list) -> list[int]:
    """Each distinct label as a small integer, numbered in order of first appearance."""
    ids: dict = {}
    return [ids.setdefault(x, len(ids)) for x in labels]


def _link_matrices(problem: PlacementProblem, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """kind[i, j]: a small integer per distinct (capacity, latency) of the link i -> j (0 = none,
    -1 on the diagonal); cap[i, j]: its capacity in tokens/s (0 = none)."""
    n = len(names)
    index = {name: i for i, name in enumerate(names)}
    kind = np.zeros((n, n), dtype=np.int64)
    cap = np.zeros((n, n))
    codes: dict[tuple[float, float], int] = {}
    by_id: dict[int, int] = {}   # shared Link objects (planner.build) are rounded once
    for (a, b), link in problem.links.items():
        i, j = index.get(a), index.get(b)
        if i is None or j is None or i == j:
            continue
        code = by_id.get(id(link))
        if code is None:
            key = (round(link.capacity_tokens_per_s, 6), round(link.latency_s, 9))
            code = by_id[id(link)] = codes.setdefault(key, len(codes) + 1)
        kind[i, j] = code
        cap[i, j] = link.capacity_tokens_per_s
    np.fill_diagonal(kind, -1)
    return kind, cap


def _make_class(problem: PlacementProblem, key: str, members: list[NodeCapacity],
                in_region: dict[str, np.ndarray], cap: np.ndarray, rows: list[int]) -> NodeClass:
    names = tuple(m.name for m in members)
    mine = cap[rows]                 # [members, nodes]: links out of each member
    theirs = cap[:, rows]            # [nodes, members]: links into each member
    out_to = {r: float(mine[:, mask].sum(axis=1).max()) for r, mask in in_region.items()}
    in_from = {r: float(theirs[mask, :].sum(axis=0).max()) for r, mask in in_region.items()}
    return NodeClass(key=key, proto=members[0], members=names, region=members[0].region,
                     coord_in_tokens_per_s=max(_cap(problem, COORDINATOR, m) for m in names),
                     coord_out_tokens_per_s=max(_cap(problem, m, COORDINATOR) for m in names),
                     out_to_region_tokens_per_s=out_to, in_from_region_tokens_per_s=in_from)


def _cap(problem: PlacementProblem, src: str, dst: str) -> float:
    link = problem.link(src, dst)
    return 0.0 if link is None else link.capacity_tokens_per_s
