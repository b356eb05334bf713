"""Assemble a :class:`~helix.sim.engine.Simulator` from a cluster spec, a plan and a workload."""

from __future__ import annotations

import dataclasses
import functools

from coordinator.kv_estimator import KVEstimator
from coordinator.schedulers import make_scheduler
from helix.core.costmodel import CostModel
from helix.core.errors import InfeasibleError, SpecError
from helix.core.plan import COORDINATOR, Plan
from helix.sim.engine import SimConfig, Simulator
from helix.sim.hop import CoordinatorHop
from helix.sim.network import LinkParams, Network
from helix.sim.tasks import assign_tasks, task_name, task_placement
from helix.sim.worker import SimWorker
from helix.sim.workload import TraceRequest
from helix.core.spec import ClusterSpec
from helix.core.serving import ServingLimits, ServingSpec
# The planner's figures, so both count the same bytes and size the same KV pools:
from planner.build import build_problem, serving_limits, token_id_bytes
from planner.flowgraph import with_flow_capacities
from worker.step_policy import PolicyConfig


def check_plan_matches(spec: ClusterSpec, plan: Plan) -> None:
    """SpecError unless ``plan`` was made for ``spec``'s model and nodes. A plan made for another
    version of the spec (other links or figures, same nodes) is accepted: the numbers differ."""
    if plan.num_layers != spec.model.num_layers:
        raise SpecError(f"plan has {plan.num_layers} layers but the spec's model "
                        f"{spec.model.name!r} has {spec.model.num_layers}")
    names = {n.name for n in spec.nodes}
    for p in plan.placements:
        if p.node not in names:
            raise SpecError(f"plan places layers on node {p.node!r}, which the cluster spec lacks")
    for arc in plan.arc_flows:
        if arc.flow_tokens_per_s > 0 and spec.link(arc.src, arc.dst) is None:
            raise SpecError(f"plan routes {arc.flow_tokens_per_s:.0f} tokens/s over {arc.src} -> "
                            f"{arc.dst}, but the cluster spec has no link between them")


def plan_spec_warning(spec: ClusterSpec, plan: Plan) -> str | None:
    """A one-line warning when ``plan`` records the hash of another version of ``spec`` (it passed
    :func:`check_plan_matches`, so only links, GPUs or serving figures can differ: it runs, but its
    flows, and so ``--load``'s rate, were computed for other numbers). None when the hashes agree or
    the plan records none (plans made outside ``planner.build``)."""
    if plan.spec_hash is None or plan.spec_hash == spec.content_hash():
        return None
    return (f"plan {plan.method!r} was made for another version of this cluster spec (spec hash "
            f"{plan.spec_hash}, this spec {spec.content_hash()}): its flows may not match these "
            "links and GPUs; re-run `helix plan` to be sure")


def policy_config(config: SimConfig, limits: ServingLimits | ServingSpec) -> PolicyConfig:
    """A simulated worker's step limits: the plan's serving limits (what ``helix serve``'s workers
    run with; or the spec's, which carry the same two), the chunk budget overridden by
    ``config.chunk_tokens`` when set."""
    chunk = limits.chunk_tokens if config.chunk_tokens is None else config.chunk_tokens
    chunked = chunk > 0
    return PolicyConfig(
        max_num_seqs=limits.max_batch_seqs,
        max_num_batched_tokens=chunk if chunked else config.max_batched_tokens_unchunked,
        chunked_prefill=chunked, self_feeding=False)


def build_workers(spec: ClusterSpec, plan: Plan, cost: CostModel, config: SimConfig,
                  limits: ServingLimits) -> dict[str, SimWorker]:
    """One SimWorker per placed node, with the KV pool and batch limit ``helix serve`` gives its
    worker (``limits``: :func:`planner.build.serving_limits`)."""
    pc = policy_config(config, limits)
    block = limits.block_size_tokens
    workers = {}
    for p in plan.placements:
        if p.num_layers < 1:
            continue
        cap = limits.kv_capacity_tokens[p.node]
        if cap < block:
            raise InfeasibleError(f"node {p.node!r} cannot hold layers [{p.start}, {p.end}) with room "
                                  f"for KV ({cap} tokens)")
        node = spec.node(p.node)
        # Measured by `helix profile` (a last stage's step also runs the LM head and samples);
        # the roofline has no such term.
        profile = cost.profiles.get(node.label)
        overhead = None if profile is None else functools.partial(
            profile.step_overhead_s, last=p.end == plan.num_layers)
        adapters = None if config.tasks is None else functools.partial(
            cost.adapter_step_s, node, p.num_layers, shape=config.tasks.shape)
        workers[p.node] = SimWorker(p.node, p.start, p.end, cap,
                                    cost.layer_time_fn(node), pc, block, overhead,
                                    adapters)
    return workers


def build_network(spec: ClusterSpec, sharing: str = "fifo") -> Network:
    def link_of(a: str, b: str) -> LinkParams | None:
        params = spec.link(a, b)
        return None if params is None else LinkParams(params.bandwidth_bytes_per_s, params.latency_s)

    def nic_of(v: str) -> float | None:
        if v == COORDINATOR:
            return spec.coordinator.nic_bandwidth_bytes_per_s
        return spec.node(v).nic_bandwidth_bytes_per_s

    return Network(link_of, nic_of, sharing=sharing)


def build_simulator(spec: ClusterSpec, plan: Plan, workload: tuple[TraceRequest, ...],
                    config: SimConfig, scheduler: str = "helix",
                    cost: CostModel | None = None) -> Simulator:
    """A ready-to-run simulator of ``plan`` on ``spec`` with the named scheduler."""
    check_plan_matches(spec, plan)
    placement = None
    if config.tasks is not None:   # every request names a task (or the base model)
        workload = assign_tasks(workload, config.tasks, config.seed)
        mix = config.tasks
        if mix.replicas is not None and scheduler == "helix":
            names = dict.fromkeys([task_name(k) for k in range(mix.num_tasks)]
                                  + [r.task for r in workload if r.task is not None])
            placement = task_placement(plan, names, dataclasses.replace(
                mix.placement, initial_replicas=mix.replicas))
    cost = cost or CostModel.for_cluster(spec)
    limits = serving_limits(spec, plan, cost)
    workers = build_workers(spec, plan, cost, config, limits)
    high_water = limits.kv_high_water if config.kv_high_water is None else config.kv_high_water
    kv = KVEstimator({n: w.kv_capacity_tokens * (w.end - w.start) for n, w in workers.items()},
                     high_water=high_water)
    def remake(p: Plan, estimator: KVEstimator):
        return make_scheduler(scheduler, p, estimator, seed=config.seed,
                              connected=lambda a, b: spec.link(a, b) is not None)
    sched = remake(plan, kv)
    flow_plan = None
    if config.replan is not None and scheduler != "helix":
        raise SpecError(f"re-planning needs the helix scheduler (its flows follow the plan), not "
                        f"{scheduler!r}")
    if scheduler == "helix" and (config.drains or config.joins or config.replan):
        # re-solved as nodes come and go
        flow_plan = plan if plan.extras.get("flow_capacities") else \
            with_flow_capacities(plan, build_problem(spec))
    model = spec.model
    made = Simulator(config, workload, sched, workers, build_network(spec, config.link_sharing),
                     model.activation_bytes_per_token(spec.dtype_bytes), token_id_bytes(model),
                     flow_plan=flow_plan, remake=remake if flow_plan is not None else None,
                     placement=placement)
    made.hop = CoordinatorHop.of(spec.coordinator)   # measured, or None: free (helix.sim.hop)
    if config.replan is not None:   # the live re-plan policy on the simulated clock
        from planner.trigger import ReplanTrigger
        joining = {j.node for j in config.joins}
        def workers_of(new_spec: ClusterSpec, new_plan: Plan) -> dict[str, SimWorker]:
            cost = CostModel.for_cluster(new_spec)
            return build_workers(new_spec, new_plan, cost, config,
                                 serving_limits(new_spec, new_plan, cost))
        made.enable_replan(ReplanTrigger(spec, flow_plan, config.replan.trigger,
                                         present={n.name for n in spec.nodes} - joining),
                           workers_of)
    return made
