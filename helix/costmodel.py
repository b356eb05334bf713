"""Cost model: how long a layer takes, how much KV fits, and a node's throughput T(k).

Three sources, most specific wins:

1. an explicit throughput table in the spec (``performance.throughput_tables``) replaces T(k)
   entirely, so published planner inputs can be reproduced exactly;
2. a measured profile (``performance.profiles``) replaces the analytic one-layer time;
3. otherwise the analytic roofline below.

**Analytic one-layer time** for a batch of P prompt tokens (mean attention context ``c_p``) and D
decode sequences (context ``c_d``) on a node of n GPUs of one kind, tensor parallel::

    flops  = (P + D) * 2 * W  +  4 * H_q * (P * c_p + D * c_d)          # GEMMs + attention
    bytes  = W * b  +  kv * (D * c_d + P)  +  A * (P + D)               # weights, KV read/write, acts
    t      = max(flops / (n * peak * e_c), bytes / (n * bw * e_m))  +  overhead
           + 2 all-reduces * (2 (n-1)/n * (P + D) * h * b / link  +  2 (n-1) * latency)   # if n > 1

with W the layer's matrix parameters, b bytes per element, H_q = heads x head_dim, kv the KV bytes
per token per layer, A the activation bytes a token moves through memory in one layer, e_c and e_m
the kind's achievable fractions of peak (calibrated, see ``helix.hardware``).

**KV capacity** of a node holding k layers: ``(VRAM * utilization - k * layer bytes - embedding (if
first) - LM head (if last) - workspace) / (k * kv)`` tokens, i.e. how many tokens can have KV on
*every* layer the node holds.

**Node throughput T(k)**, tokens/s (prompt + decode) while holding k layers, at the steady state of
the workload mix (mean prompt p, mean output o) — the derivation:

- each running request reserves KV for its whole final length p + o, so the node can decode
  ``D = min(max_batch_seqs, floor(KV capacity / (p + o)))`` sequences at once;
- each step yields one token for each of the D decodes; a request decodes for o steps, so new
  requests join at D / o per step, each bringing p prompt tokens: ``P = D * p / o`` per step;
- a decoding request's context averages ``c_d = p + o / 2``; a prompt token's ``c_p = p / 2``;
- one step passes k layers: ``step = k * t_layer(P, D)``, and ``T(k) = (P + D) / step``.

T(k) falls with k twice: each step passes more layers, and KV per layer shrinks so batches do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from helix.hardware import GiB, GpuKind
from helix.models import ModelSpec
from helix.profiles import MeasuredProfile
from helix.spec import ClusterSpec, NodeSpec, ServingSpec, WorkloadSpec

#: Memory kept free on each GPU for activations and the CUDA context, bytes.
WORKSPACE_BYTES_PER_GPU = 0.5 * GiB


def analytic_layer_time_s(model: ModelSpec, gpu: GpuKind, num_gpus: int, dtype_bytes: int,
                          prompt_tokens: float, decode_seqs: float, decode_context: float,
                          prompt_context: float) -> float:
    """Roofline time of one decoder layer for one step (formula in the module docstring)."""
    tokens = prompt_tokens + decode_seqs
    if tokens <= 0:
        return 0.0
    n = num_gpus
    hq = model.num_heads * model.head_dim
    kv = model.kv_bytes_per_token_per_layer(dtype_bytes)
    flops = tokens * model.linear_flops_per_token_per_layer \
        + 4.0 * hq * (prompt_tokens * prompt_context + decode_seqs * decode_context)
    # A token's activations are written and read by every op of the layer: ~2 x (4 h + 3 ffn).
    act_bytes = 2 * (4 * model.hidden_size + 3 * model.intermediate_size) * dtype_bytes
    mem_bytes = model.layer_bytes(dtype_bytes) + kv * (decode_seqs * decode_context + prompt_tokens) \
        + act_bytes * tokens
    t_compute = flops / (n * gpu.fp16_flops * gpu.compute_efficiency)
    t_memory = mem_bytes / (n * gpu.memory_bandwidth_bytes_per_s * gpu.memory_efficiency)
    t = max(t_compute, t_memory) + gpu.layer_overhead_s
    if n > 1:
        msg_bytes = tokens * model.hidden_size * dtype_bytes
        ring = 2 * (n - 1) / n * msg_bytes / gpu.interconnect_bytes_per_s \
            + 2 * (n - 1) * gpu.allreduce_latency_s
        t += 2 * ring  # one all-reduce after attention, one after the MLP
    return t


@dataclass(frozen=True)
class OperatingPoint:
    """Steady-state batch of a node holding k layers (see module docstring)."""

    prompt_tokens: float
    decode_seqs: int
    step_s: float
    """Time of one step through all k layers."""

    @property
    def throughput_tokens_per_s(self) -> float:
        if self.decode_seqs <= 0 or self.step_s <= 0:
            return 0.0
        return (self.prompt_tokens + self.decode_seqs) / self.step_s


class CostModel:
    """Layer times, KV capacity and T(k) for the nodes of one cluster and model."""

    def __init__(self, model: ModelSpec, dtype_bytes: int = 2,
                 workload: WorkloadSpec | None = None, serving: ServingSpec | None = None,
                 profiles: dict[str, MeasuredProfile] | None = None,
                 throughput_tables: dict[str, tuple[float, ...]] | None = None):
        self.model = model
        self.dtype_bytes = dtype_bytes
        self.workload = workload or WorkloadSpec()
        self.serving = serving or ServingSpec()
        self.profiles = dict(profiles or {})
        self.throughput_tables = dict(throughput_tables or {})
        self._point = lru_cache(maxsize=None)(self._operating_point)

    @classmethod
    def for_cluster(cls, spec: ClusterSpec, model: ModelSpec | None = None) -> "CostModel":
        """The spec's model (or ``model``), workload, serving limits, profiles and tables.

        With another model than the spec's, profiles and tables (measured for the spec's model)
        are ignored, since they do not describe it.
        """
        same = model is None or model == spec.model
        return cls(model or spec.model, spec.dtype_bytes, spec.workload, spec.serving,
                   spec.profiles if same else None,
                   dict(spec.performance.throughput_tables) if same else None)

    # --- one layer ----------------------------------------------------------------------------------
    def layer_time_s(self, node: NodeSpec, prompt_tokens: float, decode_seqs: float,
                     decode_context: float, prompt_context: float | None = None) -> float:
        """Seconds for ONE layer of a step with ``prompt_tokens`` prefill tokens and
        ``decode_seqs`` decodes at mean context ``decode_context``. A measured profile for the
        node's label wins (its contexts, when it has them, are looked up); otherwise the roofline."""
        if prompt_context is None:
            prompt_context = min(prompt_tokens, self.workload.mean_prompt_tokens) / 2
        profile = self.profiles.get(node.label)
        if profile is not None:
            return profile.layer_time_s(prompt_tokens, decode_seqs, decode_context, prompt_context)
        return analytic_layer_time_s(self.model, node.kind, node.num_gpus, self.dtype_bytes,
                                     prompt_tokens, decode_seqs, decode_context, prompt_context)

    def step_overhead_s(self, node: NodeSpec, prompt_tokens: float, decode_seqs: float,
                        decode_context: float, prompt_context: float | None = None) -> float:
        """Seconds a step costs apart from its layers (once per step): measured by ``helix
        profile`` for the node's label, else 0 (the roofline and the reference's profiles have
        no such term)."""
        profile = self.profiles.get(node.label)
        if profile is None:
            return 0.0
        if prompt_context is None:
            prompt_context = min(prompt_tokens, self.workload.mean_prompt_tokens) / 2
        return profile.step_overhead_s(prompt_tokens, decode_seqs, decode_context, prompt_context)

    # --- memory -------------------------------------------------------------------------------------
    def kv_capacity_tokens(self, node: NodeSpec, num_layers: int, first: bool = False,
                           last: bool = False) -> int:
        """Tokens whose KV fits on every one of ``num_layers`` layers (0 if the weights don't fit)."""
        if num_layers <= 0:
            return 0
        b = self.dtype_bytes
        free = node.vram_bytes * self.serving.gpu_memory_utilization \
            - WORKSPACE_BYTES_PER_GPU * node.num_gpus * (node.gpu != "CPU") \
            - num_layers * self.model.layer_bytes(b) \
            - (self.model.embedding_bytes(b) if first else 0) \
            - (self.model.lm_head_bytes(b) if last else 0)
        if free <= 0:
            return 0
        return int(free // (num_layers * self.model.kv_bytes_per_token_per_layer(b)))

    @property
    def min_kv_tokens(self) -> int:
        """KV room a node must keep on each layer it holds (``serving.min_kv_requests`` requests)."""
        w = self.workload
        return max(1, math.ceil(self.serving.min_kv_requests *
                                (w.mean_prompt_tokens + w.mean_output_tokens)))

    def max_layers(self, node: NodeSpec, first: bool = False, last: bool = False) -> int:
        """Most layers the node can hold with the KV reserve (capped by its table, if any)."""
        limit = self.model.num_layers
        table = self.throughput_tables.get(node.label)
        if table is not None:
            limit = min(limit, len(table))
        need = self.min_kv_tokens
        best = 0
        for k in range(1, limit + 1):  # capacity falls monotonically with k
            if self.kv_capacity_tokens(node, k, first, last) < need:
                break
            best = k
        return best

    # --- throughput ---------------------------------------------------------------------------------
    def _operating_point(self, node: NodeSpec, num_layers: int) -> OperatingPoint:
        p, o = self.workload.mean_prompt_tokens, self.workload.mean_output_tokens
        kv_tokens = self.kv_capacity_tokens(node, num_layers)
        decode = min(self.serving.max_batch_seqs, int(kv_tokens // (p + o)))
        if decode < 1:
            return OperatingPoint(0.0, 0, 0.0)
        prompt = decode * p / o
        step = num_layers * self.layer_time_s(node, prompt, decode, p + o / 2, p / 2)
        return OperatingPoint(prompt, decode, step)

    def operating_point(self, node: NodeSpec, num_layers: int) -> OperatingPoint:
        return self._point(node, num_layers)

    def throughput_tokens_per_s(self, node: NodeSpec, num_layers: int) -> float:
        """T(k): tokens/s (prompt + decode) while holding ``num_layers`` layers; 0 if it can't."""
        if num_layers < 1:
            return 0.0
        table = self.throughput_tables.get(node.label)
        if table is not None:
            return float(table[num_layers - 1]) if num_layers <= len(table) else 0.0
        return self.operating_point(node, num_layers).throughput_tokens_per_s

    def throughput_table(self, node: NodeSpec) -> tuple[float, ...]:
        """T(1..max_layers) for the node (empty when it cannot hold a single layer)."""
        kmax = max(self.max_layers(node), self.max_layers(node, first=True),
                   self.max_layers(node, last=True))
        return tuple(self.throughput_tokens_per_s(node, k) for k in range(1, kmax + 1))

    def decode_layer_latency_s(self, node: NodeSpec, num_layers: int) -> float:
        """Per-layer share of one step at the operating point: a token's time per layer."""
        point = self.operating_point(node, num_layers)
        if point.decode_seqs < 1:
            return self.layer_time_s(node, 0, 1, self.workload.mean_prompt_tokens)
        return point.step_s / num_layers
