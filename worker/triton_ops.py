"""Triton kernels of the GPU decode path: paged attention, add + RMSNorm, rotary + KV store, SiLU-mul.

Each kernel replaces a chain of PyTorch ops that launched one CUDA kernel each (a decode layer went
from ~43 launches to 9: these four kernels twice for the norms, plus the four GEMMs). They follow
the Hugging Face LLaMA math of :mod:`worker.model` (RMSNorm in float32 then scaled in the model's
dtype, HF's rotate-half rotary, softmax in float32), so float32 results match the PyTorch path up
to summation order.

Importing this module needs ``triton``; :func:`available` says whether the kernels can run here
(a CUDA device, or Triton's interpreter on the CPU with ``TRITON_INTERPRET=1``, which is how the
tests run them without a GPU).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


def available(device: torch.device) -> bool:
    """Whether these kernels run on ``device``: CUDA, or any device under ``TRITON_INTERPRET=1``."""
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


# --- paged attention ------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["stride_bt"])   # the step's block-table width: one variant
def _paged_attention_kernel(
        out_ptr, q_ptr, k_ptr, v_ptr, block_tables_ptr, seq_lens_ptr, q_starts_ptr, q_lens_ptr,
        tile_seq_ptr, tile_first_ptr, scale,
        stride_qt, stride_qh, stride_ot, stride_oh, stride_kh, stride_ks, stride_bt,
        GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr,
        HEAD_DIM: tl.constexpr, KV_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr,
        IEEE: tl.constexpr):
    # One program: up to BLOCK_Q query tokens of one sequence x the GROUP query heads that share
    # KV head `kvh` (rows = token-major, head-minor), against that sequence's keys read block by
    # block through its block table (never copied out of the cache).
    tile = tl.program_id(0)
    kvh = tl.program_id(1)
    seq = tl.load(tile_seq_ptr + tile)
    first = tl.load(tile_first_ptr + tile)          # first query token of the tile, within the seq
    q_start = tl.load(q_starts_ptr + seq)           # its first query row in the step
    q_len = tl.load(q_lens_ptr + seq)
    seq_len = tl.load(seq_lens_ptr + seq)           # keys: positions [0, seq_len)
    ctx0 = seq_len - q_len                          # position of the sequence's first query token

    rows = tl.arange(0, BLOCK_M)
    tok = first + rows // GROUP_PAD
    hig = rows % GROUP_PAD
    row_ok = (rows < BLOCK_Q * GROUP_PAD) & (tok < q_len) & (hig < GROUP)
    head = kvh * GROUP + hig
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + (q_start + tok)[:, None] * stride_qt + head[:, None] * stride_qh + dims[None, :],
                mask=row_ok[:, None], other=0.0)
    pos = ctx0 + tok                                # each row's position: it sees keys [0, pos]

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    last = tl.minimum(ctx0 + first + BLOCK_Q, seq_len)   # keys the tile's last token sees
    k_base = k_ptr + kvh.to(tl.int64) * stride_kh   # a layer's cache may pass 2^31 elements
    v_base = v_ptr + kvh.to(tl.int64) * stride_kh
    for start in range(0, last, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        n_ok = n < last
        block = tl.load(block_tables_ptr + seq * stride_bt + n // KV_BLOCK, mask=n_ok, other=0)
        slot = block.to(tl.int64) * KV_BLOCK + n % KV_BLOCK
        k = tl.load(k_base + slot[:, None] * stride_ks + dims[None, :], mask=n_ok[:, None], other=0.0)
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = s * scale
        seen = (n[None, :] <= pos[:, None]) & n_ok[None, :]
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)   # rows that saw nothing yet
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + slot[:, None] * stride_ks + dims[None, :], mask=n_ok[:, None], other=0.0)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(out_ptr + (q_start + tok)[:, None] * stride_ot + head[:, None] * stride_oh + dims[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


def query_tile(group: int, max_q_len: int) -> int:
    """Query tokens one attention program takes: 1 for decodes (a tile per sequence), more for
    prompt chunks (so the keys read once serve many queries)."""
    if max_q_len <= 1:
        return 1
    return max(1, min(_pow2(max_q_len), 64 // _pow2(group)))


def attention_tiles(q_lens: list[int], block_q: int) -> tuple[list[int], list[int]]:
    """(sequence, first query token) of every program of a step whose sequences have ``q_lens``
    query tokens each, ``block_q`` tokens a program."""
    seqs, firsts = [], []
    for s, n in enumerate(q_lens):
        for first in range(0, n, block_q):
            seqs.append(s)
            firsts.append(first)
    return seqs, firsts


def paged_attention(out: torch.Tensor, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    block_tables: torch.Tensor, seq_lens: torch.Tensor, q_starts: torch.Tensor,
                    q_lens: torch.Tensor, tile_seqs: torch.Tensor, tile_firsts: torch.Tensor,
                    block_q: int, block_size: int, scale: float) -> None:
    """Causal attention of query rows over paged KV, written into ``out`` rows.

    ``q``/``out`` ``[T, heads, head_dim]``; ``k_cache``/``v_cache`` one layer's ``[kv_heads, slots,
    head_dim]``; sequence ``s`` has query rows ``[q_starts[s], q_starts[s] + q_lens[s])`` at positions
    ``seq_lens[s] - q_lens[s] ...`` and keys at positions ``[0, seq_lens[s])`` in blocks
    ``block_tables[s]`` (``[S, max_blocks]`` int32). Programs: ``tile_seqs``/``tile_firsts`` from
    :func:`attention_tiles` with ``block_q``. Rows of ``out`` outside these sequences are untouched.
    Every argument is a device tensor of fixed shape, so the call can be captured in a CUDA graph."""
    heads, head_dim = q.shape[1], q.shape[2]
    kv_heads = k_cache.shape[0]
    group = heads // kv_heads
    group_pad = _pow2(group)
    block_m = max(16, block_q * group_pad)
    assert head_dim == _pow2(head_dim) and head_dim >= 16, f"head_dim {head_dim} must be a power of 2 >= 16"
    assert q.stride(-1) == 1 and out.stride(-1) == 1 and k_cache.stride(-1) == 1
    block_n = max(16, block_size, 64 if block_m <= 32 else 32)
    grid = (tile_seqs.shape[0], kv_heads)
    _paged_attention_kernel[grid](
        out, q, k_cache, v_cache, block_tables, seq_lens, q_starts, q_lens, tile_seqs, tile_firsts,
        scale, q.stride(0), q.stride(1), out.stride(0), out.stride(1), k_cache.stride(0),
        k_cache.stride(1), block_tables.stride(0),
        GROUP=group, GROUP_PAD=group_pad, BLOCK_Q=block_q, BLOCK_M=block_m, HEAD_DIM=head_dim,
        KV_BLOCK=block_size, BLOCK_N=block_n, IEEE=q.dtype == torch.float32)


# --- add + RMSNorm --------------------------------------------------------------------------------
@triton.jit
def _add_rms_norm_kernel(x_ptr, residual_ptr, weight_ptr, out_ptr, sum_ptr, eps, stride_x, stride_r,
                         stride_o, stride_s, hidden, HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < hidden
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0)
    if HAS_RESIDUAL:
        x = (x + tl.load(residual_ptr + row * stride_r + cols, mask=ok, other=0.0)).to(x.dtype)
        tl.store(sum_ptr + row * stride_s + cols, x, mask=ok)
    xf = x.to(tl.float32)
    var = tl.sum(xf * xf, 0) / hidden
    normed = (xf * tl.rsqrt(var + eps)).to(x.dtype)
    w = tl.load(weight_ptr + cols, mask=ok, other=0.0)
    tl.store(out_ptr + row * stride_o + cols, (w.to(tl.float32) * normed.to(tl.float32)).to(x.dtype),
             mask=ok)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor] | torch.Tensor:
    """HF's RMSNorm of ``x`` in one kernel; with ``residual``: of ``residual + x``, returning
    ``(normalised, residual + x)`` (new tensors; the inputs are only read)."""
    n, hidden = x.shape
    out = torch.empty_like(x)
    summed = torch.empty_like(x) if residual is not None else out
    if n:
        res = residual if residual is not None else x
        _add_rms_norm_kernel[(n,)](x, res, weight, out, summed, eps, x.stride(0), res.stride(0),
                                   out.stride(0), summed.stride(0), hidden,
                                   HAS_RESIDUAL=residual is not None, BLOCK=_pow2(hidden))
    return out if residual is None else (out, summed)


# --- rotary + KV store ------------------------------------------------------------------------------
@triton.jit
def _rotary_store_kernel(qkv_ptr, positions_ptr, cos_ptr, sin_ptr, slots_ptr, k_cache_ptr, v_cache_ptr,
                         stride_t, stride_cos, stride_kh, stride_ks,
                         HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HALF: tl.constexpr):
    # One program per (token, head) of q and k; the kv heads also store k (rotated) and v.
    t = tl.program_id(0)
    h = tl.program_id(1)
    pos = tl.load(positions_ptr + t)
    i = tl.arange(0, HALF)
    base = qkv_ptr + t * stride_t + h * (2 * HALF)
    x1 = tl.load(base + i)
    x2 = tl.load(base + HALF + i)
    c1 = tl.load(cos_ptr + pos * stride_cos + i)
    c2 = tl.load(cos_ptr + pos * stride_cos + HALF + i)
    s1 = tl.load(sin_ptr + pos * stride_cos + i)
    s2 = tl.load(sin_ptr + pos * stride_cos + HALF + i)
    # HF: x * cos + rotate_half(x) * sin, each product rounded in the model's dtype.
    y1 = ((x1 * c1).to(x1.dtype) + (-x2 * s1).to(x1.dtype)).to(x1.dtype)
    y2 = ((x2 * c2).to(x1.dtype) + (x1 * s2).to(x1.dtype)).to(x1.dtype)
    tl.store(base + i, y1)
    tl.store(base + HALF + i, y2)
    if h >= HEADS:
        kvh = (h - HEADS).to(tl.int64)
        slot = tl.load(slots_ptr + t).to(tl.int64)
        dst = k_cache_ptr + kvh * stride_kh + slot * stride_ks
        tl.store(dst + i, y1)
        tl.store(dst + HALF + i, y2)
        v_src = qkv_ptr + t * stride_t + (HEADS + KV_HEADS + kvh) * (2 * HALF)
        vdst = v_cache_ptr + kvh * stride_kh + slot * stride_ks
        tl.store(vdst + i, tl.load(v_src + i))
        tl.store(vdst + HALF + i, tl.load(v_src + HALF + i))


def rotary_and_store(qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     heads: int, kv_heads: int) -> None:
    """Rotate the q and k parts of ``qkv`` (``[n, (heads + 2 kv_heads) * head_dim]``, contiguous) in
    place and write the rotated k and the v of each token to ``slots`` of one layer's cache
    (``[kv_heads, slots, head_dim]``); ``cos``/``sin`` are ``[positions, head_dim]`` tables."""
    n = qkv.shape[0]
    if n == 0:
        return
    head_dim = k_cache.shape[-1]
    assert qkv.is_contiguous() and cos.stride(-1) == 1 and k_cache.stride(-1) == 1
    _rotary_store_kernel[(n, heads + kv_heads)](
        qkv, positions, cos, sin, slots, k_cache, v_cache, qkv.stride(0), cos.stride(0),
        k_cache.stride(0), k_cache.stride(1), HEADS=heads, KV_HEADS=kv_heads, HALF=head_dim // 2,
        num_warps=1, enable_fp_fusion=False)   # HF rounds each product: no fma.rn.f16 contraction


# --- SiLU(gate) * up ------------------------------------------------------------------------------
@triton.jit
def _silu_mul_kernel(gate_up_ptr, out_ptr, stride_in, stride_out, inter, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < inter
    g = tl.load(gate_up_ptr + row * stride_in + cols, mask=ok, other=0.0)
    u = tl.load(gate_up_ptr + row * stride_in + inter + cols, mask=ok, other=0.0)
    gf = g.to(tl.float32)
    act = (gf / (1.0 + tl.exp(-gf))).to(g.dtype)   # F.silu, computed in float32 as PyTorch does
    tl.store(out_ptr + row * stride_out + cols, (act * u).to(g.dtype), mask=ok)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of ``[n, 2 * inter]`` (gate first) -> ``[n, inter]``."""
    n, two_inter = gate_up.shape
    inter = two_inter // 2
    out = torch.empty((n, inter), dtype=gate_up.dtype, device=gate_up.device)
    if n == 0:
        return out
    block = 1024
    _silu_mul_kernel[(n, triton.cdiv(inter, block))](gate_up, out, gate_up.stride(0), out.stride(0),
                                                      inter, BLOCK=block)
    return out
