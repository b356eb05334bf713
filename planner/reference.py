"""The reference case of the Helix paper, written by hand from the reference planner's T(k) tables.

``single24``: 4 x A100-40G, 8 x L4, 12 x T4 in one region, LLaMA-2 70B (80 layers), every link
1 GB/s and 1 ms (coordinator links included). Node arcs carry 8192 x 2 B per token (fp16 hidden
state), coordinator arcs 2 B per token (a token id). A node holds at most as many layers as its
table has entries, with or without the embedding and LM head (the reference's own rule).

The same case ships as ``cluster_specs/reference/helix-single24-70b.yaml``; this hand-written copy
lets tests and the benchmark check the spec path against it.
"""

from __future__ import annotations

from planner.problem import COORDINATOR, Link, NodeCapacity, PlacementProblem

#: tokens/s when holding k = 1.. layers (the reference planner's own tables).
REFERENCE_TABLES: dict[str, tuple[float, ...]] = {
    "A100-40G": (23834, 11384, 7201, 5265, 4097, 3124, 2596, 2046, 1754, 1393, 1212, 952),
    "L4": (7558, 3626, 2172, 1476, 1018, 748, 532),
    "T4": (5709, 2434, 1348, 758),
}
REFERENCE_COUNTS = {"A100-40G": 4, "L4": 8, "T4": 12}
#: What the reference planner (Gurobi, 20 threads, 476 s) reached on this case, tokens/s.
REFERENCE_MAX_FLOW = 1289.6

LINK_BYTES_PER_S = 1e9
HIDDEN_BYTES_PER_TOKEN = 8192 * 2
TOKEN_ID_BYTES = 2
#: GPU kinds of the artifact's own single-region cluster24.ini, node 0 first: its published
#: layouts (``[Solution] compute_node_<i + 2>``) index nodes in this order.
ARTIFACT_ORDER = ("L4 T4 T4 L4 T4 L4 A100 T4 T4 A100 A100 L4 T4 T4 L4 T4 T4 A100 L4 T4 T4 L4 T4 "
                  "L4").split()


def reference_single24_70b(artifact_order: bool = False) -> PlacementProblem:
    """The case with nodes a100-0..3, l4-0..7, t4-0..11, in that order, or (``artifact_order``)
    in the order of the artifact's INI file (same names)."""
    nodes = []
    for gpu, count in REFERENCE_COUNTS.items():
        table = REFERENCE_TABLES[gpu]
        k = len(table)
        for i in range(count):
            nodes.append(NodeCapacity(name=f"{gpu.split('-')[0].lower()}-{i}", gpu=gpu,
                                      region="r0", throughput_tokens_per_s=tuple(map(float, table)),
                                      max_layers=k, max_layers_first=k, max_layers_last=k,
                                      max_layers_first_last=k))
    links: dict[tuple[str, str], Link] = {}
    node_cap = LINK_BYTES_PER_S / HIDDEN_BYTES_PER_TOKEN
    coord_cap = LINK_BYTES_PER_S / TOKEN_ID_BYTES
    for a in nodes:
        links[(COORDINATOR, a.name)] = Link(coord_cap, 1e-3)
        links[(a.name, COORDINATOR)] = Link(coord_cap, 1e-3)
        for b in nodes:
            if a.name != b.name:
                links[(a.name, b.name)] = Link(node_cap, 1e-3)
    if artifact_order:
        pools = {gpu.split("-")[0]: [n for n in nodes if n.gpu == gpu] for gpu in REFERENCE_COUNTS}
        nodes = [pools[kind].pop(0) for kind in ARTIFACT_ORDER]
    return PlacementProblem(model="llama-2-70b", num_layers=80, nodes=tuple(nodes), links=links,
                            spec_hash=None)
