"""The paged-attention kernels and the fused Triton ops against plain PyTorch, and the engine on the
Triton path against transformers.

The Triton kernels run here in Triton's interpreter (``TRITON_INTERPRET=1``, set before the module
is imported): the same kernel source a GPU compiles, executed with NumPy on the CPU. The C kernel
is built with the machine's compiler.
"""

from __future__ import annotations

import os
import subprocess
import sys

os.environ["TRITON_INTERPRET"] = "1"   # before triton_ops is imported anywhere in this process

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from worker import native  # noqa: E402
from worker.rope import apply_rotary  # noqa: E402
from tests.conftest import REPO_ROOT  # noqa: E402

pytest.importorskip("triton", reason="needs triton (installed by [dev])")
from worker import triton_ops  # noqa: E402

#: (heads, kv heads): grouped-query 4:1, plain multi-head, and 8:1 (TinyLlama's ratio).
HEAD_SHAPES = [(8, 2), (4, 4), (16, 2)]


def _case(heads: int, kv_heads: int, seed: int, head_dim: int = 32, block_size: int = 8):
    """A cache of 40 shuffled blocks and four sequences: two decodes, a later prompt chunk, and a
    chunk whose first query sits exactly on a block edge."""
    gen = torch.Generator().manual_seed(seed)
    num_blocks = 40
    k_cache = torch.randn(kv_heads, num_blocks * block_size, head_dim, generator=gen)
    v_cache = torch.randn(kv_heads, num_blocks * block_size, head_dim, generator=gen)
    seq_lens, q_lens = [37, 70, 5, 48], [1, 21, 1, 8]
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    tables, at = [], 0
    for n in seq_lens:
        used = -(-n // block_size)
        tables.append(perm[at:at + used])
        at += used
    width = max(len(t) for t in tables)
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    q_starts = [0, 1, 22, 23]
    q = torch.randn(sum(q_lens), heads, head_dim, generator=gen)
    i32 = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    return dict(q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables,
                seq_lens=i32(seq_lens), q_starts=i32(q_starts), q_lens=i32(q_lens),
                tables=tables, block_size=block_size, scale=head_dim ** -0.5)


def _reference(case) -> torch.Tensor:
    """SDPA over each sequence's keys, gathered slot by slot, with the causal mask by position."""
    q, bs = case["q"], case["block_size"]
    out = torch.full_like(q, float("nan"))
    for s, table in enumerate(case["tables"]):
        n, t, first = int(case["seq_lens"][s]), int(case["q_lens"][s]), int(case["q_starts"][s])
        slots = torch.tensor([table[p // bs] * bs + p % bs for p in range(n)])
        k, v = case["k_cache"][:, slots], case["v_cache"][:, slots]
        positions = torch.arange(n - t, n)
        mask = torch.arange(n)[None, :] <= positions[:, None]
        rows = q[first:first + t].transpose(0, 1)[None]
        o = F.scaled_dot_product_attention(rows, k[None], v[None], attn_mask=mask, scale=case["scale"],
                                           enable_gqa=True)
        out[first:first + t] = o[0].transpose(0, 1)
    return out


def test_loading_the_native_kernels_keeps_subnormal_floats():
    """The shared object must not switch the loading process to flush-to-zero (as -ffast-math's
    crtfastmath.o does): checked in a fresh interpreter, the smallest double times one stays > 0."""
    code = ("from worker import native\nlib = native.load()\n"
            "print('none' if lib is None else repr(5e-324 * float(__import__('sys').argv[1])))")
    out = subprocess.run([sys.executable, "-c", code, "1.0"], capture_output=True, text=True, timeout=300,
                         cwd=REPO_ROOT, check=True).stdout.strip()
    if out == "none":
        pytest.skip("no C compiler here: the engine uses the gather backend")
    assert float(out) > 0, "loading the native kernels turned on flush-to-zero"


@pytest.mark.parametrize("heads,kv_heads", HEAD_SHAPES)
def test_native_paged_attention_matches_sdpa(heads, kv_heads):
    lib = native.load()
    if lib is None:
        pytest.skip("no C compiler here: the engine uses the gather backend")
    case = _case(heads, kv_heads, seed=heads)
    out = torch.full_like(case["q"], float("nan"))
    lib.paged_attention(out, case["q"], case["k_cache"], case["v_cache"], case["block_tables"],
                        case["seq_lens"], case["q_starts"], case["q_lens"], case["block_size"], case["scale"])
    torch.testing.assert_close(out, _reference(case), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("heads,kv_heads", HEAD_SHAPES)
@pytest.mark.parametrize("block_q", [1, 4, 16])
def test_triton_paged_attention_matches_sdpa(heads, kv_heads, block_q):
    case = _case(heads, kv_heads, seed=10 + heads)
    seqs, firsts = triton_ops.attention_tiles(case["q_lens"].tolist(), block_q)
    out = torch.full_like(case["q"], float("nan"))
    triton_ops.paged_attention(out, case["q"], case["k_cache"], case["v_cache"], case["block_tables"],
                               case["seq_lens"], case["q_starts"], case["q_lens"],
                               torch.tensor(seqs, dtype=torch.int32),
                               torch.tensor(firsts, dtype=torch.int32), block_q, case["block_size"],
                               case["scale"])
    torch.testing.assert_close(out, _reference(case), atol=2e-6, rtol=1e-5)


def test_triton_add_rms_norm_and_silu_mul_match_pytorch():
    gen = torch.Generator().manual_seed(3)
    x, res, w = (torch.randn(5, 96, generator=gen), torch.randn(5, 96, generator=gen),
                 torch.randn(96, generator=gen))
    normed, summed = triton_ops.add_rms_norm(x, res, w, 1e-5)
    torch.testing.assert_close(summed, res + x, atol=0, rtol=0)
    torch.testing.assert_close(normed, F.rms_norm(res + x, (96,), w, 1e-5), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(triton_ops.add_rms_norm(x, None, w, 1e-5), F.rms_norm(x, (96,), w, 1e-5),
                               atol=1e-6, rtol=1e-6)
    gate_up = torch.randn(3, 2 * 100, generator=gen)
    torch.testing.assert_close(triton_ops.silu_mul(gate_up), F.silu(gate_up[:, :100]) * gate_up[:, 100:],
                               atol=1e-6, rtol=1e-6)


def test_triton_rotary_rotates_q_and_k_and_stores_k_and_v():
    heads, kv_heads, d, n = 4, 2, 16, 5
    gen = torch.Generator().manual_seed(4)
    qkv = torch.randn(n, (heads + 2 * kv_heads) * d, generator=gen)
    positions = torch.tensor([3, 0, 17, 9, 30])
    cos, sin = torch.randn(32, d, generator=gen), torch.randn(32, d, generator=gen)
    slots = torch.tensor([5, 100, 7, 300, 41])
    k_cache, v_cache = torch.zeros(kv_heads, 320, d), torch.zeros(kv_heads, 320, d)
    out = qkv.clone()
    triton_ops.rotary_and_store(out, positions, cos, sin, slots, k_cache, v_cache, heads, kv_heads)
    c, s = cos[positions][:, None], sin[positions][:, None]
    qk = apply_rotary(qkv[:, :(heads + kv_heads) * d].view(n, heads + kv_heads, d), c, s)
    torch.testing.assert_close(out[:, :(heads + kv_heads) * d].view(n, heads + kv_heads, d), qk,
                               atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(k_cache[:, slots].transpose(0, 1), qk[:, heads:], atol=1e-6, rtol=1e-6)
    v = qkv[:, (heads + kv_heads) * d:].view(n, kv_heads, d)
    torch.testing.assert_close(v_cache[:, slots].transpose(0, 1), v, atol=0, rtol=0)
    torch.testing.assert_close(out[:, (heads + kv_heads) * d:], qkv[:, (heads + kv_heads) * d:])


@pytest.mark.parametrize("graphs", ["off", "eager"])
def test_engine_on_triton_kernels_matches_hf(tiny_ckpt, prompts, graphs):
    """The whole Triton path (fused ops, paged attention, decode steps through the graphs' static
    buffers) in a two-stage chain, greedy tokens equal to transformers'."""
    from tests.builders.threads import one_torch_thread
    from helix.net.sampling import SamplingParams
    from worker.engine import SliceEngine
    from worker.engine_config import EngineConfig
    from worker.local_pipeline import LocalPipeline, Prompt
    ckpt, model = tiny_ckpt
    chosen = prompts[:4]
    want = []
    with one_torch_thread():
        for ids in chosen:
            gen = model.generate(torch.tensor([ids]), max_new_tokens=5, do_sample=False,
                                 eos_token_id=2, pad_token_id=0)
            want.append(gen[0, len(ids):].tolist())
    config = EngineConfig(eos_token_ids=(2,), attention="triton", decode_graphs=graphs,
                          max_num_batched_tokens=24)
    engines = [SliceEngine.from_checkpoint(ckpt, s, e, config) for s, e in ((0, 5), (5, 8))]
    got = LocalPipeline(engines).run([Prompt(i, tuple(ids), SamplingParams(temperature=0, max_tokens=5))
                                      for i, ids in enumerate(chosen)])
    assert [got[i] for i in range(len(chosen))] == want
    if graphs == "eager":
        assert all(e.graphs.replays > 0 for e in engines)


def test_native_rotary_store_and_silu_mul_match_pytorch():
    lib = native.load()
    if lib is None:
        pytest.skip("no C compiler here: the engine uses the gather backend")
    heads, kv_heads, d, n = 4, 2, 16, 5
    gen = torch.Generator().manual_seed(5)
    qkv = torch.randn(n, (heads + 2 * kv_heads) * d, generator=gen)
    positions = torch.tensor([3, 0, 17, 9, 30])
    half = torch.randn(32, d // 2, generator=gen)
    cos, sin = torch.cat([half.cos(), half.cos()], 1), torch.cat([half.sin(), half.sin()], 1)
    slots = torch.tensor([5, 100, 7, 300, 41])
    k_cache, v_cache = torch.zeros(kv_heads, 320, d), torch.zeros(kv_heads, 320, d)
    out = qkv.clone()
    lib.rotary_and_store(out, positions, cos, sin, slots, k_cache, v_cache, heads, kv_heads)
    qk = apply_rotary(qkv[:, :(heads + kv_heads) * d].view(n, heads + kv_heads, d),
                      cos[positions][:, None], sin[positions][:, None])
    torch.testing.assert_close(out[:, :(heads + kv_heads) * d].view(n, heads + kv_heads, d), qk,
                               atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(k_cache[:, slots].transpose(0, 1), qk[:, heads:], atol=1e-6, rtol=1e-6)
    v = qkv[:, (heads + kv_heads) * d:].view(n, kv_heads, d)
    torch.testing.assert_close(v_cache[:, slots].transpose(0, 1), v, atol=0, rtol=0)
    gate_up = torch.randn(3, 2 * 100, generator=gen)
    torch.testing.assert_close(lib.silu_mul(gate_up), F.silu(gate_up[:, :100]) * gate_up[:, 100:],
                               atol=1e-6, rtol=1e-5)
