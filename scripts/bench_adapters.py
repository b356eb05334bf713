"""Batched adapters benchmark (PetS): how many tasks fit, and mixed-task batching speed.

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
   two runs, in CPU seconds of the process.
3. **Tasks on disk** (beyond PetS, as S-LoRA and Punica do for LoRA): 1,000 LoRA tasks (r=8, all
   seven projections, float16 files) registered on the same engine (headers only), their
   parameters made ready on demand into the worker's LRU cache of packed adapters, whose budget
   holds 96 of them. The 128 requests go to 64 tasks drawn from the 1,000 (two each), all in one
   batch: first cold (every task a miss, read inside the step that admits it), then the same again
   warm (hits), then 64 other tasks (misses that evict); against the base model alone on the same
   prompts (run before each of the three; the best of those), in CPU seconds of the process (wall
   times on a shared machine swing with its load). Cache misses, hits, evictions and load times
   from the worker's own counters.

    python scripts/bench_adapters.py [--no-write] [--part all|memory|throughput|cache]

Each part rewrites its own block of BENCHMARKS.md (``bench_adapters-memory``, ``-throughput``,
``-cache``), so a run of one part leaves the others' figures as they are.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from helix.core.models import ModelSpec, resolve_model
from helix.net.sampling import SamplingParams
from worker.adapters import (
    TARGETS,
    BiasTerm,
    BottleneckTerm,
    LoRATerm,
    sparse_term,
    target_shape,
    term_bytes,
)
from worker.engine import SliceEngine
from worker.engine_config import EngineConfig
from worker.local_pipeline import LocalPipeline, Prompt
from worker.model import LayerWeights, SliceWeights

HEADING = "## Batched adapters (`scripts/bench_adapters.py`)"
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


def _write_lora(folder: Path, spec: ModelSpec, seed: int, rank: int = 8,
                dtype: torch.dtype = torch.float32) -> Path:
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(spec.num_layers):
        for target in TARGETS:
            out, inp = target_shape(spec, target)
            a, b = torch.randn(rank, inp, generator=g), torch.randn(out, rank, generator=g)
            tensors[f"layers.{layer}.{target}.lora_A"] = (a * 0.05).to(dtype)
            tensors[f"layers.{layer}.{target}.lora_B"] = (b * 0.05).to(dtype)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "helix_adapter.json").write_text(json.dumps({"kind": "lora", "scale": 2.0}))
    save_file(tensors, str(folder / "adapter.safetensors"))
    return folder


def _run(engine: SliceEngine, batches: list[list[Prompt]], repeats: int = 2,
         clock=time.process_time) -> float:
    """CPU seconds of this process to serve ``batches`` one after the other (each to completion):
    the best of ``repeats`` runs. With one torch thread that is the work done, whatever else the
    machine runs (its wall time swung 2x between identical runs at load 14); ``clock``
    ``time.perf_counter`` for wall seconds."""
    best = float("inf")
    for _ in range(repeats):
        t0 = clock()
        for batch in batches:
            LocalPipeline([engine]).run(batch)
        best = min(best, clock() - t0)
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


# --- 3. tasks on disk, LRU cache ------------------------------------------------------------------
N_REGISTERED, N_ACTIVE, CACHE_TASKS = 1000, 64, 96


def _cache_counts(engine: SliceEngine, before) -> tuple[str, ...]:
    s = engine.adapters.cache_stats()   # load times: over the loads so far (none: no new one)
    load = (f"{s.load_s_p50 * 1e3:.1f} / {s.load_s_p99 * 1e3:.1f}" if s.misses > before.misses else "")
    return (f"{s.misses - before.misses}", f"{s.hits - before.hits}", f"{s.evictions - before.evictions}",
            load, f"{s.bytes_cached / 2**20:,.0f}")


def cache_rows(root: Path) -> tuple[list[tuple[str, ...]], str]:
    spec = _spec()
    t0 = time.perf_counter()
    folders = [_write_lora(root / f"d{k}", spec, 1000 + k, dtype=torch.float16)
               for k in range(N_REGISTERED)]
    write_s = time.perf_counter() - t0
    probe = SliceEngine(_weights(spec), EngineConfig(device="cpu", kv_budget_bytes=2**20,
                                                     pack_cpu_weights=False))
    one = probe.adapters.register("x", folders[0]).nbytes   # packed bytes of one task (all alike)
    budget = CACHE_TASKS * one
    engine = SliceEngine(_weights(spec), EngineConfig(max_num_seqs=N_REQUESTS, max_num_batched_tokens=4096,
                                                      kv_budget_bytes=512 * 2**20, device="cpu",
                                                      adapter_cache_bytes=budget))
    t0 = time.perf_counter()
    for k, folder in enumerate(folders):
        engine.adapters.register(f"d{k}", folder)
    register_s = time.perf_counter() - t0
    g = torch.Generator().manual_seed(2)
    prompts = [tuple(torch.randint(3, spec.vocab_size, (PROMPT_TOKENS,), generator=g).tolist())
               for _ in range(N_REQUESTS)]
    params = SamplingParams(temperature=0, max_tokens=OUTPUT_TOKENS, ignore_eos=True)
    draw = torch.randperm(N_REGISTERED, generator=g).tolist()
    first, second = draw[:N_ACTIVE], draw[N_ACTIVE:2 * N_ACTIVE]

    def requests(tasks: list[int] | None) -> list[Prompt]:
        return [Prompt(i, p, params, None if tasks is None else f"d{tasks[i % len(tasks)]}")
                for i, p in enumerate(prompts)]
    LocalPipeline([engine]).run(requests(None)[:8])   # warm up (the base model only: no task read)
    tokens = N_REQUESTS * OUTPUT_TOKENS
    # The base model runs before each row too: on a shared machine the best of those is its time.
    base_runs, measured = [], []
    for label, tasks, repeats in ((f"{N_ACTIVE} tasks, cold", first, 1),
                                  (f"the same {N_ACTIVE}, warm", first, 2),
                                  (f"{N_ACTIVE} other tasks, cold", second, 1)):
        base_runs.append(_run(engine, [requests(None)], 1))
        before = engine.adapters.cache_stats()
        run_s = _run(engine, [requests(tasks)], repeats)
        counts = _cache_counts(engine, before)
        if repeats > 1:   # the counts of one run
            counts = (counts[0], str(int(counts[1]) // repeats), *counts[2:])
        measured.append((label, counts, run_s))
        print(label, *counts, f"{run_s:.2f} CPU s (base just before: {base_runs[-1]:.2f})", flush=True)
    base_s = min(base_runs)
    rows = [("base model alone", "", "", "", "", "", f"{base_s:.2f}", f"{tokens / base_s:,.0f}", "1.00x")]
    rows += [(label, *counts, f"{run_s:.2f}", f"{tokens / run_s:,.0f}", f"{base_s / run_s:.2f}x")
             for label, counts, run_s in measured]
    setup = (f"{N_REGISTERED:,} tasks written in {write_s:.0f} s ({one * N_REGISTERED / 2**30:.2f} GiB "
             f"packed in float32 in all), registered in {register_s:.2f} s "
             f"({register_s / N_REGISTERED * 1e3:.2f} ms each: headers only); cache budget "
             f"{budget / 2**20:,.0f} MiB = {CACHE_TASKS} tasks of {one / 2**20:.2f} MiB")
    print(setup, flush=True)
    return rows, setup


def _table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                     + ["| " + " | ".join(r) + " |" for r in rows])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-write", action="store_true", help="do not write BENCHMARKS.md")
    ap.add_argument("--part", choices=("all", "memory", "throughput", "cache"), default="all",
                    help="which measurement to run (default: all three)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    load0 = os.getloadavg()[0]
    parts = {}
    if args.part in ("all", "memory"):
        mem = _table(("kind", "MiB per task", "merged copies that fit", "tasks that fit beside one base",
                      "more tasks"), memory_rows())
        base_gb = resolve_model('llama-2-7b').total_params * 2 / 1e9
        parts["memory"] = f"Memory: LLaMA-2 7B in float16 ({base_gb:.1f} GB) on an 80 GB budget.\n\n{mem}"
    with tempfile.TemporaryDirectory(prefix="helix-bench-adapters-") as tmp:
        if args.part in ("all", "throughput"):
            thr = _table(("tasks", "served", "CPU seconds", "output tokens per CPU s",
                          "mixed vs task by task"), throughput_rows(Path(tmp)))
            parts["throughput"] = (f"Throughput: {N_REQUESTS} requests x {OUTPUT_TOKENS} greedy tokens "
                                   f"({PROMPT_TOKENS}-token prompts), LoRA r=8 on every projection, CPU; "
                                   f"CPU seconds of the process (one torch thread).\n\n{thr}")
        if args.part in ("all", "cache"):
            rows, setup = cache_rows(Path(tmp))
            cache = _table(("run", "misses", "hits", "evictions", "load p50 / p99 ms", "MiB cached",
                            "CPU seconds", "output tokens per CPU s", "vs the base"), rows)
            parts["cache"] = (f"Tasks on disk, LRU cache of packed adapters: {setup}. {N_REQUESTS} requests "
                              f"x {OUTPUT_TOKENS} greedy tokens over {N_ACTIVE} tasks drawn from the "
                              f"{N_REGISTERED:,}, one batch; hits and misses count requests admitted and "
                              f"tasks read. Times are CPU seconds of the process (one torch thread; "
                              f"reads of the task files, from the page cache, included): wall times on "
                              f"this shared machine varied 2x between identical runs.\n\n{cache}")
    print(*parts.values(), sep="\n\n")
    if not args.no_write:
        from benchdoc import write_section  # scripts/ is this script's import path
        command = "python scripts/bench_adapters.py" + (f" --part {args.part}" if args.part != "all" else "")
        for part, text in parts.items():
            write_section(f"bench_adapters-{part}", text, heading=HEADING, command=command, load0=load0)


if __name__ == "__main__":
    main()
