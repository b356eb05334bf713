"""Batched adapters benchmark (issue 17, PetS): how many tasks fit, and mixed-task batching speed.

1. **Memory budget** (LLaMA-2 7B shapes, float16, one 80 GB device): how many tasks fit when every task
   is a merged copy of the model, against one shared base plus each task's parameters in the
   representation the workers hold (:mod:`worker.adapters`; bytes measured on one layer's real terms,
   times the layers). Kinds: LoRA r=16 on all seven projections, bottleneck width 64 after o_proj and
   down_proj, BitFit on all seven, diff pruning touching 0.5 % of the weights (PetS's setting), a
   binary mask pruning 1 % (stored as the sparse correction).
2. **Throughput** on the built-in engine (CPU, one torch thread, a random 4-layer model of hidden 512,
   one slice holding the whole model): 128 requests (32 prompt tokens, 32 greedy output tokens each),
   LoRA r=8 tasks on all seven projections, loaded from files in Helix's format. Rows: the base model
   alone; one task; 16 and 64 tasks mixed in the same steps, against serving the same requests task
   by task (each task's requests as one batch, one task after the other). Each time is the best of
   two runs.

    python scripts/bench_adapters.py [--no-write]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from helix.models import ModelSpec, resolve_model  # noqa: E402
from helix.net.sampling import SamplingParams  # noqa: E402
from worker.adapters import (TARGETS, BiasTerm, BottleneckTerm, LoRATerm, sparse_term,  # noqa: E402
                             target_shape, term_bytes)
from worker.engine import EngineConfig, SliceEngine  # noqa: E402
from worker.local_pipeline import LocalPipeline, Prompt  # noqa: E402
from worker.model import LayerWeights, SliceWeights  # noqa: E402

SECTION = "## Batched adapters (`scripts/bench_adapters.py`, issue 17)"
BUDGET_BYTES = 80 * 10**9
N_REQUESTS, PROMPT_TOKENS, OUTPUT_TOKENS = 128, 32, 32


# --- 1. memory ----------------------------------------------------------------------------------------
def _layer_terms(spec: ModelSpec, kind: str) -> int:
    """Bytes of one layer's terms of ``kind`` (float16 values) as the worker holds them."""
    g = torch.Generator().manual_seed(0)
    half = torch.float16
    total = 0
    for target in TARGETS:
        out, inp = target_shape(spec, target)
        if kind == "lora":
            term = LoRATerm(torch.zeros(16, inp, dtype=half), torch.zeros(out, 16, dtype=half), 1.0)
        elif kind == "bottleneck":
            if target not in ("o_proj", "down_proj"):
                continue
            term = BottleneckTerm(torch.zeros(64, out, dtype=half), torch.zeros(out, 64, dtype=half))
        elif kind == "bitfit":
            term = BiasTerm(torch.zeros(out, dtype=half))
        else:
            nnz = int((0.005 if kind == "diff" else 0.01) * out * inp)
            flat = torch.randperm(out * inp, generator=g)[:nnz]
            term = sparse_term(torch.stack([flat // inp, flat % inp]), torch.zeros(nnz, dtype=half),
                               (out, inp))
        total += term_bytes(term)
    return total


def memory_rows() -> list[tuple[str, ...]]:
    spec = resolve_model("llama-2-7b")
    base = spec.total_params * 2
    merged = BUDGET_BYTES // base
    rows = []
    for kind in ("lora", "bottleneck", "bitfit", "diff", "mask"):
        task = _layer_terms(spec, kind) * spec.num_layers
        shared = (BUDGET_BYTES - base) // task
        rows.append((kind, f"{task / 2**20:,.1f}", f"{merged}", f"{shared:,}", f"{shared / merged:,.0f}x"))
        print(" | ".join(rows[-1]), flush=True)
    return rows


# --- 2. throughput ------------------------------------------------------------------------------------
def _spec() -> ModelSpec:
    return ModelSpec("bench-512", num_layers=4, hidden_size=512, num_heads=8, num_kv_heads=8,
                     intermediate_size=1408, vocab_size=4096, max_position_embeddings=512)


def _weights(spec: ModelSpec) -> SliceWeights:
    g = torch.Generator().manual_seed(0)
    h, inter, d = spec.hidden_size, spec.intermediate_size, spec.head_dim

    def w(*shape):
        return torch.randn(*shape, generator=g) * shape[-1] ** -0.5
    layers = [LayerWeights(w((spec.num_heads + 2 * spec.num_kv_heads) * d, h), w(h, spec.num_heads * d),
                           w(2 * inter, h), w(h, inter), torch.ones(h), torch.ones(h))
              for _ in range(spec.num_layers)]
    return SliceWeights(spec, 0, spec.num_layers, layers, embed=w(spec.vocab_size, h),
                        final_norm=torch.ones(h), lm_head=w(spec.vocab_size, h))


def _write_lora(folder: Path, spec: ModelSpec, seed: int, rank: int = 8) -> Path:
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(spec.num_layers):
        for target in TARGETS:
            out, inp = target_shape(spec, target)
            tensors[f"layers.{layer}.{target}.lora_A"] = torch.randn(rank, inp, generator=g) * 0.05
            tensors[f"layers.{layer}.{target}.lora_B"] = torch.randn(out, rank, generator=g) * 0.05
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "helix_adapter.json").write_text(json.dumps({"kind": "lora", "scale": 2.0}))
    save_file(tensors, str(folder / "adapter.safetensors"))
    return folder


def _run(engine: SliceEngine, batches: list[list[Prompt]], repeats: int = 2) -> float:
    """Seconds to serve ``batches`` one after the other (each to completion): the best of
    ``repeats`` runs (the machine is shared; the best run is the least disturbed)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for batch in batches:
            LocalPipeline([engine]).run(batch)
        best = min(best, time.perf_counter() - t0)
    return best


def throughput_rows(root: Path) -> list[tuple[str, ...]]:
    spec = _spec()
    engine = SliceEngine(_weights(spec), EngineConfig(max_num_seqs=N_REQUESTS, max_num_batched_tokens=4096,
                                                      kv_budget_bytes=512 * 2**20, device="cpu"))
    for k in range(64):
        engine.adapters.load(f"t{k}", _write_lora(root / f"t{k}", spec, k))
    g = torch.Generator().manual_seed(1)
    prompts = [tuple(torch.randint(3, spec.vocab_size, (PROMPT_TOKENS,), generator=g).tolist())
               for _ in range(N_REQUESTS)]
    params = SamplingParams(temperature=0, max_tokens=OUTPUT_TOKENS, ignore_eos=True)

    def requests(n_tasks: int | None) -> list[Prompt]:
        return [Prompt(i, p, params, None if n_tasks is None else f"t{i % n_tasks}")
                for i, p in enumerate(prompts)]
    _run(engine, [requests(1)[:8]])   # warm up
    tokens = N_REQUESTS * OUTPUT_TOKENS
    rows = []
    base_s = _run(engine, [requests(None)])
    rows.append(("base model alone", "1 batch", f"{base_s:.2f}", f"{tokens / base_s:,.0f}", ""))
    one_s = _run(engine, [requests(1)])
    rows.append(("1 task", "1 batch", f"{one_s:.2f}", f"{tokens / one_s:,.0f}", ""))
    print(*(" | ".join(r) for r in rows), sep="\n", flush=True)
    for n in (16, 64):
        reqs = requests(n)
        mixed_s = _run(engine, [reqs])
        by_task_s = _run(engine, [[r for r in reqs if r.adapter == f"t{k}"] for k in range(n)])
        rows.append((f"{n} tasks", "task by task", f"{by_task_s:.2f}", f"{tokens / by_task_s:,.0f}", ""))
        rows.append((f"{n} tasks", "mixed in one batch", f"{mixed_s:.2f}", f"{tokens / mixed_s:,.0f}",
                     f"{by_task_s / mixed_s:.2f}x; {base_s / mixed_s:.2f}x of the base"))
        print(*(" | ".join(r) for r in rows[-2:]), sep="\n", flush=True)
    return rows


def _table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                     + ["| " + " | ".join(r) + " |" for r in rows])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-write", action="store_true", help="do not append to BENCHMARKS.md")
    args = ap.parse_args()
    torch.set_num_threads(1)
    load0 = os.getloadavg()[0]
    mem = _table(("kind", "MiB per task", "merged copies that fit", "tasks that fit beside one base",
                  "more tasks"), memory_rows())
    with tempfile.TemporaryDirectory(prefix="helix-bench-adapters-") as tmp:
        thr = _table(("tasks", "served", "seconds", "output tokens/s", "mixed vs task by task"),
                     throughput_rows(Path(tmp)))
    print(mem, thr, sep="\n\n")
    if not args.no_write:
        entry = (f"\n### {time.strftime('%Y-%m-%d')}: `python scripts/bench_adapters.py`\n\n"
                 f"{platform.node() or 'this machine'}, {os.cpu_count()} cores, load average {load0:.1f} "
                 f"at the start, {os.getloadavg()[0]:.1f} at the end (shared machine: times are upper "
                 f"bounds); one torch thread.\n\nMemory: LLaMA-2 7B in float16 "
                 f"({resolve_model('llama-2-7b').total_params * 2 / 1e9:.1f} GB) on an 80 GB budget.\n\n"
                 f"{mem}\n\nThroughput: {N_REQUESTS} requests x {OUTPUT_TOKENS} greedy tokens "
                 f"({PROMPT_TOKENS}-token prompts), LoRA r=8 on every projection, CPU.\n\n{thr}\n")
        from bench_runtime import append_to_section   # scripts/ is this script's import path
        append_to_section(ROOT / "BENCHMARKS.md", SECTION, entry)


if __name__ == "__main__":
    main()
