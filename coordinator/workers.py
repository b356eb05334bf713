"""What the coordinator knows of its workers: where each listens, and what its engine runs with
(from the plan's serving limits)."""

from __future__ import annotations

from dataclasses import dataclass

from helix.core.errors import HelixUserError
from helix.core.plan import Plan
from helix.core.serving import ServingLimits


@dataclass(frozen=True)
class WorkerHandle:
    """Where one worker listens."""

    node: str
    control_address: str
    data_address: str


#: Engine options the plan's serving limits set (see :func:`engine_options`).
PLAN_ENGINE_OPTIONS = ("dtype", "block_size_tokens", "num_kv_blocks", "max_num_seqs",
                       "max_num_batched_tokens", "chunked_prefill", "adapter_cache_bytes")


def engine_options(serving: ServingLimits, node: str) -> dict:
    """What ``node``'s engine runs with, from the plan: its dtype, its KV pool (the plan's figure in
    whole blocks), the batch limit and the step's token budget (chunked prefill or not), as the
    planner and the simulator assumed, and its adapter cache's budget."""
    return {"dtype": serving.dtype, "block_size_tokens": serving.block_size_tokens,
            "num_kv_blocks": serving.kv_blocks(node), "max_num_seqs": serving.max_batch_seqs,
            "max_num_batched_tokens": serving.step_tokens,
            "chunked_prefill": serving.chunk_tokens > 0,
            "adapter_cache_bytes": serving.adapter_cache_bytes}


def check_serving(plan: Plan) -> ServingLimits:
    """The plan's serving limits, or a one-line error when it lacks them (or a node's pool)."""
    serving = plan.serving
    if serving is None:
        raise HelixUserError("the plan has no serving section (dtype, KV pools, batch limits): "
                             "write it with `helix plan CLUSTER -o plan.yaml`")
    for p in plan.placements:
        if p.num_layers > 0 and serving.kv_capacity_tokens.get(p.node, 0) < serving.block_size_tokens:
            raise HelixUserError(f"the plan's serving section gives node {p.node!r} no KV pool of a "
                                 f"block or more: re-run `helix plan`")
    return serving
