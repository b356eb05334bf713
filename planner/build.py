"""From a validated cluster spec to a :class:`PlacementProblem` (plain numbers for the planner).

Arc capacities are link bandwidth divided by the bytes one token needs on that arc:

- coordinator -> node and node -> coordinator carry token ids (2 bytes when the vocabulary fits
  in 16 bits, else 4);
- node -> node carries a stage's hidden state (``hidden_size * dtype`` bytes per token) and, since
  the last stage sends each sampled token straight to the first stage, token ids too. Both can
  travel the same arc, so the arc is sized for the larger of the two (the hidden state).
"""

from __future__ import annotations

import dataclasses

from helix.core.costmodel import CostModel
from helix.core.models import ModelSpec
from helix.core.plan import COORDINATOR, Plan
from helix.core.serving import ServingLimits
from helix.core.spec import ClusterSpec, NodeSpec
from planner.link_regions import planning_spec
from planner.problem import Link, NodeCapacity, PlacementProblem


def token_id_bytes(model: ModelSpec) -> int:
    return 2 if model.vocab_size <= 2**16 else 4


def node_capacity(cost: CostModel, node: NodeSpec, region: str) -> NodeCapacity:
    """T(k) table and memory limits of one node under ``cost``."""
    table = cost.throughput_table(node)
    max_mid = cost.max_layers(node)
    # The scalar latency, for k outside the table, at half the node's capacity: a typical share.
    latency_k = max(1, max_mid // 2)
    return NodeCapacity(
        name=node.name, gpu=node.label, region=region,
        throughput_tokens_per_s=table,
        max_layers=max_mid,
        max_layers_first=cost.max_layers(node, first=True),
        max_layers_last=cost.max_layers(node, last=True),
        max_layers_first_last=cost.max_layers(node, first=True, last=True),
        layer_latency_s=cost.decode_layer_latency_s(node, latency_k) if table else 0.0,
        memory_bytes=node.vram_bytes * cost.serving.gpu_memory_utilization,
        layer_latency_s_by_k=tuple(cost.decode_layer_latency_s(node, k)
                                   for k in range(1, len(table) + 1)),
    )


def build_links(spec: ClusterSpec, model: ModelSpec) -> dict[tuple[str, str], Link]:
    """Every connected ordered pair of vertices, capacity in tokens/s (see module docstring).

    A pair without a per-pair override is linked by its two ends' regions and NIC limits alone, so
    its Link is computed once per (region, NIC) pair of classes and shared: a 1,000-node cluster has
    a million pairs but a few dozen distinct links (seconds and hundreds of MiB less)."""
    token_bytes = token_id_bytes(model)
    hidden_bytes = max(model.activation_bytes_per_token(spec.dtype_bytes), token_bytes)
    vertices = [COORDINATOR, *(n.name for n in spec.nodes)]
    kind = {COORDINATOR: COORDINATOR,
            **{n.name: (spec.region_of(n.name), n.nic_bandwidth_bytes_per_s) for n in spec.nodes}}
    overridden = {frozenset(link.ends) for link in spec.links}
    by_kind: dict[tuple, Link | None] = {}
    links: dict[tuple[str, str], Link] = {}

    def make(a: str, b: str) -> Link | None:
        params = spec.link(a, b)
        if params is None:
            return None
        per_token = token_bytes if COORDINATOR in (a, b) else hidden_bytes
        return Link(params.bandwidth_bytes_per_s / per_token, params.latency_s)

    for a in vertices:
        ka = kind[a]
        for b in vertices:
            if a == b:
                continue
            if spec.only_listed_links or (overridden and frozenset((a, b)) in overridden):
                link = make(a, b)
            else:
                key = (ka, kind[b])
                if key not in by_kind:
                    by_kind[key] = make(a, b)
                link = by_kind[key]
            if link is not None:
                links[(a, b)] = link
    return links


def build_problem(spec: ClusterSpec, model: ModelSpec | None = None) -> PlacementProblem:
    """The placement problem of ``spec`` for its model, or for ``model`` when given (then the
    spec's measured profiles and tables, made for its own model, are not used). Nodes carry the
    regions the links show where the declared ones do not match them
    (:func:`planner.link_regions.planning_spec`); links are the spec's own either way."""
    cost = CostModel.for_cluster(spec, model)
    chosen = cost.model
    regions = planning_spec(spec)[0]
    return PlacementProblem(
        model=chosen.name,
        num_layers=chosen.num_layers,
        nodes=tuple(node_capacity(cost, n, regions.region_of(n.name)) for n in spec.nodes),
        links=build_links(spec, chosen),
        spec_hash=spec.content_hash(),
        layer_bytes=float(chosen.layer_bytes(spec.dtype_bytes)),
    )


def serving_limits(spec: ClusterSpec, plan: Plan, cost: CostModel | None = None) -> ServingLimits:
    """What ``plan``'s workers run with: ``spec``'s serving settings and dtype, and each placed
    node's KV pool as ``cost`` (default: the spec's cost model) sizes it for the node's slice. The
    simulator sizes its workers with this very function, so live and simulated pools agree. With
    ``chunk_tokens: auto`` the step budget is the one the plan chose (:mod:`planner.budget`)."""
    cost = cost or CostModel.for_cluster(spec)
    pools = {p.node: cost.kv_capacity_tokens(spec.node(p.node), p.num_layers, first=p.start == 0,
                                             last=p.end == plan.num_layers)
             for p in plan.placements if p.num_layers > 0}
    limits = ServingLimits.of(spec.serving, spec.dtype, pools)
    if spec.serving.choose_chunk_tokens and plan.serving is not None:   # chunk_tokens: auto
        limits = limits.model_copy(update={"chunk_tokens": plan.serving.chunk_tokens})
    return limits


def with_serving(plan: Plan, spec: ClusterSpec, model: ModelSpec | None = None) -> Plan:
    """``plan`` carrying its :func:`serving_limits` (what ``helix plan`` writes to plan.yaml)."""
    return dataclasses.replace(plan, serving=serving_limits(spec, plan,
                                                            CostModel.for_cluster(spec, model)))
