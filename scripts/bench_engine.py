"""Worker engine benchmarks, all on this CPU, side by side in one run.

1. Orca's comparison: iteration-level vs request-level batching on a random LLaMA (hidden 512,
   8 layers), prompts ~U(32, 512), outputs ~U(1, 128), Poisson arrivals at increasing rates; throughput
   vs median latency normalised by output length; throughput ratio at equal latency.
2. Chunked prefill on/off: time between tokens of running decodes while 512-token prompts arrive.
3. Tokens/s against ``transformers`` ``generate`` on the same weights, 1 and 32 concurrent requests.
4. The roofline (``--roofline``): one layer's decode step of 32 sequences and a 512-token prompt
   step (``helix profile``'s measurement, the model's shapes) as a fraction of this CPU's float32
   GEMM peak measured in the same run (the fastest of ten 2048^3 products, by oneDNN and by MKL;
   both fractions are printed); each attention backend the CPU can run side by side.

Timing: the engine runs for real; a *virtual clock* advances by each step's measured CPU time (of this
process: with one torch thread, what an idle core would take; see ``cpu_clock``) and jumps
over idle gaps to the next arrival (an online server would sit idle there), so a sweep over arrival
rates costs only the compute it contains. Both sides of every comparison use the same engine kernels
and the same number of torch threads (1 by default: the machine is shared, and OpenMP spinning on
oversubscribed cores makes multi-threaded numbers meaningless).

    python scripts/bench_engine.py            # full: 32 requests x 6 rates; about 2.5x the quick run
    python scripts/bench_engine.py --quick    # 20 requests x 4 rates: 7.5 min at load 3-5 on 2 cores
    python scripts/bench_engine.py --only-orca --orca-requests 48 --orca-rates 0.8,1.2   # a slice
    python scripts/bench_engine.py --roofline --no-append                                 # 4. only

A run writes its block of BENCHMARKS.md (``bench_engine``; ``bench_engine-roofline`` for
``--roofline``) unless ``--no-append``; ``--only-orca`` only prints.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from helix.net.sampling import SamplingParams
from worker.engine import SliceEngine
from worker.engine_config import EngineConfig
from worker.local_pipeline import LocalPipeline, Prompt

VOCAB = 8192
HIDDEN_TO_INTER = 11   # intermediate = hidden * 11 / 4, as build_model


def cpu_clock() -> float:
    """CPU seconds of this process. With one torch thread (the default) this is the time an idle
    core would take; unlike wall time it does not grow when other work shares the cores (memory
    bandwidth and caches are still shared, so some noise remains)."""
    return time.process_time()


def build_model(path: Path, hidden: int, layers: int):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=hidden * 11 // 4,
                      num_hidden_layers=layers, num_attention_heads=hidden // 64,
                      num_key_value_heads=hidden // 128, max_position_embeddings=2048,
                      rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(cfg).eval()
    model.save_pretrained(path)
    return model


@dataclass(frozen=True)
class Req:
    request_id: int
    arrival_s: float
    prompt: tuple[int, ...]
    output_len: int


def workload(n: int, rate_per_s: float, seed: int, prompt_range=(32, 512), out_range=(1, 128)):
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate_per_s, n) if rate_per_s > 0 else np.zeros(n)
    arrivals = np.cumsum(gaps) - gaps[0]
    return [Req(i, float(arrivals[i]),
                tuple(int(t) for t in rng.integers(3, VOCAB, int(rng.integers(*prompt_range, endpoint=True)))),
                int(rng.integers(*out_range, endpoint=True))) for i in range(n)]


def _prompt(r: Req, max_tokens: int | None = None) -> Prompt:
    return Prompt(r.request_id, r.prompt,
                  SamplingParams(temperature=0, max_tokens=max_tokens or r.output_len, ignore_eos=True))


# --- online serving on a virtual clock ---------------------------------------------------------
def serve_iteration_level(ckpt: Path, reqs: list[Req], config: EngineConfig) -> dict[int, tuple]:
    """Every step admits whatever arrived; returns id -> (arrival, finish, token times)."""
    pipe = LocalPipeline([SliceEngine.from_checkpoint(ckpt, 0, _layers(ckpt), config)])
    clock, pending, done, token_times = 0.0, list(reqs), {}, {r.request_id: [] for r in reqs}
    while pending or pipe.busy():
        while pending and pending[0].arrival_s <= clock:
            pipe.submit(_prompt(pending.pop(0)))
        if not pipe.busy():
            clock = pending[0].arrival_s
            continue
        t0 = cpu_clock()
        outs = pipe.step()
        clock += cpu_clock() - t0
        for o in outs:
            token_times[o.request_id].append(clock)
            if o.finish_reason is not None:
                done[o.request_id] = clock
    return {r.request_id: (r.arrival_s, done[r.request_id], token_times[r.request_id]) for r in reqs}


def serve_request_level(ckpt: Path, reqs: list[Req], config: EngineConfig,
                        pad: bool = False) -> dict[int, tuple]:
    """FasterTransformer-style: a batch runs until its longest request ends; results return then;
    requests that arrive meanwhile wait for the next batch. ``pad``: every prompt of a batch is
    left-padded to the batch's longest, as FasterTransformer (Orca's baseline) does; the pad tokens
    cost prefill and attention like real ones (outputs are not compared here, only time)."""
    pipe = LocalPipeline([SliceEngine.from_checkpoint(ckpt, 0, _layers(ckpt), config)])
    clock, pending, out = 0.0, list(reqs), {}
    while pending:
        clock = max(clock, pending[0].arrival_s)
        batch = [r for r in pending if r.arrival_s <= clock][:config.max_num_seqs]
        pending = [r for r in pending if r not in batch]
        longest = max(r.output_len for r in batch)
        width = max(len(r.prompt) for r in batch) if pad else 0
        padded = [Req(r.request_id, r.arrival_s, (0,) * (width - len(r.prompt)) + r.prompt,
                      r.output_len) if pad else r for r in batch]
        t0 = cpu_clock()
        pipe.run([_prompt(r, longest) for r in padded])
        clock += cpu_clock() - t0
        out.update({r.request_id: (r.arrival_s, clock, []) for r in batch})
    return out


def _layers(ckpt: Path) -> int:
    from helix.core.models import ModelSpec
    return ModelSpec.from_pretrained_dir(ckpt).num_layers


def summarize(reqs: list[Req], res: dict[int, tuple]) -> tuple[float, float]:
    """(throughput req/s, median latency per output token s)."""
    first = min(r.arrival_s for r in reqs)
    last = max(res[r.request_id][1] for r in reqs)
    norm = [(res[r.request_id][1] - r.arrival_s) / r.output_len for r in reqs]
    return len(reqs) / (last - first), statistics.median(norm)


def throughput_at_latency(points: list[tuple[float, float]], slo_s: float) -> float:
    """Largest throughput with median normalised latency <= slo_s, interpolating between measured
    rates (points sorted by offered rate); 0 if even the lightest load misses the SLO."""
    best = 0.0
    for (t0, l0), (t1, l1) in zip(points, points[1:]):
        if l0 <= slo_s:
            best = max(best, t0)
        if l0 <= slo_s < l1:
            best = max(best, t0 + (t1 - t0) * (slo_s - l0) / (l1 - l0))
    if points and points[-1][1] <= slo_s:
        best = max(best, points[-1][0])
    return best


def bench_orca(ckpt: Path, n: int, rate_factors: list[float], padded: bool, lines: list[str]) -> None:
    """Throughput and median normalised latency of both systems at each offered rate, then the
    throughput each sustains under a latency SLO. Rates are fractions of the iteration-level engine's
    offline capacity, so the sweep runs past the request-level saturation point (request-level
    batching saturates well below it) up to the iteration-level one; ``n`` requests per rate."""
    cfg_iter = EngineConfig(max_num_seqs=32, max_num_batched_tokens=512, chunked_prefill=True,
                            kv_budget_bytes=512 * 2**20)
    cfg_req = EngineConfig(max_num_seqs=32, max_num_batched_tokens=32 * 512, chunked_prefill=False,
                           kv_budget_bytes=512 * 2**20)
    # Capacity: all requests at once through the iteration-level engine (offline throughput).
    offline = workload(n, 0.0, seed=1)
    cap, _ = summarize(offline, serve_iteration_level(ckpt, offline, cfg_iter))
    systems = {"iteration-level": [], "request-level": []}
    if padded:
        systems["request-level, padded"] = []
    lines += [(f"Offline capacity of the iteration-level engine: {cap:.2f} req/s; {n} requests per "
               "rate."), "",
              "| offered rate (req/s) | " + " | ".join(f"{k}: throughput (req/s) | median latency (s/token)"
                                                   for k in systems) + " |",
              "|---|" + "---|---|" * len(systems)]
    for f in rate_factors:
        reqs = workload(n, cap * f, seed=2)
        runs = [serve_iteration_level(ckpt, reqs, cfg_iter), serve_request_level(ckpt, reqs, cfg_req)]
        if padded:
            runs.append(serve_request_level(ckpt, reqs, cfg_req, pad=True))
        row = f"| {cap * f:.2f} "
        for pts, res in zip(systems.values(), runs):
            pts.append(summarize(reqs, res))
            row += f"| {pts[-1][0]:.2f} | {pts[-1][1]:.4f} "
        lines.append(row + "|")
        print(lines[-1], flush=True)
    others = [k for k in systems if k != "iteration-level"]
    lines += ["", "| latency SLO (median s/token) | iteration-level req/s | "
              + " | ".join(f"{k} req/s (ratio)" for k in others) + " |", "|---|---|" + "---|" * len(others)]
    it_pts = systems["iteration-level"]
    lo = min(l for _, l in it_pts)
    for mult in (1.5, 2, 4, 8):
        slo = lo * mult
        a = throughput_at_latency(it_pts, slo)
        row = f"| {slo:.4f} ({mult:g}x the iteration-level lightest-load latency) | {a:.2f} "
        for name in others:
            b = throughput_at_latency(systems[name], slo)
            row += f"| {b:.2f} ({a / b:.1f}x) " if b > 0 else "| 0 (never meets it) "
        lines.append(row + "|")


# --- chunked prefill and time between tokens ----------------------------------------------------
def bench_chunked(ckpt: Path, num_long: int, lines: list[str]) -> None:
    rng = np.random.default_rng(3)
    running = [Req(i, 0.0, tuple(int(t) for t in rng.integers(3, VOCAB, 64)), 128) for i in range(8)]
    longs = [Req(100 + i, 0.2 + 0.4 * i, tuple(int(t) for t in rng.integers(3, VOCAB, 512)), 4)
             for i in range(num_long)]
    lines += [("| prefill | budget (tokens/step) | TBT p50 (ms) | TBT p99 (ms) | TBT max (ms) "
               "| long-prompt TTFT median (ms) |"), "|---|---|---|---|---|---|"]
    for chunked in (False, True):
        cfg = EngineConfig(max_num_seqs=32, max_num_batched_tokens=128 if chunked else 4096,
                           chunked_prefill=chunked)
        res = serve_iteration_level(ckpt, sorted(running + longs, key=lambda r: r.arrival_s), cfg)
        tbt = [b - a for r in running for a, b in zip(res[r.request_id][2], res[r.request_id][2][1:])]
        ttft = [res[r.request_id][2][0] - r.arrival_s for r in longs]
        p50, p99 = np.percentile(tbt, [50, 99]) * 1e3
        lines.append(f"| {'chunked' if chunked else 'whole prompts'} | {cfg.max_num_batched_tokens} "
                     f"| {p50:.1f} | {p99:.1f} | {max(tbt) * 1e3:.1f} | {statistics.median(ttft) * 1e3:.0f} |")
        print(lines[-1], flush=True)


# --- the roofline ----------------------------------------------------------------------------------
def gemm_peak_flops(n: int = 2048, reps: int = 10) -> dict[str, float]:
    """This process's float32 GEMM peaks: the fastest of ``reps`` n^3 products (CPU seconds) by MKL
    (``a @ b``) and by oneDNN (the kernel the engine's linear layers use), each."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    products = {"MKL": lambda: a @ b}
    if torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        b_onednn = b.t().contiguous().to_mkldnn()
        products["oneDNN"] = lambda: torch.ops.mkldnn._linear_pointwise(a, b_onednn, None, "none", [], "")
    peaks = {}
    for name, product in products.items():
        product()
        best = float("inf")
        for _ in range(reps):
            t0 = cpu_clock()
            product()
            best = min(best, cpu_clock() - t0)
        peaks[name] = 2 * n ** 3 / best
    return peaks


def layer_flops(spec, tokens: int, mean_context: float) -> float:
    """One layer's floating-point work: the four GEMMs over ``tokens`` rows and attention over
    ``mean_context`` keys per row (QK^T and PV)."""
    h, d, inter = spec.hidden_size, spec.head_dim, spec.intermediate_size
    heads, kv = spec.num_heads, spec.num_kv_heads
    gemm = 2 * tokens * (h * (heads + 2 * kv) * d + heads * d * h + 3 * h * inter)
    return gemm + 4 * tokens * mean_context * heads * d


def bench_roofline(lines: list[str], backends: list[str], reps: int = 5) -> None:
    from helix.core.models import ModelSpec
    from worker.profile import ProfileGrid, measure
    spec = ModelSpec(name="bench-engine", num_layers=8, hidden_size=512, num_heads=8, num_kv_heads=4,
                     intermediate_size=512 * HIDDEN_TO_INTER // 4, vocab_size=VOCAB,
                     max_position_embeddings=2048, rms_norm_eps=1e-5)
    grid = ProfileGrid((512,), 512, (128, 512), (32,), reps=reps, layers=4)
    peaks = gemm_peak_flops()
    peak = max(peaks.values())
    mkl = peaks["MKL"]
    lines += ["This process's float32 GEMM peaks (fastest of ten 2048^3 products, one thread): "
              + ", ".join(f"{k} {v / 1e9:.1f} GFLOP/s" for k, v in peaks.items())
              + ". One layer of the model's shape; a decode point is 32 sequences at the KV context "
              "given; prompt: one 512-token prompt.", "",
              ("| attention backend | step | layer ms | GFLOP/s | fraction of the fastest GEMM peak "
               "| fraction of MKL's |"), "|---|---|---|---|---|---|"]
    for backend in backends:
        os.environ["HELIX_ATTENTION"] = backend
        try:
            res = measure(spec, grid, "cpu", "float32")
        finally:
            del os.environ["HELIX_ATTENTION"]
        for row in res.decode:
            flops = layer_flops(spec, row.batch, row.context)
            lines.append(f"| {backend} | decode, 32 seqs at context {row.context:g} | {row.seconds * 1e3:.3f} "
                         f"| {flops / row.seconds / 1e9:.1f} | {flops / row.seconds / peak:.1%} "
                         f"| {flops / row.seconds / mkl:.1%} |")
            print(lines[-1], flush=True)
        for row in res.prompt:
            flops = layer_flops(spec, row.batch, row.context / 2)
            lines.append(f"| {backend} | prompt, {row.batch:g} tokens | {row.seconds * 1e3:.3f} "
                         f"| {flops / row.seconds / 1e9:.1f} | {flops / row.seconds / peak:.1%} "
                         f"| {flops / row.seconds / mkl:.1%} |")
            print(lines[-1], flush=True)


# --- against transformers generate ---------------------------------------------------------------
def hf_generate_tokens_per_s(model, reqs: list[Req]) -> float:
    """One ``generate`` call over all requests (left-padded); useful tokens = each request's own length."""
    width = max(len(r.prompt) for r in reqs)
    ids = torch.zeros(len(reqs), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(reqs):
        ids[i, width - len(r.prompt):] = torch.tensor(r.prompt)
        mask[i, width - len(r.prompt):] = 1
    longest = max(r.output_len for r in reqs)
    t0 = cpu_clock()
    with torch.no_grad():
        model.generate(ids, attention_mask=mask, max_new_tokens=longest, min_new_tokens=longest,
                       do_sample=False, pad_token_id=0)
    return sum(r.output_len for r in reqs) / (cpu_clock() - t0)


def engine_tokens_per_s(ckpt: Path, reqs: list[Req]) -> float:
    pipe = LocalPipeline([SliceEngine.from_checkpoint(ckpt, 0, _layers(ckpt),
                                                      EngineConfig(max_num_batched_tokens=512))])
    t0 = cpu_clock()
    got = pipe.run([_prompt(r) for r in reqs])
    elapsed = cpu_clock() - t0
    assert all(len(got[r.request_id]) == r.output_len for r in reqs)
    return sum(r.output_len for r in reqs) / elapsed


def bench_vs_hf(ckpt: Path, model, quick: bool, lines: list[str]) -> None:
    rng = np.random.default_rng(4)
    one = [Req(0, 0.0, tuple(int(t) for t in rng.integers(3, VOCAB, 128)), 128)]
    mixed = workload(32, 0.0, seed=5, prompt_range=(16, 128), out_range=(1, 128))
    same = [Req(i, 0.0, tuple(int(t) for t in rng.integers(3, VOCAB, 64)), 64) for i in range(32)]
    orca = workload(32, 0.0, seed=6)
    cases = [("1 request, prompt 128, output 128", one),
             ("32 requests, prompts U(16,128), outputs U(1,128)", mixed),
             ("32 requests, prompts U(32,512), outputs U(1,128) (the Orca workload above)", orca)]
    if not quick:
        cases.append(("32 requests, all prompt 64, output 64 (no length variance)", same))
    lines += ["| case | transformers generate (tok/s) | helix engine (tok/s) | ratio |", "|---|---|---|---|"]
    for name, reqs in cases:
        hf = hf_generate_tokens_per_s(model, reqs)
        ours = engine_tokens_per_s(ckpt, reqs)
        lines.append(f"| {name} | {hf:.1f} | {ours:.1f} | {ours / hf:.2f}x |")
        print(lines[-1], flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sweep (about 4 CPU-minutes)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads for both sides (default 1)")
    ap.add_argument("--no-append", action="store_true", help="print only; do not touch BENCHMARKS.md")
    ap.add_argument("--orca-requests", type=int, help="requests per rate of the Orca sweep")
    ap.add_argument("--orca-rates", help="comma-separated rates of the Orca sweep, as fractions of "
                    "the iteration-level offline capacity")
    ap.add_argument("--only-orca", action="store_true", help="run only the Orca comparison")
    ap.add_argument("--roofline", action="store_true",
                    help="run only the roofline section (decode at 32 rows and a 512-token prompt "
                    "against the measured GEMM peak, per attention backend)")
    ap.add_argument("--no-padded", dest="padded", action="store_false",
                    help="leave out request-level batching with prompts padded to the batch's longest "
                    "(FasterTransformer, Orca's baseline; run by default)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    load0 = os.getloadavg()[0]
    cmd = " ".join(["python scripts/bench_engine.py", *sys.argv[1:]])
    lines = [(f"torch {torch.__version__}, {args.threads} torch thread(s), times are CPU seconds of the "
              "process. Model: random LLaMA, hidden 512, 8 layers, 8 heads / 4 KV heads, vocab 8192, "
              "float32.")]
    if args.roofline:
        from worker.attention import resolve_backend
        backends = ["gather"]
        if resolve_backend("auto", torch.device("cpu"), torch.float32) == "native":
            backends.insert(0, "native")
        bench_roofline(lines, backends)
        write(lines, "bench_engine-roofline", args.no_append, cmd, load0)
        return
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp)
        model = build_model(ckpt, 512, 8)
        lines += ["", "**Iteration-level vs request-level batching (Orca).** Prompts ~U(32, 512), outputs "
                  "~U(1, 128), Poisson arrivals; max 32 requests per batch for both; iteration-level = decode-first + chunked prefill (512-token budget); "
                  "request-level = a batch runs until its longest request ends (results return then), "
                  "same kernels, its best batch size (the largest: at low load a batch holds whatever "
                  "arrived, at high load more rows amortise the weights better)"
                  + ("; 'padded' also pads every prompt to the batch's longest, as FasterTransformer "
                     "(Orca's baseline) does" if args.padded else "") + "."]
        n, factors = (20, [0.15, 0.4, 0.7, 1.0]) if args.quick else (32, [0.1, 0.25, 0.4, 0.6, 0.8, 1.0])
        n = args.orca_requests or n
        factors = [float(f) for f in args.orca_rates.split(",")] if args.orca_rates else factors
        bench_orca(ckpt, n, factors, args.padded, lines)
        if args.only_orca:
            print("\n".join(lines))
            return
        lines += ["", ("**Chunked prefill**: time between tokens (TBT) of 8 running decodes while "
                   "512-token prompts arrive (one every 0.4 s):"), ""]
        bench_chunked(ckpt, 3 if args.quick else 5, lines)
        lines += ["", ("**Tokens/s against transformers `generate`** (same weights, greedy, "
                   "useful tokens only):"), ""]
        bench_vs_hf(ckpt, model, args.quick, lines)
    write(lines, "bench_engine", args.no_append, cmd, load0)


def write(lines: list[str], block: str, no_append: bool, cmd: str, load0: float) -> None:
    """Print the report and, unless ``no_append``, make it ``block`` of BENCHMARKS.md."""
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    if not no_append:
        from benchdoc import write_section  # scripts/ is this script's import path
        write_section(block, text, heading="## Worker engine (`scripts/bench_engine.py`)", command=cmd,
                      load0=load0)


if __name__ == "__main__":
    main()
