#!/usr/bin/env python
"""The worker engine on a GPU, in one command: what the planner assumes against what it delivers.

    python scripts/bench_engine_gpu.py [--out DIR] [--no-append] [--skip-profile]
    python scripts/bench_engine_gpu.py --smoke --device cpu --no-append   # the logic, on a CPU, in seconds

Sections (each prints its table as it finishes; a failing section is reported and the rest run):

1. **Roofline inputs, measured here**: the fp16 GEMM peak (an 8192^3 product) and the
   device-to-device copy bandwidth (bytes read + written).
2. **Graphs are exact**: a batch of requests through the engine with decode graphs captured and
   with them off gives the same tokens (same kernels, replayed).
3. **Against transformers `generate`** on a random LLaMA of TinyLlama-1.1B's shape (hidden 2048,
   22 layers, 32/4 heads, float16), the same weights: 1 request (prompt 128, 128 new tokens);
   32 requests (prompts U(16, 512), outputs U(1, 256)); 256 requests (prompts U(16, 512),
   outputs U(16, 256)). Wall time, CUDA synchronised, useful tokens only (`generate` runs a
   left-padded batch to its longest output). Exactness in float16: every request's first token
   against `generate`'s, and the requests whose later tokens diverge, counted.
4. **Steady decode at 128 sequences** (prompts of 128 tokens): the median step against the
   bandwidth roofline (weights + the KV read once, at the measured copy bandwidth).
5. **Kernels per decode step** from `torch.profiler` (batch 1 and 128): GPU kernels executed and
   host launch calls (kernel launches + graph launches).
6. **`helix profile llama-2-7b`** (float16, 4 layers) per layer against the cost model of the
   device found (:mod:`profile_vs_roofline`).

Results: ``results.md`` (the whole report) and ``results.json`` in ``--out``, and a one-paragraph
summary in its block of BENCHMARKS.md unless ``--no-append``; a lent machine's BENCHMARKS.md does not
come back, so ``--render OUT/results.json`` writes that block here from the run's results. On a lent machine without pydantic, carry its wheels: ``scripts/gpu_wheels.sh`` here
fetches them into ``.whl/``; there, with ``.whl`` carried::

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 && \
    python3 scripts/bench_engine_gpu.py --out $OUT --no-append 2>&1 | tee $OUT/log
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from helix.net.sampling import SamplingParams
from worker.engine import SliceEngine
from worker.engine_config import EngineConfig
from worker.local_pipeline import LocalPipeline, Prompt


@dataclass(frozen=True)
class Shape:
    """The random model's shape."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int


TINYLLAMA = Shape(2048, 22, 32, 4, 5632, 32000)
SMOKE = Shape(128, 2, 4, 2, 256, 512)


@dataclass(frozen=True)
class Case:
    name: str
    prompts: list[tuple[int, ...]]
    outputs: list[int]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(device: torch.device, fn) -> tuple[float, object]:
    _sync(device)
    t0 = time.perf_counter()
    out = fn()
    _sync(device)
    return time.perf_counter() - t0, out


# --- 1. roofline inputs ---------------------------------------------------------------------------
def measure_roofline(device: torch.device, smoke: bool) -> dict:
    n = 512 if smoke else 8192
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    reps = 10
    t, _ = _timed(device, lambda: [a @ b for _ in range(reps)])
    flops = 2 * n ** 3 * reps / t
    numel = (64 if smoke else 1024) * 2 ** 20
    src = torch.empty(numel, device=device, dtype=torch.float32)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    t, _ = _timed(device, lambda: [dst.copy_(src) for _ in range(reps)])
    copy = 2 * src.numel() * 4 * reps / t
    del a, b, src, dst
    return {"gemm_flops": flops, "gemm_n": n, "copy_bytes_per_s": copy}


# --- the model and the workloads ----------------------------------------------------------------
def build_checkpoint(folder: Path, shape: Shape, device: torch.device, dtype: torch.dtype):
    """A random LLaMA of ``shape`` saved to ``folder`` (as a checkpoint users have) and the same
    model in ``transformers`` on ``device``."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                      num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                      num_key_value_heads=shape.kv_heads, max_position_embeddings=2048,
                      rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(dtype).eval()
    # Random init at std 0.02 gives nearly flat logits; scale so greedy choices are separated.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
    model.save_pretrained(folder)
    return model


def cases(shape: Shape, smoke: bool) -> list[Case]:
    rng = np.random.default_rng(7)

    def prompts(n: int, lo: int, hi: int) -> list[tuple[int, ...]]:
        return [tuple(int(t) for t in rng.integers(3, shape.vocab, int(rng.integers(lo, hi, endpoint=True))))
                for _ in range(n)]
    if smoke:
        return [Case("1 req, prompt 16, out 8", prompts(1, 16, 16), [8]),
                Case("4 req, prompt U(4,32), out U(1,8)", prompts(4, 4, 32),
                     [int(x) for x in rng.integers(1, 8, 4, endpoint=True)])]
    return [Case("1 req, prompt 128, out 128", prompts(1, 128, 128), [128]),
            Case("32 req, prompt U(16,512), out U(1,256)", prompts(32, 16, 512),
                 [int(x) for x in rng.integers(1, 256, 32, endpoint=True)]),
            Case("256 req, prompt U(16,512), out U(16,256)", prompts(256, 16, 512),
                 [int(x) for x in rng.integers(16, 256, 256, endpoint=True)])]


def engine_config(device: torch.device, dtype: str, graphs: str = "auto") -> EngineConfig:
    return EngineConfig(device=str(device), dtype=dtype, max_num_seqs=256, max_num_batched_tokens=4096,
                        kv_budget_bytes=(8 if device.type == "cuda" else 1) * 2 ** 30,
                        decode_graphs=graphs)


def run_engine(ckpt: Path, shape: Shape, case: Case, config: EngineConfig
               ) -> tuple[float, dict, SliceEngine]:
    engine = SliceEngine.from_checkpoint(ckpt, 0, shape.layers, config)
    pipe = LocalPipeline([engine])
    warm = [Prompt("warm", case.prompts[0][:8], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))]
    pipe.run(warm)   # kernels compiled, first graphs captured
    reqs = [Prompt(i, p, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
            for i, (p, n) in enumerate(zip(case.prompts, case.outputs))]
    seconds, got = _timed(engine.device, lambda: pipe.run(reqs))
    _check_no_failures(engine)
    return seconds, got, engine


def _check_no_failures(engine: SliceEngine) -> None:
    failures = engine.take_failures()
    if engine.num_failed_steps or failures:
        raise RuntimeError(f"{engine.num_failed_steps} engine steps failed: {failures[:1]}")


def _until_plain_decodes(pipe: LocalPipeline, engine: SliceEngine, limit: int = 10_000) -> None:
    for _ in range(limit):
        pipe.step()
        _check_no_failures(engine)   # a failed step drops its requests: never loop on nothing
        plan = engine.last_plan
        if plan is not None and not plan.prefill_chunks and plan.decode_ids:
            return
    raise RuntimeError("no plain decode step reached")


def run_hf(model, case: Case, device: torch.device) -> tuple[float, list[list[int]]]:
    width = max(len(p) for p in case.prompts)
    ids = torch.zeros(len(case.prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(case.prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    ids, mask = ids.to(device), mask.to(device)
    longest = max(case.outputs)
    with torch.no_grad():
        model.generate(ids[:1, -8:], attention_mask=mask[:1, -8:], max_new_tokens=2, do_sample=False,
                       pad_token_id=0)   # warm-up
        seconds, out = _timed(device, lambda: model.generate(
            ids, attention_mask=mask, max_new_tokens=longest, min_new_tokens=longest, do_sample=False,
            pad_token_id=0))
    return seconds, [out[i, width:width + n].tolist() for i, n in enumerate(case.outputs)]


def agreement(ours: dict, theirs: list[list[int]]) -> dict:
    first = [ours[i][0] == t[0] for i, t in enumerate(theirs)]
    diverged = [i for i, t in enumerate(theirs) if ours[i] != t]
    prefix = [next((k for k, (a, b) in enumerate(zip(ours[i], t)) if a != b), len(t)) / len(t)
              for i, t in enumerate(theirs)]
    return {"first_token_equal": sum(first) / len(first), "first_token_mismatches": len(first) - sum(first),
            "requests_diverging_later": len(diverged), "mean_agreeing_prefix": statistics.mean(prefix)}


# --- 4. steady decode ----------------------------------------------------------------------------
def steady_decode(ckpt: Path, shape: Shape, config: EngineConfig, seqs: int, prompt: int, steps: int,
                  roof: dict, dtype_bytes: int) -> dict:
    engine = SliceEngine.from_checkpoint(ckpt, 0, shape.layers, config)
    rng = np.random.default_rng(11)
    # The prompts take several steps to prefill (seqs x prompt tokens at the step budget), and the
    # requests prefilled first decode in the later of them: each may lead by that many tokens, so
    # every request must outlast the measured steps by it (else the last steps hold fewer).
    prefill_steps = math.ceil(seqs * prompt / config.max_num_batched_tokens)
    reqs = [Prompt(i, tuple(int(t) for t in rng.integers(3, shape.vocab, prompt)),
                   SamplingParams(temperature=0, max_tokens=steps + 8 + prefill_steps, ignore_eos=True))
            for i in range(seqs)]
    pipe = LocalPipeline([engine])
    for r in reqs:
        pipe.submit(r)
    _until_plain_decodes(pipe, engine)   # until every prompt is in and steps are plain decodes
    for _ in range(4):
        pipe.step()
    times = []
    for _ in range(steps):
        t, _ = _timed(engine.device, pipe.step)
        assert len(engine.last_plan.decode_ids) == seqs
        times.append(t)
    step = statistics.median(times)
    weights = sum(t.numel() * t.element_size() for t in _weight_tensors(engine))
    context = prompt + 4 + steps / 2
    kv = seqs * context * shape.layers * 2 * shape.kv_heads * (shape.hidden // shape.heads) * dtype_bytes
    ideal = (weights + kv) / roof["copy_bytes_per_s"]
    return {"seqs": seqs, "median_step_s": step, "ideal_step_s": ideal, "fraction_of_roofline": ideal / step,
            "weight_bytes": weights, "kv_bytes": kv, "tok_s": seqs / step,
            "graph_replays": engine.graphs.replays if engine.graphs else 0}


def _weight_tensors(engine: SliceEngine):
    w = engine.weights
    for layer in w.layers:
        yield from (layer.qkv, layer.o, layer.gate_up, layer.down, layer.input_norm, layer.post_norm)
    # The embedding table is not read whole by a step (only its rows for the step's tokens).
    yield from (t for t in (w.final_norm, w.lm_head) if t is not None)


# --- 5. kernels per step ---------------------------------------------------------------------------
def kernels_per_step(ckpt: Path, shape: Shape, config: EngineConfig, seqs: int, steps: int = 10) -> dict:
    from torch.profiler import ProfilerActivity, profile
    engine = SliceEngine.from_checkpoint(ckpt, 0, shape.layers, config)
    pipe = LocalPipeline([engine])
    for i in range(seqs):
        pipe.submit(Prompt(i, tuple(range(3, 19)), SamplingParams(temperature=0, max_tokens=steps + 16,
                                                                     ignore_eos=True)))
    _until_plain_decodes(pipe, engine)
    for _ in range(3):
        pipe.step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if engine.device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            pipe.step()
        _sync(engine.device)
    launches = kernels = 0
    for e in prof.events():
        if e.name in ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC",
                      "cudaGraphLaunch"):
            launches += 1
        elif getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA and not e.name.startswith("Memcpy") \
                and not e.name.startswith("Memset"):
            kernels += 1
    return {"seqs": seqs, "gpu_kernels_per_step": kernels / steps, "host_launches_per_step": launches / steps,
            "gpu_kernels_per_layer": kernels / steps / shape.layers,
            "graph_replays": engine.graphs.replays if engine.graphs else 0}


# --- 6. helix profile vs the cost model -------------------------------------------------------------
def profile_vs_costmodel(out_dir: Path, device: torch.device, smoke: bool, timeout_s: float) -> dict:
    folder = out_dir / ("profile-smoke" if smoke else "profile-llama-2-7b")
    model = "tiny-llama" if smoke else "llama-2-7b"
    grid = (["--quick", "--threads", "1"] if smoke else
            ["--prompt-lengths", "128,512,2048", "--max-prompt-tokens", "8192", "--contexts", "256,1024,2048",
             "--seqs", "1,8,32,128,256", "--reps", "3", "--layers", "4"])
    dtype = "float16" if device.type == "cuda" else "float32"
    cmd = [sys.executable, "-c", "import sys; from helix.cli import main; sys.argv[0] = 'helix'; main()",
           "profile", model, "--device", device.type, "--dtype", dtype, "-o", str(folder), *grid]
    t0 = time.perf_counter()
    if device.type == "cuda":
        torch.cuda.empty_cache()   # the parent's cached blocks: the profile needs the memory
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=max(30.0, timeout_s))
    if proc.returncode != 0:
        raise RuntimeError(f"helix profile failed: {proc.stderr[-2000:]}")
    from profile_vs_roofline import (
        choose_roofline,
        compare,
        describe,
        phase_summaries,
        ratio_table,
        read_folder,
    )
    prof = read_folder(folder)
    roof = choose_roofline(prof)
    points = compare(prof, roof.kind)
    return {"seconds": time.perf_counter() - t0, "folder": str(folder), "describe": describe(prof, roof),
            "table": ratio_table(points), "summary": phase_summaries(points),
            "decode_ratios": [p.ratio for p in points if p.phase == "decode"],
            "prompt_ratios_2k_plus": [p.ratio for p in points if p.phase == "prompt" and p.batch >= 2048]}


# --- report ----------------------------------------------------------------------------------------
def _run_line(res: dict) -> str:
    """Where and how the run was made, from ``res`` (the machine that ran it, not this one)."""
    roof = res.get("roofline", {})
    return (f"`{res['command']}` at {res['started']} on {res['device']}, torch {res['torch']}, "
            f"{res['cpus']} CPU cores, load average {res['load0']:.1f} at the start; "
            f"measured fp16 GEMM peak {roof.get('gemm_flops', float('nan')) / 1e12:.0f} TFLOP/s "
            f"({roof.get('gemm_n')}^3), copy bandwidth {roof.get('copy_bytes_per_s', float('nan')) / 1e12:.2f} TB/s "
            "(read + written).")


def report(res: dict) -> str:
    """The whole report (results.md): every measurement against its target, and the profile."""
    lines = [f"### The engine on {res['device']} (`bench_engine_gpu.py`)", "", _run_line(res), "",
             "| measurement | result | target |", "|---|---|---|"]
    for row in res.get("vs_hf", []):
        a = row["agreement"]
        lines.append(f"| {row['case']}: engine vs transformers generate | {row['engine_tok_s']:.0f} vs "
                     f"{row['hf_tok_s']:.0f} tok/s = {row['ratio']:.2f}x; first token equal "
                     f"{a['first_token_equal']:.0%}, {a['requests_diverging_later']} of {row['requests']} "
                     f"diverge later | {'>= 250 tok/s' if row['requests'] == 1 else '>= 4x'} |")
    if "decode128" in res:
        d = res["decode128"]
        lines.append(f"| {d['seqs']} sequences decoding (prompts 128): one step | {d['median_step_s'] * 1e3:.2f} ms; "
                     f"roofline {d['ideal_step_s'] * 1e3:.2f} ms = {d['fraction_of_roofline']:.1%} | "
                     f"<= 2.4 ms (>= 25 %) |")
    for k in res.get("kernels", []):
        lines.append(f"| kernels per decode step, batch {k['seqs']} | {k['gpu_kernels_per_step']:.0f} GPU kernels "
                     f"({k['gpu_kernels_per_layer']:.1f} a layer), {k['host_launches_per_step']:.1f} host "
                     f"launches | one graph replay (or <= 12 kernels a layer) |")
    if "graphs_exact" in res:
        g = res["graphs_exact"]
        lines.append(f"| decode graphs vs eager, same requests | {'identical' if g['identical'] else 'DIFFERENT'} "
                     f"tokens ({g['replays']} replays) | identical |")
    if "profile" in res:
        p = res["profile"]
        dec, pre = p["decode_ratios"], p["prompt_ratios_2k_plus"]
        if dec:
            lines.append(f"| helix profile: decode layer time / cost model | {min(dec):.2f}-{max(dec):.2f}x | within 1.3x |")
        if pre:
            lines.append(f"| helix profile: prompt steps >= 2,048 tokens / cost model | {min(pre):.2f}-{max(pre):.2f}x "
                         f"| within 1.15x |")
    for name, err in res.get("errors", {}).items():
        lines.append(f"| {name} | FAILED: {err.splitlines()[-1][:200]} | |")
    if "profile" in res:
        lines += ["", res["profile"]["describe"], "", res["profile"]["table"], "", *res["profile"]["summary"]]
    return "\n".join(lines) + "\n"


def summary(res: dict) -> str:
    """BENCHMARKS.md's block, one paragraph (the file keeps to 500 lines; results.md has the
    whole report): the run, then each measurement with its target."""
    parts = []
    hf = res.get("vs_hf", [])
    if hf:
        parts.append("engine vs transformers `generate` at " + " / ".join(str(r["requests"]) for r in hf)
                     + " requests: " + " / ".join(f"{r['engine_tok_s']:,.0f} vs {r['hf_tok_s']:,.0f}" for r in hf)
                     + " tok/s = " + " / ".join(f"{r['ratio']:.2f}x" for r in hf)
                     + " (targets >= 250 tok/s alone, >= 4x batched); first token equal "
                     + " / ".join(f"{r['agreement']['first_token_equal']:.0%}" for r in hf))
    if "decode128" in res:
        d = res["decode128"]
        parts.append(f"{d['seqs']} sequences decoding: {d['median_step_s'] * 1e3:.2f} ms a step, roofline "
                     f"{d['ideal_step_s'] * 1e3:.2f} ms = {d['fraction_of_roofline']:.1%} (target >= 25 %)")
    if res.get("kernels"):
        parts.append("kernels per decode step at batch " + " / ".join(str(k["seqs"]) for k in res["kernels"])
                     + ": " + " / ".join(f"{k['gpu_kernels_per_step']:.0f} ({k['gpu_kernels_per_layer']:.1f} a "
                                         f"layer, {k['host_launches_per_step']:.0f} host launches)"
                                         for k in res["kernels"])
                     + " (target <= 12 a layer)")
    if "graphs_exact" in res:
        g = res["graphs_exact"]
        parts.append(f"decode graphs vs eager: {'identical' if g['identical'] else 'DIFFERENT'} tokens "
                     f"({g['replays']} replays)")
    if "profile" in res:
        dec, pre = res["profile"]["decode_ratios"], res["profile"]["prompt_ratios_2k_plus"]
        if dec and pre:
            parts.append(f"`helix profile llama-2-7b` / cost model: decode layers {min(dec):.2f}-{max(dec):.2f}x "
                         f"(target within 1.3x), prompt steps >= 2,048 tokens {min(pre):.2f}-{max(pre):.2f}x "
                         "(within 1.15x)")
    parts += [f"{name} FAILED: {err.splitlines()[-1][:200]}" for name, err in res.get("errors", {}).items()]
    text = "; ".join(parts)
    return _run_line(res) + " " + text[:1].upper() + text[1:] + "."


def write_block(res: dict, smoke: bool = False) -> None:
    """``summary(res)`` into BENCHMARKS.md (a smoke run's figures never replace a GPU's)."""
    from benchdoc import write_section  # scripts/ is this script's import path
    write_section("bench_engine_gpu" + ("-smoke" if smoke else ""), summary(res),
                  heading="## Worker engine on a GPU (`scripts/bench_engine_gpu.py`)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (with --smoke)")
    ap.add_argument("--smoke", action="store_true", help="a tiny model and workload: checks the script")
    ap.add_argument("--out", type=Path, default=None, help="folder for results.json and the profile")
    ap.add_argument("--skip-profile", action="store_true", help="leave out helix profile llama-2-7b")
    ap.add_argument("--no-append", action="store_true", help="print only; do not touch BENCHMARKS.md")
    ap.add_argument("--budget-s", type=float, default=540.0,
                    help="wall seconds for the whole run (the profile gets what is left; default 540)")
    ap.add_argument("--render", type=Path, default=None, metavar="RESULTS_JSON",
                    help="write the block of a run made elsewhere (a lent machine's results.json, "
                         "whose BENCHMARKS.md does not come back) and stop")
    args = ap.parse_args(argv)
    if args.render is not None:
        res = json.loads(args.render.read_text())
        print(summary(res))
        if not args.no_append:
            write_block(res)
        return 0
    started = time.perf_counter()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device here (use --smoke --device cpu to check the script)", file=sys.stderr)
        return 2
    if device.type == "cpu":
        torch.set_num_threads(1)   # a shared machine: one thread per side, as bench_engine.py
    out_dir = args.out or Path(tempfile.mkdtemp(prefix="bench-engine-gpu-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "CPU"
    shape = SMOKE if args.smoke else TINYLLAMA
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    dtype_name = "float16" if dtype == torch.float16 else "float32"
    res: dict = {"device": device_name, "torch": torch.__version__, "errors": {},
                 "started": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                 "command": " ".join(["python scripts/bench_engine_gpu.py", *(argv or sys.argv[1:])]),
                 "cpus": os.cpu_count(), "load0": os.getloadavg()[0]}

    def section(name, fn):
        t0 = time.perf_counter()
        try:
            res[name] = fn()
            print(f"[{name}] done in {time.perf_counter() - t0:.1f} s: {json.dumps(res[name], default=str)[:600]}",
                  flush=True)
        except Exception:
            res["errors"][name] = traceback.format_exc()
            print(f"[{name}] FAILED:\n{res['errors'][name]}", flush=True)
        (out_dir / "results.json").write_text(json.dumps(res, indent=1, default=str))

    section("roofline", lambda: measure_roofline(device, args.smoke))
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp)
        model = build_checkpoint(ckpt, shape, device, dtype)

        def graphs_exact():
            case = cases(shape, args.smoke)[1 if args.smoke else 1]
            on = "on" if device.type == "cuda" else "eager"
            _, a, engine = run_engine(ckpt, shape, case, engine_config(device, dtype_name, on))
            # Same padded shapes without capture: bit-exact if capture is right. Against "off" the
            # GEMMs run n rows instead of the bucket's (cuBLAS may pick another kernel): reported only.
            _, b, _ = run_engine(ckpt, shape, case, engine_config(device, dtype_name, "eager"))
            _, c, _ = run_engine(ckpt, shape, case, engine_config(device, dtype_name, "off"))
            return {"identical": a == b, "replays": engine.graphs.replays, "requests": len(case.prompts),
                    "differing": sum(a[k] != b[k] for k in a),
                    "differing_vs_off": sum(a[k] != c[k] for k in a)}
        section("graphs_exact", graphs_exact)

        def vs_hf():
            rows = []
            for case in cases(shape, args.smoke):
                e_s, ours, _ = run_engine(ckpt, shape, case, engine_config(device, dtype_name))
                h_s, theirs = run_hf(model, case, device)
                useful = sum(case.outputs)
                rows.append({"case": case.name, "requests": len(case.prompts), "engine_s": e_s, "hf_s": h_s,
                             "engine_tok_s": useful / e_s, "hf_tok_s": useful / h_s,
                             "ratio": h_s / e_s, "agreement": agreement(ours, theirs)})
                print(f"  {rows[-1]}", flush=True)
            return rows
        section("vs_hf", vs_hf)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
        dbytes = torch.empty((), dtype=dtype).element_size()
        section("decode128", lambda: steady_decode(
            ckpt, shape, engine_config(device, dtype_name), 8 if args.smoke else 128, 16 if args.smoke else 128,
            16 if args.smoke else 256, res.get("roofline", {"copy_bytes_per_s": float("nan")}), dbytes))
        section("kernels", lambda: [kernels_per_step(ckpt, shape, engine_config(device, dtype_name), s)
                                    for s in ((1, 4) if args.smoke else (1, 128))])
    if not args.skip_profile:
        left = args.budget_s - (time.perf_counter() - started) - 15
        section("profile", lambda: profile_vs_costmodel(out_dir, device, args.smoke, left))
    text = report(res)
    (out_dir / "results.md").write_text(text)
    print("\n" + text)
    if not args.no_append:
        write_block(res, args.smoke)
    return 1 if res["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
