"""Cost model: how long a layer takes, how much KV fits, and a node's throughput T(k).

Three sources, most specific wins:

1. an explicit throughput table in the spec (``performance.throughput_tables``) replaces T(k)
   entirely, so published planner inputs can be reproduced exactly;
2. a measured profile (``performance.profiles``) replaces the analytic one-layer time;
3. otherwise the analytic roofline below.

**Analytic one-layer time** for a batch of P prompt tokens (mean attention context ``c_p``) and D
decode sequences (context ``c_d``) on a node of n GPUs of one kind, tensor parallel. A layer runs
as kernels one after another on the GPU's stream (GEMMs, then attention, ...), so each kernel
family gets its own roofline and their times ADD (:class:`LayerWork`, :func:`work_time_s`)::

    t_linear  = max((P + D) * 2 W / (n peak e_c),  (W b + (A + kv) (P + D)) / (n bw e_m))
    t_prompt  = 4 H_q P c_p / (n peak e_c)                       # prefill attention, tensor cores
    t_decode  = D c_d kv (1 + (G - 1) rho) / (n bw e_m)           # paged decode attention
    t         = t_linear + t_prompt + t_decode + overhead
              + 2 all-reduces * (2 (n-1)/n * (P + D) * h * b / link  +  2 (n-1) * latency)  # n > 1

with W the layer's matrix parameters, b bytes per element, H_q = heads x head_dim, kv the KV bytes
per token per layer, A the activation bytes a token moves through memory in one layer, e_c and e_m
the kind's achievable fractions of peak (calibrated, see ``helix.core.hardware``), G = query heads / KV
heads and rho the kind's ``kv_reread_cost`` (:data:`~helix.core.hardware.DEFAULT_KV_REREAD_COST` for
GPUs, 0 for the CPU kind: helix's own engine attends each KV head with its whole group at once).

*Why a sum and not one max.* The earlier model took ``max(all flops / compute, all bytes / bw)``,
which lets the decode attention's KV traffic hide under the GEMMs' compute. That never happens:
the attention kernel starts when the GEMMs end. It matters once the GEMMs are compute bound (D
past the ridge, ~190 sequences on an A100): there the KV read is paid on top.

*Grouped-query attention (G > 1).* KV bytes per token shrink by G, but the decode kernel the
profiles were measured with (vLLM's PagedAttention v1/v2, ``csrc/attention/attention_kernels.cu``)
launches one thread block per (query head, sequence[, partition]); the G query heads of a group
each read their KV head's blocks again (vLLM issue #1880: the kernel "does not leverage the
benefits of MQA/GQA"; issue #15351 profiles >800 MB of L1<-L2 traffic for 64 MB of K and V at
64 query / 8 KV heads). The first read comes from DRAM, the G - 1 re-reads mostly from L2, which
is faster but not free: a re-read costs rho of a DRAM read. rho = 0.35 is read off a published
kernel timing, vLLM PR #2744 (A100-40GB-PCIe, 64 query / 8 KV heads, head 128, context 1,024,
PagedAttention v1): 37.5 us at 1 sequence, 68.6 us at 4, so 10.4 us per sequence, where the
sequence's own KV (1,024 x 8 heads x 512 B = 4.2 MB) takes 3.0 us at 1,555 GB/s x 0.9: 3.45x,
``1 + 7 rho = 3.45``. It cannot be fitted to the LLaMA-1 30B profiles (G = 1 there) and was not.
A kernel that shares KV across a group (FlashAttention >= 2.5, FlashInfer) would have rho ~ 0.

*What else grows with D, and is not modelled.* Per-sequence fixed costs per layer (block-table
reads, a thread block's setup and reduction): the 30B decode slopes scale with 1 / bandwidth
across kinds (A100 19 us per sequence per layer, L4 98, T4 101 at small D), leaving at most
~2 us per sequence that does not; below the fit's noise. Sampling is once per step (last stage),
not per layer: ``helix profile`` measures it in the step's fixed cost. The attention kernel's
launch and tail (~30 us at small contexts, ONNX Runtime's FA2 paged-decode benchmark, onnxruntime
PR #21414) sit in ``overhead``.

*Checked* (``scripts/bench_costmodel.py``; BENCHMARKS.md, *Cost model*) against the 30B profiles,
prompt and decode apart: in sample, and leave one GPU kind out (factors fitted on the other
kinds). The profiles have no context column; decode points are compared at 832 tokens, the best
fit (the one-max model fitted best at 1,024). Measured GQA 70B profiles held back from us show decode
growing with D about 2x faster than the one-max model on an A100 at 400 sequences, with prompt
times within a few per cent; this model predicts 2.2x the one-max model there and the same prompt
times (the sum adds ~1.3x, the re-reads the rest).

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
- one step passes k layers: ``step = k * t_layer(P, D) + t_fixed(P, D)``, and
  ``T(k) = (P + D) / step``; ``t_fixed`` is the step's cost apart from its layers (scheduling,
  building the batch), measured by ``helix profile`` and 0 otherwise.

T(k) falls with k twice: each step passes more layers, and KV per layer shrinks so batches do.

**Inside a pipeline** T(k) overstates what a node delivers (on single24 ~10x): a request's KV is
reserved on *every* stage it crosses, and a stage batches only the requests that are at it now.
What a plan delivers is derived per pipeline (:mod:`planner.prediction` computes it; o is the mean
output, p the mean prompt):

- *requests in flight*: the coordinator reserves ``p_res + o`` tokens on every layer of every
  stage (``p_res``: the mean prompt of requests in flight, ``workload.resident_prompt_tokens``),
  so node v holds at most ``M_v = kv_high_water x KV capacity / (p_res + o)`` requests, shared by
  all pipelines through it (:meth:`CostModel.resident_requests`);
- *operating point of a stage*: a node's decodes arrive in waves: each pipeline's requests travel
  around it (stages, links, coordinator, back to stage 0) in about W waves, and a node steps once
  per wave, so ``steps/s = sum over its pipelines of W / R`` and its decode batch is
  ``D_v = decode tokens/s through v / steps/s``. A step holds at most C tokens (the step budget,
  ``serving.chunk_tokens``): where the waves bring more (decodes and prompt pieces, ``(p + o)`` per
  request), the step policy cuts them into more steps, ``steps/s >= rate_v (p + o) / C`` (without
  this a wave above C left prompts one token a step: the reference single24's one 24-stage
  pipeline, ~330 decodes a wave, was predicted 16.8 decode tokens/s at C = 256 against 432
  simulated; now 477). Each step also carries prefill: requests join at
  the rate they finish, ``D_v / o`` per step, each bringing p prompt tokens whole; with fewer
  than one per step a step takes ``t_v = k x [t_layer(0, D_v) + D_v / o x (t_layer(p, D_v) -
  t_layer(0, D_v))]``, else ``k x t_layer(D_v p / o, D_v)`` (:meth:`CostModel.stage_step_s`:
  T(k)'s operating point with D_v instead of every KV-resident request; a layer's time is a max
  of compute and memory time, so a prompt spread thinly over every step would cost too little);
- *round trip*: a token visits every stage. At each it first waits out the step in progress:
  a plain step of another wave (t0_v, a fraction 1 - s_v of the steps) or one carrying a prompt
  piece (t1_v, a fraction s_v), ``steps/s x [(1 - s_v) t0_v^2 + s_v t1_v^2] / 2``, then rides a
  plain step, or one carrying another pipeline's prompt piece (at nodes pipelines share), with
  its wave's decodes, ``N / W`` (weighted over the node's pipelines by their decode rates), not
  D_v: where the budget cuts more steps than waves, D_v averages in steps that carry prompt
  pieces and few decodes, and a token sees the size-biased step (a generated 20-node, 2-region
  chain at 256: D_v ~ 50, the decodes' own steps ~165, each 1.6x as long);
  plus link latencies, bytes / bandwidth and the wait behind the message each link is sending
  (a prompt's hidden states take a second on a 100 Mb/s link), coordinator hop included; a
  stage steps at most back to back, so with many thin pipelines through it
  ``D_v = decode tokens/s x t_v``;
- *convoy*: prompts hold decodes up at every stage they share, not at one. A prompt crosses the
  stages in long steps and leaves the pipeline ``Delta = sum_v (t1_v - t0_v)`` behind a decode
  wave that entered with it. A wave entering ``a`` after it catches it up at some stage and from
  then on reaches each stage while the prompt's step there runs (the prompt left the stage
  before just as the wave's short step began): it exits ``max(0, Delta - a)`` late. Only the
  latest prompt counts (earlier ones are further ahead); prompts enter Poisson at the pipeline's
  request rate lambda, so ``a ~ Exp(lambda)`` and a round trip carries ``E[max(0, Delta - a)] =
  Delta - (1 - exp(-lambda Delta)) / lambda``: ``lambda Delta^2 / 2`` when prompts are rare (S
  stages of equal steps: S^2 times one stage's residual, where a per-stage residual gives S
  times it; measured on hetero42's 18-stage pipelines: a token that waits, waits 82 ms, where one
  residual is ~13), ``Delta - 1 / lambda`` when they overlap. Other pipelines' prompts do the
  same along the nodes two pipelines share (``Delta_ij``: the excess summed over those nodes; at
  a node shared with nobody it is the residual of the piece's excess, the rest of the wait being
  what a plain step costs). The streams overlap, and a wave is held by the latest prompt of each,
  not by the sum of their delays: they are taken as one stream with the same first two moments
  of ``lambda x Delta``, and a prompt's Delta grows with its length (its first piece, and the
  pieces after it), so the moments are taken over the prompts' lengths
  (``planner.prediction.model.Model.convoys_s``);
- *chunked prefill*: with a step budget C a step carries ``piece = min(p, C - D_v)`` prompt
  tokens, so a prompt takes ``p / piece`` steps at each stage (fractional: the last piece is a
  short one). The pieces follow one another down the pipeline, each stage forwarding a piece
  when its step ends, so the later pieces leave paced by the slowest stage:
  ``Delta = sum_v (t1_v - t0_v) + (p / piece - 1) max_v t1_v``, where t1_v is a step with one
  piece. A smaller budget shortens every prompt step (fewer decodes wait behind a long one) but
  stretches the prompt over more steps;
- *first token*: the prompt's pieces are the convoy's head, and they cross the links as they
  cross the stages: a link forwards a piece while the stage before it runs the next, so only the
  first piece's bytes add up over the links, and the later pieces leave paced by the slowest
  stage or link (``n = p / piece`` pieces, ``s_max`` the slowest hop's seconds per token):
  ``F = sum_v (t0_v + wait_v) + links + sum_v (t1_v - t0_v) + (n - 1) max(max_v t1_v,
  piece x s_max) + piece x bytes / bandwidth`` (on geo24's 100 Mb/s crossings a 256-token piece
  takes 0.33 s there, longer than any step; charging every piece's bytes at every slow link put
  its TTFT p50 24 % above the simulator's, now 8 % below). Its prompt-dependent part is scaled by
  each request's prompt length for the TTFT median;
- *Little's law*: a request stays ``T = F + (o - 1) R``; a pipeline with N requests in flight
  serves ``N / T`` requests/s, ``o N / T`` decode tokens/s, ``(p + o) N / T`` tokens/s;
- N is what the KV allows: every pipeline grows in proportion to its share of the requests until
  a node's ``M_v`` (or its compute, T(k)) is used up; D, t, R and N are iterated to a fixed point
  (the batches and the request rates mixed together, damped, Anderson-accelerated near the fixed
  point: ``planner.prediction.fixed_point.Mixer`` argues why it converges where damping D alone cycled).

With one stage and one wave this is T(k) again, capped by Little's law. W = 2 is measured, not
derived: in the simulator the decodes of a 10- or 12-stage T4 chain move in 2.1-2.5 waves (the
waves a convoy catches leave it together); mixed A100/L4 pipelines move in 3-5, with little
effect since their steps barely grow with the batch.

Checked against ``helix simulate`` by ``scripts/bench_fidelity.py`` (BENCHMARKS.md, *Plan vs
simulator*): at step budgets of 256 (the default) and 512 every case holds (throughput within
15 %, TTFT and TPOT p50 within 25 %); at 1,024 and 2,048 decode holds within 14 % on the four
cases (it overstated them by up to 41 % while only a pipeline's own prompts made convoys), and
so do the latencies except on geo24's 3-region chain, whose TPOT p50 is understated by 31 % and
42 % (its decodes queue behind the prompts' pieces on the 100 Mb/s crossings, and a piece on
a link, like one on a stage, holds up the waves behind it over the following hops: not
modelled); at 128, where a wave's decodes exceed what a step holds beside a piece, decode errs
by up to 24 %. So 1,024, 2,048 and 128 stay outside ``helix.core.serving.CHECKED_STEP_BUDGETS``
and ``helix plan`` says so. The offline runs are read as the prediction is meant: a steady state
at the spec's lengths (lengths drawn from the whole trace, the run's second half; the trace in
order drifts to ~20 % longer prompts, and the first minutes are the fill, every request the KV
holds prefilled at once; in the steady state a stage's steps carry 5-25 decodes).

*What limits it* (hetero42 at 512, its plan's steady state, 300-600 s of a stationary run):
the requests in flight (1,071 simulated, 1,082 predicted) and the first token (1.79 vs 1.80 s)
hold, and every stage runs back to back (busy 0.6-1.0), so W does not bind (a stage's steps/s is
``1 / t_v``); the round trip is short, 0.794 s predicted vs 0.891 s simulated (decode-weighted),
hence decode +13 % (a 1,500 s run settles ~2 % lower still). Why: a decode is not in a random
step. A step carrying a prompt piece leaves with the decodes that reached its stage meanwhile and
the next stage runs them together again, so decodes ride piece steps about twice as often as
steps are piece steps (first stage: 33 % of decodes vs 16 % of steps; 42.7 decodes a piece step,
16.7 a plain one). The convoy term then charged that only for the pipeline's own prompts; on hetero42
a pipeline's stages are shared with hundreds of others, whose prompts hold its decodes up too
(see *convoy*).

For the planner's flow graph (linear in the placement), the same law gives a node's capacity while
holding k layers, given the stay T of the pipelines it serves: ``min(T(k), M_v(k) (p + o) / T)``
(:meth:`CostModel.pipeline_capacity_tokens_per_s`; ``planner.predicted`` iterates it).

**Adapter terms** (:func:`adapter_layer_time_s`, the simulator's charge per step). A
step that carries requests of fine-tuned tasks runs, on every layer, the shared products once and
then each task's own term over its rows only (:mod:`worker.adapters`): per task group g of n_g
rows (prompt tokens + decodes of the task's requests in the step) and per adapted projection
(in x out), a LoRA of rank r is two small GEMMs and an add back into the output::

    flops_g = 2 n_g r (in + out)                                  # X A, then (X A) B
    bytes_g = r (in + out) b  +  n_g (in + 2 out + 2 r) b          # A and B once per group; rows
                                                                   #   of X read, of Y read and
                                                                   #   written, X A out and in
    t_g     = max(flops_g / (n peak e_c), bytes_g / (n bw e_m)) + kernels x launch_s

summed over the targets and the groups (kernels = 3: two GEMMs and the add; launch_s =
:data:`ADAPTER_KERNEL_LAUNCH_S`). The GEMMs are far below the ridge (r = 16), so a group costs
its parameters' bytes plus its launches: what grows with the number of *distinct* tasks in a
step, not with its rows (Punica and S-LoRA measured the same of per-task LoRA loops: the launches
and the parameter reads dominate at small batches, which is why they fuse them; our engine does
not). Base-model rows add nothing. Tensor parallel splits a term as it splits the layer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from helix.core.hardware import GiB, GpuKind
from helix.core.models import ModelSpec
from helix.core.profiles import MeasuredProfile
from helix.core.serving import UNCHUNKED_STEP_TOKENS
from helix.core.spec import ClusterSpec, NodeSpec, ServingSpec, WorkloadSpec

#: Memory kept free on each GPU for activations and the CUDA context, bytes.
WORKSPACE_BYTES_PER_GPU = 0.5 * GiB


@dataclass(frozen=True)
class LayerWork:
    """What one decoder layer asks of the hardware in one step, by kernel family (they run one
    after another on the GPU's stream, so their times add). Totals over all GPUs of the node."""

    linear_flops: float
    """GEMMs (q/k/v/o projections, MLP): 2 FLOPs per multiply-accumulate, tensor cores."""
    linear_bytes: float
    """Weights, activations and the KV written for the step's new tokens."""
    prompt_attention_flops: float
    """Prefill attention (QK^T and PV over the prompt), tensor cores."""
    decode_attention_bytes: float
    """KV that decode attention moves: each context token's KV, its GQA re-reads weighted."""
    allreduce_bytes: float
    """Hidden states of the step's tokens: one tensor-parallel all-reduce message."""


def layer_work(model: ModelSpec, dtype_bytes: int, prompt_tokens: float, decode_seqs: float,
               decode_context: float, prompt_context: float, kv_reread_cost: float) -> LayerWork:
    """One layer's work for a step (formulas in the module docstring); ``kv_reread_cost`` is the
    GPU kind's (:attr:`~helix.core.hardware.GpuKind.kv_reread_cost`)."""
    b, tokens = dtype_bytes, prompt_tokens + decode_seqs
    kv = model.kv_bytes_per_token_per_layer(b)
    group = model.num_heads / model.num_kv_heads
    # A token's activations are written and read by every op of the layer: ~2 x (4 h + 3 ffn).
    act_bytes = 2 * (4 * model.hidden_size + 3 * model.intermediate_size) * b
    return LayerWork(
        linear_flops=tokens * model.linear_flops_per_token_per_layer,
        linear_bytes=model.layer_bytes(b) + (act_bytes + kv) * tokens,
        prompt_attention_flops=prompt_tokens * model.attention_flops_per_token_per_layer(
            prompt_context),
        decode_attention_bytes=decode_seqs * decode_context * kv
        * (1 + (group - 1) * kv_reread_cost),
        allreduce_bytes=tokens * model.hidden_size * b)


def work_time_s(work: LayerWork, gpu: GpuKind, num_gpus: int) -> float:
    """Seconds for ``work`` on ``num_gpus`` GPUs of one kind, tensor parallel."""
    n = num_gpus
    flops = n * gpu.fp16_flops * gpu.compute_efficiency
    bandwidth = n * gpu.memory_bandwidth_bytes_per_s * gpu.memory_efficiency
    t = max(work.linear_flops / flops, work.linear_bytes / bandwidth) \
        + work.prompt_attention_flops / flops + work.decode_attention_bytes / bandwidth \
        + gpu.layer_overhead_s
    if n > 1:
        ring = 2 * (n - 1) / n * work.allreduce_bytes / gpu.interconnect_bytes_per_s \
            + 2 * (n - 1) * gpu.allreduce_latency_s
        t += 2 * ring  # one all-reduce after attention, one after the MLP
    return t


def analytic_layer_time_s(model: ModelSpec, gpu: GpuKind, num_gpus: int, dtype_bytes: int,
                          prompt_tokens: float, decode_seqs: float, decode_context: float,
                          prompt_context: float) -> float:
    """Roofline time of one decoder layer for one step (formula in the module docstring)."""
    if prompt_tokens + decode_seqs <= 0:
        return 0.0
    return work_time_s(layer_work(model, dtype_bytes, prompt_tokens, decode_seqs, decode_context,
                                  prompt_context, gpu.kv_reread_cost), gpu, num_gpus)


def analytic_layer_time_fn(model: ModelSpec, gpu: GpuKind, num_gpus: int, dtype_bytes: int
                           ) -> Callable[[float, float, float, float], float]:
    """:func:`analytic_layer_time_s` for one model and node, as a function of the step alone:
    ``f(prompt_tokens, decode_seqs, decode_context, prompt_context)``. What does not depend on the
    step is worked out once, and the rest is computed in the same order as
    :func:`layer_work` and :func:`work_time_s`, so both give the same floats (the simulator calls
    this once per step)."""
    b, n = dtype_bytes, num_gpus
    kv = model.kv_bytes_per_token_per_layer(b)
    group = model.num_heads / model.num_kv_heads
    act_kv = 2 * (4 * model.hidden_size + 3 * model.intermediate_size) * b + kv
    linear_flops_per_token = model.linear_flops_per_token_per_layer
    weight_bytes = model.layer_bytes(b)
    heads, head_dim, hidden = model.num_heads, model.head_dim, model.hidden_size
    reread = 1 + (group - 1) * gpu.kv_reread_cost
    flops = n * gpu.fp16_flops * gpu.compute_efficiency
    bandwidth = n * gpu.memory_bandwidth_bytes_per_s * gpu.memory_efficiency
    overhead = gpu.layer_overhead_s
    ring_scale = 2 * (n - 1) / n
    ring_latency = 2 * (n - 1) * gpu.allreduce_latency_s
    interconnect = gpu.interconnect_bytes_per_s

    def layer_time(prompt_tokens: float, decode_seqs: float, decode_context: float,
                   prompt_context: float) -> float:
        tokens = prompt_tokens + decode_seqs
        if tokens <= 0:
            return 0.0
        t = max(tokens * linear_flops_per_token / flops,
                (weight_bytes + act_kv * tokens) / bandwidth) \
            + prompt_tokens * (4.0 * prompt_context * heads * head_dim) / flops \
            + decode_seqs * decode_context * kv * reread / bandwidth + overhead
        if n > 1:
            ring = ring_scale * (tokens * hidden * b) / interconnect + ring_latency
            t += 2 * ring
        return t

    return layer_time


#: Seconds to launch one small kernel of an adapter term (and, on a CPU node, one PyTorch op's
#: dispatch): CUDA's launch latency is ~3-5 us for back-to-back launches (NVIDIA's CUDA
#: programming guide, "kernel launch overhead"; nsys traces of PyTorch eager mode show 4-6 us per
#: small op), a few us of PyTorch dispatch ride on top.
ADAPTER_KERNEL_LAUNCH_S = 5e-6

#: Kernels per adapted projection per task group: X A, (X A) B, the add into the output.
ADAPTER_KERNELS_PER_TARGET = 3


@dataclass(frozen=True)
class AdapterShape:
    """The tasks' parameter-efficient terms as the cost model charges them: LoRA of ``rank`` on
    ``targets`` (Hugging Face projection names) of every layer."""

    rank: int = 16
    targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                "down_proj")

    def projections(self, model: ModelSpec) -> tuple[tuple[int, int], ...]:
        """``(in, out)`` of each target of ``model``."""
        h, d, inter = model.hidden_size, model.head_dim, model.intermediate_size
        shapes = {"q_proj": (h, model.num_heads * d), "k_proj": (h, model.num_kv_heads * d),
                  "v_proj": (h, model.num_kv_heads * d), "o_proj": (model.num_heads * d, h),
                  "gate_proj": (h, inter), "up_proj": (h, inter), "down_proj": (inter, h)}
        unknown = [t for t in self.targets if t not in shapes]
        if unknown:
            raise ValueError(f"unknown adapter target(s) {unknown}; known: {', '.join(shapes)}")
        return tuple(shapes[t] for t in self.targets)


def adapter_layer_time_s(model: ModelSpec, gpu: GpuKind, num_gpus: int, dtype_bytes: int,
                         group_rows: Sequence[float], shape: AdapterShape = AdapterShape()) -> float:
    """Seconds the task terms add to ONE layer of a step whose task groups have ``group_rows``
    rows each (formula in the module docstring; base-model rows are not in ``group_rows``)."""
    b, r, n = dtype_bytes, shape.rank, num_gpus
    flops_rate = n * gpu.fp16_flops * gpu.compute_efficiency
    bytes_rate = n * gpu.memory_bandwidth_bytes_per_s * gpu.memory_efficiency
    launches = ADAPTER_KERNELS_PER_TARGET * ADAPTER_KERNEL_LAUNCH_S
    projections = shape.projections(model)
    total = 0.0
    for rows in group_rows:
        if rows <= 0:
            continue
        for inp, out in projections:
            flops = 2 * rows * r * (inp + out)
            nbytes = r * (inp + out) * b + rows * (inp + 2 * out + 2 * r) * b
            total += max(flops / flops_rate, nbytes / bytes_rate) + launches
    return total


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

    def layer_time_fn(self, node: NodeSpec) -> Callable[[float, float, float, float], float]:
        """:meth:`layer_time_s` of ``node`` as ``f(prompt_tokens, decode_seqs, decode_context,
        prompt_context)`` (contexts given), the same floats with the per-node work done once."""
        profile = self.profiles.get(node.label)
        if profile is not None:
            return profile.layer_time_s
        return analytic_layer_time_fn(self.model, node.kind, node.num_gpus, self.dtype_bytes)

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

    def adapter_step_s(self, node: NodeSpec, num_layers: int, group_rows: Sequence[float],
                       shape: AdapterShape = AdapterShape()) -> float:
        """Seconds the task terms add to a step through ``num_layers`` layers of ``node``
        (:func:`adapter_layer_time_s` per layer; the roofline's, also for profiled nodes: the
        profiles measure the base model only)."""
        return num_layers * adapter_layer_time_s(self.model, node.kind, node.num_gpus,
                                                 self.dtype_bytes, group_rows, shape)

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
        chunk = self.serving.chunk_tokens
        if chunk > 0:   # a step's budget holds its decodes and the prompts joining them (p : o)
            decode = min(decode, int(chunk * o // (p + o)))
        else:   # whole prompts (one may exceed the unchunked budget), decodes held to it
            decode = min(decode, UNCHUNKED_STEP_TOKENS)
        if decode < 1:
            return OperatingPoint(0.0, 0, 0.0)
        prompt = decode * p / o
        step = num_layers * self.layer_time_s(node, prompt, decode, p + o / 2, p / 2) \
            + self.step_overhead_s(node, prompt, decode, p + o / 2, p / 2)
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

    # --- inside a pipeline (module docstring) -----------------------------------------------------
    def stage_step_s(self, node: NodeSpec, num_layers: int, decode_seqs: float,
                     extra_prompt_tokens: float = 0.0) -> float:
        """Mean step of a stage of ``num_layers`` layers with ``decode_seqs`` decodes and the
        prompts that join them (``decode_seqs / o`` per step, whole), plus ``extra_prompt_tokens``."""
        return self.stage_step_moments(node, num_layers, decode_seqs, extra_prompt_tokens)[0]

    def stage_step_moments(self, node: NodeSpec, num_layers: int, decode_seqs: float,
                           extra_prompt_tokens: float = 0.0) -> tuple[float, float]:
        """(E[t], E[t^2]) of :meth:`stage_step_s`'s steps: the few that carry a prompt are long,
        and a token arriving at a busy stage waits out the step in progress, E[t^2] / (2 E[t])."""
        base, full, share = self.stage_step_parts(node, num_layers, decode_seqs, extra_prompt_tokens)
        return base + share * (full - base), (1 - share) * base ** 2 + share * full ** 2

    def stage_step_parts(self, node: NodeSpec, num_layers: int, decode_seqs: float,
                         extra_prompt_tokens: float = 0.0) -> tuple[float, float, float]:
        """(plain step, step carrying a prompt piece, share of steps that carry one) of a stage
        with ``decode_seqs`` decodes whose prompts join them (``decode_seqs / o`` per step). When
        every step carries prompt tokens the two steps are one (share 1)."""
        p, o = self.workload.mean_prompt_tokens, self.workload.mean_output_tokens
        d, ctx = decode_seqs, p + o / 2
        joining = d / o   # prompts per step

        def step(prompt_tokens: float) -> float:   # k layers and the step's fixed cost
            return num_layers * self.layer_time_s(node, prompt_tokens, d, ctx, p / 2) \
                + self.step_overhead_s(node, prompt_tokens, d, ctx, p / 2)
        piece = self.prompt_piece_tokens(d)
        share = joining * p / piece   # steps that carry a prompt piece
        if share >= 1:
            t = step(min(joining * p, self.prompt_room_tokens(d)) + extra_prompt_tokens)
            return t, t, 1.0
        # Prompts come whole, or in chunks when the step's budget is smaller: a fraction of the
        # steps carries a piece (a layer's time is a max of compute and memory time, so spreading
        # the prompt over every step would undercount it).
        return step(extra_prompt_tokens), step(piece + extra_prompt_tokens), share

    def prompt_room_tokens(self, decode_seqs: float) -> float:
        """Prompt tokens a step with ``decode_seqs`` decodes has room for (the step's token budget
        less its decodes; unbounded with chunking off)."""
        chunk = self.serving.chunk_tokens
        return math.inf if chunk <= 0 else max(1.0, chunk - decode_seqs)

    def prompt_piece_tokens(self, decode_seqs: float) -> float:
        """Prompt tokens a step that carries some carries: a whole mean prompt, or the room left."""
        return min(self.workload.mean_prompt_tokens, self.prompt_room_tokens(decode_seqs))

    def resident_requests(self, node: NodeSpec, num_layers: int, first: bool = False,
                          last: bool = False) -> float:
        """M: requests the coordinator lets the node hold (it reserves prompt + expected output on
        every layer, up to ``kv_high_water`` of the KV capacity)."""
        w = self.workload
        per_request = (w.resident_prompt_tokens or w.mean_prompt_tokens) + round(w.mean_output_tokens)
        return self.serving.kv_high_water * \
            self.kv_capacity_tokens(node, num_layers, first, last) / per_request

    def pipeline_capacity_tokens_per_s(self, node: NodeSpec, num_layers: int,
                                       stay_s: float) -> float:
        """Tokens/s (prompt + decode) the node delivers holding ``num_layers`` layers when each
        request stays ``stay_s`` in its pipeline: ``min(T(k), M(k) (p + o) / stay)``."""
        w = self.workload
        little = self.resident_requests(node, num_layers) * \
            (w.mean_prompt_tokens + w.mean_output_tokens) / stay_s
        return min(self.throughput_tokens_per_s(node, num_layers), little)

    def decode_layer_latency_s(self, node: NodeSpec, num_layers: int) -> float:
        """Per-layer share of one step at the operating point: a token's time per layer."""
        point = self.operating_point(node, num_layers)
        if point.decode_seqs < 1:
            return self.layer_time_s(node, 0, 1, self.workload.mean_prompt_tokens)
        return point.step_s / num_layers
