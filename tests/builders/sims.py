"""Tiny simulators built by hand: explicit layer-time tables and links, no planner needed."""

from __future__ import annotations

from coordinator.kv_estimator import KVEstimator
from coordinator.schedulers import make_scheduler
from helix.core.plan import COORDINATOR, ArcFlow, Plan
from helix.core.serving import ServingSpec
from helix.sim.build import policy_config
from helix.sim.engine import SimConfig, Simulator
from helix.sim.network import LinkParams, Network
from helix.sim.worker import SimWorker
from helix.sim.workload import TraceRequest
from helix.core.slices import LayerSlice

PROMPT_S_PER_TOKEN = 1e-3
DECODE_S_PER_SEQ = 10e-3


def table_layer_time(prompt_tokens, decode_seqs, decode_context, prompt_context):
    """An explicit cost table: 1 ms per prompt token plus 10 ms per decode sequence, per layer."""
    return PROMPT_S_PER_TOKEN * prompt_tokens + DECODE_S_PER_SEQ * decode_seqs


def make_sim(plan: Plan, workload: tuple[TraceRequest, ...], config: SimConfig,
             kv_tokens: int = 100_000, scheduler: str = "helix", bandwidth_bytes_per_s: float = 1e6,
             latency_s: float = 0.01, activation_bytes: int = 100,
             token_id_bytes: int = 4, serving: ServingSpec = ServingSpec(),
             flow_plan: Plan | None = None) -> Simulator:
    """``flow_plan``: ``plan`` with flow-graph capacities; drains and joins then re-solve the max
    flow (see :mod:`helix.sim.elastic`)."""
    pc = policy_config(config, serving)
    workers = {p.node: SimWorker(p.node, p.start, p.end, kv_tokens, table_layer_time, pc,
                                 serving.block_size_tokens) for p in plan.placements}
    high_water = serving.kv_high_water if config.kv_high_water is None else config.kv_high_water
    kv = KVEstimator({n: w.kv_capacity_tokens * (w.end - w.start) for n, w in workers.items()},
                     high_water=high_water)
    def remake(p, estimator):
        return make_scheduler(scheduler, p, estimator, seed=config.seed)
    net = Network(lambda a, b: LinkParams(bandwidth_bytes_per_s, latency_s), sharing=config.link_sharing)
    return Simulator(config, workload, remake(plan, kv), workers, net, activation_bytes, token_id_bytes,
                     flow_plan=flow_plan, remake=remake if flow_plan is not None else None)


def burst(n: int, prompt: int, output: int, gap_s: float = 0.0) -> tuple[TraceRequest, ...]:
    return tuple(TraceRequest(i * gap_s, prompt, output) for i in range(n))


def pipelines_plan(spec, groups: list[tuple[list[str], list[int]]]) -> Plan:
    """Disjoint pipelines over ``spec``'s nodes; each pipeline's flow is its slowest stage's T(k)."""
    from helix.core.costmodel import CostModel
    cost = CostModel.for_cluster(spec)
    placements, arcs, total = [], [], 0.0
    for names, layers in groups:
        start, prev = 0, COORDINATOR
        flow = min(cost.throughput_tokens_per_s(spec.node(n), k) for n, k in zip(names, layers))
        for n, k in zip(names, layers):
            placements.append(LayerSlice(n, start, start + k))
            arcs.append(ArcFlow(prev, n, flow))
            start, prev = start + k, n
        arcs.append(ArcFlow(prev, COORDINATOR, flow))
        total += flow
    return Plan(spec.model.name, spec.model.num_layers, tuple(placements), tuple(arcs), total,
                method="hand")


def single24_plan(spec) -> Plan:
    """A100s 4 x 20 layers, L4s 8 x 10 layers: two pipelines (the T4s stay idle)."""
    return pipelines_plan(spec, [([f"a100-{i}" for i in range(4)], [20] * 4),
                                 ([f"l4-{i}" for i in range(8)], [10] * 8)])
