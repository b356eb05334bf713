"""LLaMA decoder math for a slice of layers ``[start, end)``, with selective batching over paged KV.

One step's tokens (decodes and prefill chunks of many requests) form one ``[num_tokens, hidden]`` matrix
that every non-attention op (norms, projections, MLP, residuals) processes at once (Orca's selective
batching). Attention is per request over its paged KV, by one of the backends of
:mod:`worker.attention`: the paged kernels (Triton on CUDA, C on a CPU) read every continuing row's
keys through its block table in one call per layer; the ``gather`` fallback attends to the decodes
in a few padded batched calls grouped by context length and to each prefill chunk in one call. A
chunk that starts its request attends over the step's own keys (causal SDPA, no cache read).
A request that enters the slice at a later layer (the previous stage overlapped) is not computed at
the layers it skips: those layers run only the rows of the requests that entered by then.

The math is the Hugging Face ``LlamaForCausalLM`` forward: RMSNorm in float32, rotary embeddings of
:mod:`worker.rope`, grouped-query attention with scale ``head_dim ** -0.5``, SwiGLU MLP
``down(silu(gate(x)) * up(x))``. q/k/v and gate/up projections are concatenated into one matrix each
(one matmul instead of three / two; same dot products). On the ``triton`` backend a layer is ten
kernels: RMSNorm, the QKV GEMM, rotary + KV store, attention, the O GEMM, add + RMSNorm, the
gate-up GEMM, SiLU-mul, the down GEMM and the residual add (:mod:`worker.triton_ops`); on
``native`` eleven (the add and its RMSNorm apart; :mod:`worker.native`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from helix.core.models import ModelSpec
from worker.adapters import TaskRows, add_task_terms
from worker.attention import PagedLayout
from worker.kv_cache import PagedKVCache
from worker.rope import RotaryTable, apply_rotary


@dataclass
class LayerWeights:
    """One decoder layer (shapes as ``[out, in]`` like ``nn.Linear.weight``)."""

    qkv: torch.Tensor         # [(heads + 2 * kv_heads) * head_dim, hidden]
    o: torch.Tensor           # [hidden, heads * head_dim]
    gate_up: torch.Tensor     # [2 * intermediate, hidden]
    down: torch.Tensor        # [hidden, intermediate]
    input_norm: torch.Tensor  # [hidden]
    post_norm: torch.Tensor   # [hidden]


@dataclass
class SliceWeights:
    """Weights of layers ``[start, end)``; ``embed`` only on the first slice, ``final_norm`` and
    ``lm_head`` only on the last."""

    spec: ModelSpec
    start: int
    end: int
    layers: list[LayerWeights]
    embed: torch.Tensor | None = None       # [vocab, hidden]
    final_norm: torch.Tensor | None = None  # [hidden]
    lm_head: torch.Tensor | None = None     # [vocab, hidden]

    @property
    def is_first(self) -> bool:
        return self.start == 0

    @property
    def is_last(self) -> bool:
        return self.end == self.spec.num_layers


@dataclass
class PrefillAttention:
    """Attention of one prefill chunk: rows ``[row_start, row_start + num_tokens)`` of the step,
    positions ``[start, start + num_tokens)``, attending to positions ``[0, start + num_tokens)``.
    The context is read as whole blocks (``W = len(context_blocks) * block_size >= start + num_tokens``
    keys); keys past the context are masked out, or never seen under the plain causal mask."""

    row_start: int
    num_tokens: int
    start: int
    context_blocks: torch.Tensor | None   # [ceil((start + num_tokens) / block_size)] long; None when start == 0
    causal_mask: torch.Tensor | None   # [num_tokens, W] bool, None when start == 0


@dataclass
class DecodeGroup:
    """Decodes whose contexts have similar lengths, attended to in one padded batched call."""

    rows: torch.Tensor | None    # [g] long: their rows in the step; None = rows 0 .. g-1 in order
    blocks: torch.Tensor         # [g, max_blocks] long (padding points at block 0)
    mask: torch.Tensor | None
    """[1, g, 1, max_blocks * block_size] additive mask (0 for real keys, -inf for the padding),
    None when every context fills its blocks."""

    @property
    def size(self) -> int:
        return self.blocks.shape[0]


@dataclass
class StepBatch:
    """Everything about one step that every layer needs; built once per step."""

    positions: torch.Tensor            # [num_tokens] long
    slots: torch.Tensor                # [num_tokens] long: where each token's K/V goes
    num_decodes: int                   # rows [0, num_decodes) of the step are decodes
    decode_groups: list[DecodeGroup]   # gather backend: a partition of the decode rows
    prefills: list[PrefillAttention]
    """Gather backend: every prefill chunk; paged backends: the chunks that start their request."""
    paged: PagedLayout | None = None
    """Paged backends: the rows that continue a request (decodes, later chunks)."""
    max_position: int = 0
    """The largest of ``positions`` (known on the host: the rotary table is grown without a
    device sync)."""
    decode_kv_buffers: tuple[torch.Tensor, torch.Tensor] | None = None
    """Filled by the model on first use: where every layer gathers the decodes' keys / values
    (flat, sized for the largest group)."""
    layer_rows: dict[int, "RowSubset | None"] = field(default_factory=dict)
    """Slice layer index ``i`` -> the rows that run layer ``i`` when requests that enter the slice
    later skip it (None: no row runs it). Absent index = every row runs the layer (the common case,
    which costs nothing extra)."""
    tasks: TaskRows | None = None
    """The step's rows grouped by adapter task (None: every row runs the base model)."""


@dataclass
class RowSubset:
    """Some rows of a step, run as a step of their own by the layers they share."""

    rows: torch.Tensor    # [m] long: their rows in the full step, in order
    num_spans: int
    batch: StepBatch      # their positions, slots and attention layout, rows renumbered 0 .. m-1


class Linear:
    """``x @ weight.T`` with the CPU kernel that is fastest for the number of rows.

    float32 CPU weights are also kept in oneDNN's blocked layout (``to_mkldnn``) and multiplied by
    ``torch.ops.mkldnn._linear_pointwise``: on one thread, with a layer's four weights cycled as a
    step reads them (hidden 512 / intermediate 1408), 1.02-1.3x faster than MKL at every row count
    from 1 to 512 (at 32 rows 69 vs 63 GFLOP/s). Without oneDNN, MKL's pre-packed sgemm
    (``cblas_sgemm_pack``) serves 4-64 rows, where plain sgemm was measured 1.2-2.4x slower.
    Either way twice the weight memory, the same dot products up to float rounding. Elsewhere
    (CUDA, other dtypes) this is a plain matmul.
    """

    PACKED_ROWS = range(4, 65)

    def __init__(self, weight: torch.Tensor, pack: bool = True) -> None:
        self.weight = weight     # [out, in]
        self.onednn = None
        self.packed = None
        if pack and _can_onednn(weight):
            self.onednn = weight.to_mkldnn()
        elif pack and _can_pack(weight):
            self.packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, 32)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.onednn is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.onednn, None, "none", [], "")
        m = x.shape[0]
        if self.packed is not None and m in self.PACKED_ROWS:
            return torch.ops.mkl._mkl_linear(x, self.packed, self.weight, None, m)
        return x @ self.weight.T


def _can_onednn(weight: torch.Tensor) -> bool:
    return (weight.device.type == "cpu" and weight.dtype == torch.float32 and weight.dim() == 2
            and torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def _can_pack(weight: torch.Tensor) -> bool:
    return (weight.device.type == "cpu" and weight.dtype == torch.float32 and weight.dim() == 2
            and torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear"))


@dataclass
class _LayerLinears:
    qkv: Linear
    o: Linear
    gate_up: Linear
    down: Linear


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF LlamaRMSNorm: normalise in float32, scale in the input dtype."""
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        # PyTorch's fused kernel: the same float32 arithmetic in one op (bit-identical on CPU).
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


class SliceModel:
    """Runs ``SliceWeights`` over a :class:`StepBatch` with a :class:`PagedKVCache`.

    ``backend``: the attention backend (:func:`worker.attention.resolve_backend`; the step batches
    must be built for the same one)."""

    def __init__(self, weights: SliceWeights, kv: PagedKVCache, device: torch.device,
                 dtype: torch.dtype, pack_cpu_weights: bool = True, backend: str = "gather") -> None:
        self.w = weights
        p = pack_cpu_weights
        self.linears = [_LayerLinears(Linear(w.qkv, p), Linear(w.o, p), Linear(w.gate_up, p),
                                      Linear(w.down, p)) for w in weights.layers]
        self.lm_head = None if weights.lm_head is None else Linear(weights.lm_head, p)
        self.spec = weights.spec
        self.kv = kv
        self.device = device
        self.backend = backend
        self.rope = RotaryTable(self.spec, device, dtype)
        self.scale = self.spec.head_dim ** -0.5
        self._kv_buffers: tuple[torch.Tensor, torch.Tensor] | None = None
        self.rows_run = [0] * len(weights.layers)
        """Rows (tokens) each layer of the slice has processed so far: a work counter."""
        self._ops = None      # triton: every fused op
        self._native = None   # native: the C kernels
        if backend == "triton":
            from worker import triton_ops
            self._ops = triton_ops
        elif backend == "native":
            from worker import native
            self._native = native.load()
        self._fused = self._ops or self._native
        """Where rotary + KV store and SiLU-mul run as one kernel each (None: PyTorch ops)."""

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """``[num_tokens]`` ids -> ``[num_tokens, hidden]`` (first slice only)."""
        assert self.w.embed is not None, "only the first slice embeds token ids"
        return self.w.embed[token_ids]

    @torch.inference_mode()
    def forward(self, x: torch.Tensor, batch: StepBatch, keep: torch.Tensor | None = None) -> torch.Tensor:
        """Run every layer of the slice over ``x`` ([num_tokens, hidden]); returns the new hidden states.

        ``keep`` (row indices): only these rows' outputs are wanted (the last stage samples one row
        per request). The final layer then still computes attention and writes K/V for every row,
        but runs the output projection and the MLP only for the kept rows, and ``x[keep]``'s new
        states are returned. Same result for those rows: every op after attention is row-wise.

        Nothing here reads a device value on the host, so on the ``triton`` backend a decode step
        of fixed shapes can be captured in a CUDA graph."""
        self.rope.ensure(batch.max_position + 1)
        rope = {id(batch): self._rope_of(batch)}
        tasks = {id(batch): batch.tasks}
        last = len(self.linears) - 1
        for i, layer in enumerate(self.linears):
            if i not in batch.layer_rows:
                self.rows_run[i] += x.shape[0]
                x = self._layer(i, layer, x, batch, *rope[id(batch)], keep=keep if i == last else None,
                                tasks=batch.tasks)
                if i == last:
                    keep = None
                continue
            # Requests that enter the slice after layer i skip it: the rows that run it form a
            # step of their own (same math; their KV at layer i is written, the others' never is).
            sub = batch.layer_rows[i]
            if sub is None:
                continue
            if id(sub.batch) not in rope:
                rope[id(sub.batch)] = self._rope_of(sub.batch)
                tasks[id(sub.batch)] = batch.tasks and batch.tasks.subset(sub.rows)
            out = self._layer(i, layer, x[sub.rows], sub.batch, *rope[id(sub.batch)],
                              tasks=tasks[id(sub.batch)])
            x = x.index_copy(0, sub.rows, out)
            self.rows_run[i] += out.shape[0]
        return x if keep is None else x[keep]

    def _rope_of(self, batch: StepBatch) -> tuple[torch.Tensor, torch.Tensor]:
        if self._fused is not None:   # the rotary kernel looks its positions up itself
            return self.rope.cos, self.rope.sin
        return self.rope.lookup(batch.positions)

    @torch.inference_mode()
    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Final norm and LM head (last slice only): ``[n, hidden]`` -> ``[n, vocab]`` float32."""
        assert self.w.lm_head is not None, "only the last slice has the LM head"
        h = self._norm(x, self.w.final_norm)
        return self.lm_head(h).float()

    def _norm(self, x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor] | torch.Tensor:
        """RMSNorm of ``x`` (or, with ``residual``: ``(norm(residual + x), residual + x)``)."""
        eps = self.spec.rms_norm_eps
        if self._ops is not None:
            return self._ops.add_rms_norm(x, residual, weight, eps)
        if residual is None:
            return rms_norm(x, weight, eps)
        summed = residual + x
        return rms_norm(summed, weight, eps), summed

    def _layer(self, i: int, lin: _LayerLinears, x: torch.Tensor, batch: StepBatch, cos: torch.Tensor,
               sin: torch.Tensor, keep: torch.Tensor | None = None,
               tasks: TaskRows | None = None) -> torch.Tensor:
        """One decoder layer. ``tasks``: the rows' adapter tasks, whose terms every projection adds
        to its shared output (:mod:`worker.adapters`)."""
        spec, w = self.spec, self.w.layers[i]
        n, d = x.shape[0], spec.head_dim
        h = self._norm(x, w.input_norm)
        qkv = add_task_terms(lin.qkv(h), h, tasks, i, "qkv")   # [n, (H + 2 KVH) d]
        q_end, k_end = spec.num_heads * d, (spec.num_heads + spec.num_kv_heads) * d
        if self._fused is not None:
            qkv = qkv.contiguous()
            self._fused.rotary_and_store(qkv, batch.positions, cos, sin, batch.slots, self.kv.keys[i],
                                         self.kv.values[i], spec.num_heads, spec.num_kv_heads)
            q = qkv[:, :q_end].view(n, spec.num_heads, d)
            k = qkv[:, q_end:k_end].view(n, spec.num_kv_heads, d)   # rotated too
            v = qkv[:, k_end:].view(n, spec.num_kv_heads, d)
        else:
            # q and k rotate together: one set of elementwise ops for both.
            qk = apply_rotary(qkv[:, :k_end].view(n, spec.num_heads + spec.num_kv_heads, d), cos, sin)
            q, k = qk[:, :spec.num_heads], qk[:, spec.num_heads:]
            v = qkv[:, k_end:].view(n, spec.num_kv_heads, d)
            self.kv.write(i, batch.slots, k, v)
        attn = self._attention(i, q, batch, k, v)              # [n, H * d]
        if keep is not None:
            x, attn = x[keep], attn[keep]
            tasks = tasks and tasks.subset(keep)
        h, x = self._norm(add_task_terms(lin.o(attn), attn, tasks, i, "o"), w.post_norm, residual=x)
        gate_up = add_task_terms(lin.gate_up(h), h, tasks, i, "gate_up")   # [n, 2 inter]
        if self._fused is not None:
            act = self._fused.silu_mul(gate_up)
        else:
            gate, up = gate_up.chunk(2, dim=-1)
            act = F.silu(gate) * up
        return x + add_task_terms(lin.down(act), act, tasks, i, "down")

    def _attention(self, i: int, q: torch.Tensor, batch: StepBatch, k_step: torch.Tensor,
                   v_step: torch.Tensor) -> torch.Tensor:
        """Per-request attention over paged KV; ``q`` [n, H, d] -> [n, H * d]. ``k_step`` /
        ``v_step`` ([n, KVH, d]) are this step's own keys and values (already in the cache)."""
        n, heads, d = q.shape
        group = heads // self.spec.num_kv_heads
        out = torch.empty_like(q)
        p = batch.paged
        if p is not None:
            if self._ops is not None:
                self._ops.paged_attention(out, q, self.kv.keys[i], self.kv.values[i], p.block_tables,
                                          p.seq_lens, p.q_starts, p.q_lens, p.tile_seqs, p.tile_firsts,
                                          p.block_q, self.kv.block_size_tokens, self.scale)
            else:
                self._native.paged_attention(out, q, self.kv.keys[i], self.kv.values[i], p.block_tables,
                                             p.seq_lens, p.q_starts, p.q_lens, self.kv.block_size_tokens,
                                             self.scale)
        else:
            self._decode_groups_attention(i, q, batch, out)
        for c in batch.prefills:
            rows = slice(c.row_start, c.row_start + c.num_tokens)
            if c.start == 0:
                # A chunk that starts the request sees only its own keys: this step's k / v rows,
                # exactly what was just written to its slots (no read of the cache needed).
                k, v = k_step[rows].transpose(0, 1), v_step[rows].transpose(0, 1)   # [KVH, t, d]
            else:
                k, v = self.kv.read_blocks(i, c.context_blocks)      # [KVH, W, d]
            qc = q[rows].transpose(0, 1)[None]                        # [1, H, t, d]
            o = F.scaled_dot_product_attention(
                qc, k[None], v[None], scale=self.scale, attn_mask=c.causal_mask,
                is_causal=c.causal_mask is None, enable_gqa=group > 1)
            out[rows] = o[0].transpose(0, 1)
        return out.reshape(n, heads * d)

    def _decode_groups_attention(self, i: int, q: torch.Tensor, batch: StepBatch,
                                 out: torch.Tensor) -> None:
        """Gather backend: the decodes, group by group, each context gathered then SDPA."""
        heads, d = q.shape[1], q.shape[2]
        kv_heads = self.spec.num_kv_heads
        group = heads // kv_heads
        for g in batch.decode_groups:
            # Attention is independent per (request, head), so KV heads play SDPA's batch dim and
            # requests its head dim; the query heads sharing a KV head (GQA) are extra query rows.
            k, v = self.kv.read_blocks(i, g.blocks, out=self._gather_buffers(batch, g))
            qg = q[:g.size] if g.rows is None else q.index_select(0, g.rows)
            qd = qg.view(g.size, kv_heads, group, d).transpose(0, 1)          # [KVH, g, group, d]
            o = F.scaled_dot_product_attention(qd, k, v, attn_mask=g.mask,
                                               scale=self.scale)
            o = o.transpose(0, 1).reshape(g.size, heads, d)
            if g.rows is None:
                out[:g.size] = o
            else:
                out.index_copy_(0, g.rows, o)

    def _gather_buffers(self, batch: StepBatch, g: DecodeGroup) -> tuple[torch.Tensor, torch.Tensor]:
        """Contiguous key and value buffers for group ``g``'s padded contexts: views of flat buffers
        allocated once per step (sized for the largest group) and reused by every layer and group.
        Writing into memory already touched is measured up to 2x faster on CPU than a fresh
        multi-megabyte tensor per read (page faults)."""
        kv_heads, bs_d = self.spec.num_kv_heads, self.kv.block_size_tokens * self.spec.head_dim
        if batch.decode_kv_buffers is None:
            numel = kv_heads * max(x.blocks.numel() for x in batch.decode_groups) * bs_d
            if self._kv_buffers is None or self._kv_buffers[0].numel() < numel:
                self._kv_buffers = (torch.empty(numel, dtype=self.kv.keys.dtype, device=self.device),
                                    torch.empty(numel, dtype=self.kv.keys.dtype, device=self.device))
            batch.decode_kv_buffers = self._kv_buffers
        shape = (kv_heads, g.blocks.numel(), bs_d)
        n = kv_heads * g.blocks.numel() * bs_d
        return tuple(buf[:n].view(shape) for buf in batch.decode_kv_buffers)
