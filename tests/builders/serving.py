"""Serving builders: the branching three-worker plan, the prompts the serving tests send, and
``transformers``' greedy continuation as the oracle."""

from __future__ import annotations

import dataclasses

from helix.core.plan import ArcFlow, Plan
from helix.core.serving import ServingLimits, ServingSpec
from helix.core.slices import LayerSlice

#: KV each worker of :func:`branching_plan` holds: the old engine default's room for the tests'
#: longest requests and bursts, and little memory.
BRANCHING_KV_TOKENS = 8192


def branching_plan(kv_tokens: int | dict[str, int] = BRANCHING_KV_TOKENS, **serving) -> Plan:
    """cpu-0 [0,4) feeds cpu-1 [2,8) (overlap: cpu-1 enters at layer 4) twice as often as cpu-2 [4,8).
    Every worker gets ``kv_tokens`` of KV, float32 and the spec's default limits (``serving``
    overrides :class:`ServingSpec` fields)."""
    plan = Plan(model="tiny-llama", num_layers=8,
                placements=(LayerSlice("cpu-0", 0, 4), LayerSlice("cpu-1", 2, 8),
                            LayerSlice("cpu-2", 4, 8)),
                arc_flows=(ArcFlow("coordinator", "cpu-0", 300.0), ArcFlow("cpu-0", "cpu-1", 200.0),
                           ArcFlow("cpu-0", "cpu-2", 100.0), ArcFlow("cpu-1", "coordinator", 200.0),
                           ArcFlow("cpu-2", "coordinator", 100.0)),
                max_flow_tokens_per_s=300.0, method="test")
    return with_kv(plan, kv_tokens, **serving)


def two_stage_plan(kv_tokens: int = BRANCHING_KV_TOKENS, nodes: tuple[str, str] = ("cpu-0", "cpu-1")) -> Plan:
    """One pipeline of two workers: ``nodes`` (cpu-0 [0,4) then cpu-1 [4,8)), float32, ``kv_tokens``
    each."""
    first, second = nodes
    plan = Plan(model="tiny-llama", num_layers=8,
                placements=(LayerSlice(first, 0, 4), LayerSlice(second, 4, 8)),
                arc_flows=(ArcFlow("coordinator", first, 100.0), ArcFlow(first, second, 100.0),
                           ArcFlow(second, "coordinator", 100.0)),
                max_flow_tokens_per_s=100.0, method="test")
    return with_kv(plan, kv_tokens)


def parallel_plan(kv_tokens: int = BRANCHING_KV_TOKENS) -> Plan:
    """Two pipelines sharing no node, as ``helix plan`` places cluster_specs/local3.yaml: cpu-0
    holds the whole model [0,8) and carries two thirds of the flow; cpu-2 [0,4) -> cpu-1 [4,8)
    the other third. With the flow graph's capacities (each node's own flow)."""
    plan = Plan(model="tiny-llama", num_layers=8,
                placements=(LayerSlice("cpu-0", 0, 8), LayerSlice("cpu-1", 4, 8),
                            LayerSlice("cpu-2", 0, 4)),
                arc_flows=(ArcFlow("coordinator", "cpu-0", 200.0), ArcFlow("coordinator", "cpu-2", 100.0),
                           ArcFlow("cpu-2", "cpu-1", 100.0), ArcFlow("cpu-0", "coordinator", 200.0),
                           ArcFlow("cpu-1", "coordinator", 100.0)),
                max_flow_tokens_per_s=300.0, method="test")
    big = 1e6
    table = {"nodes": {"cpu-0": 200.0, "cpu-1": 100.0, "cpu-2": 100.0},
             "arcs": [["coordinator", "cpu-0", big], ["coordinator", "cpu-2", big],
                      ["cpu-2", "cpu-1", big], ["cpu-0", "coordinator", big],
                      ["cpu-1", "coordinator", big]]}
    return dataclasses.replace(with_kv(plan, kv_tokens), extras={"flow_capacities": table})


def with_capacities(plan: Plan) -> Plan:
    """The branching plan with the flow graph's capacities, as ``helix plan`` writes them: cpu-1 could
    carry 250 tokens/s where the plan sends it 200."""
    big = 1e6
    table = {"nodes": {"cpu-0": 300.0, "cpu-1": 250.0, "cpu-2": 150.0},
             "arcs": [["coordinator", "cpu-0", big], ["cpu-0", "cpu-1", big], ["cpu-0", "cpu-2", big],
                      ["cpu-1", "coordinator", big], ["cpu-2", "coordinator", big]]}
    return dataclasses.replace(plan, extras={**plan.extras, "flow_capacities": table})


def with_kv(plan: Plan, kv_tokens: int | dict[str, int], dtype: str = "float32", **serving) -> Plan:
    """``plan`` whose workers hold ``kv_tokens`` of KV each (or per node, given a dict)."""
    pools = kv_tokens if isinstance(kv_tokens, dict) else \
        {p.node: kv_tokens for p in plan.placements}
    return dataclasses.replace(plan, serving=ServingLimits.of(ServingSpec(**serving), dtype, pools))



def hf_greedy(model, prompt_ids, max_new_tokens: int) -> list[int]:
    """Greedy continuation by ``transformers`` (stops at EOS id 2)."""
    import torch
    out = model.generate(torch.tensor([list(prompt_ids)]), max_new_tokens=max_new_tokens,
                         do_sample=False, eos_token_id=2, pad_token_id=0)
    return out[0, len(prompt_ids):].tolist()


PROMPTS = ["Helix serves one large language model", "Each worker holds a slice",
           "The placement maximizes the max flow from source to sink; every request",
           "Chunked prefill", "pipeline", "Iteration-level scheduling lets finished requests leave",
           "regions of mixed GPUs", "decodes ride along"]
