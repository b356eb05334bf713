#!/usr/bin/env python
"""Calibration of the analytic cost model against measured layer profiles, in and out of sample.

For every profile folder (LLaMA-1 30B, one layer, vLLM fp16 on real GPUs) the roofline predicts
each measured point; prints median and worst relative error per folder, prompt and decode apart,
with three sets of efficiency factors: the kind's catalog factors (in sample), factors fitted on
the other GPU kinds (leave one kind out) and the defaults a kind without a profile gets. Then what
the model predicts for one layer of a GQA model (LLaMA-2 70B) on an A100, decode and prompt,
beside the previous model (one roofline max over all the layer's work, KV read once per KV head).
Writes both tables to its block of BENCHMARKS.md (``bench_costmodel``).

With ``--profile DIR`` (a folder written by ``helix profile``) it compares that one profile
instead: every measured point beside the roofline's time for the same step on the profile's
device (:mod:`profile_vs_roofline`), and the ratio measured / model, summarised per phase, in a
block of its own (``bench_costmodel-profile``).

    python scripts/bench_costmodel.py [--profiles ../shared/data/profiles/llama1-30b] [--no-append]
    python scripts/bench_costmodel.py --profile DIR [--gpu KIND] [--tflops T]
        [--bandwidth-tbs B | --bandwidth-gbs B] [--no-append]
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from benchdoc import write_section
from profile_vs_roofline import (
    choose_roofline,
    compare,
    context_table,
    describe,
    phase_summaries,
    ratio_table,
    read_folder,
)

from helix.core.calibration import CalibrationRow, PhaseError, calibrate
from helix.core.costmodel import analytic_layer_time_s, layer_work, work_time_s
from helix.core.errors import HelixUserError, SpecError
from helix.core.hardware import GpuKind, lookup_gpu
from helix.core.models import MODEL_CATALOG, ModelSpec

HEADING = "## Cost model (`scripts/bench_costmodel.py`)"

#: Decode context the profiles are compared at (they have none): the best fit of the current
#: model over all folders (in sample); the previous model fitted best at 1,024.
DEFAULT_DECODE_CONTEXT = 832
PREVIOUS_DECODE_CONTEXT = 1024
#: The previous model's A100 factors (compute, memory), fitted with its own formula.
PREVIOUS_A100_FACTORS = (0.78, 0.90)
GQA_SEQS = (1, 50, 100, 200, 400)
GQA_PROMPTS = (250, 1000, 4000)


def previous_layer_time_s(model: ModelSpec, gpu: GpuKind, prompt_tokens: float,
                          decode_seqs: float, decode_context: float,
                          prompt_context: float) -> float:
    """The model before the GQA change (commit 325731a), one GPU: ONE roofline max over all the
    layer's work, decode attention reading each KV head's cache once, A100 factors 0.78 / 0.90."""
    compute_eff, memory_eff = PREVIOUS_A100_FACTORS
    tokens = prompt_tokens + decode_seqs
    kv = model.kv_bytes_per_token_per_layer(2)
    flops = tokens * model.linear_flops_per_token_per_layer + 4.0 * model.num_heads \
        * model.head_dim * (prompt_tokens * prompt_context + decode_seqs * decode_context)
    act_bytes = 2 * (4 * model.hidden_size + 3 * model.intermediate_size) * 2
    mem_bytes = model.layer_bytes(2) + kv * (decode_seqs * decode_context + prompt_tokens) \
        + act_bytes * tokens
    return max(flops / (gpu.fp16_flops * compute_eff),
               mem_bytes / (gpu.memory_bandwidth_bytes_per_s * memory_eff)) + gpu.layer_overhead_s


def pct(e: PhaseError) -> str:
    return f"{e.median:.1%} / {e.worst:.1%}"


def calibration_table(rows: list[CalibrationRow]) -> str:
    lines = [("| profile | GPU kind | GPUs | points (prompt + decode) | prompt, in sample | "
             "decode, in sample | factors w/o this kind (compute, memory) | "
             "prompt, leave kind out | decode, leave kind out | prompt, default factors | "
             "decode, default factors |"),
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.folder} | {r.gpu} | {r.num_gpus} | {r.prompt_points} + "
                     f"{r.decode_points} | {pct(r.prompt)} | {pct(r.decode)} | "
                     f"{r.loko_factors[0]:.2f}, {r.loko_factors[1]:.2f} | {pct(r.prompt_loko)} | "
                     f"{pct(r.decode_loko)} | {pct(r.prompt_default)} | {pct(r.decode_default)} |")
    return "\n".join(lines)


def gqa_table(decode_context: float) -> str:
    model, a100 = MODEL_CATALOG["llama-2-70b"], lookup_gpu("A100-40G")
    lines = [("| LLaMA-2 70B layer on A100-40G | previous model (ms) | this model (ms) | ratio | "
              "this model without GQA re-reads (ms) |"), "|---|---|---|---|---|"]
    for d in GQA_SEQS:
        old = previous_layer_time_s(model, a100, 0, d, PREVIOUS_DECODE_CONTEXT, 0)
        new = analytic_layer_time_s(model, a100, 1, 2, 0, d, decode_context, 0)
        once = work_time_s(layer_work(model, 2, 0, d, decode_context, 0, 0.0), a100, 1)
        lines.append(f"| decode, {d} sequence{'s' * (d > 1)} | {old * 1e3:.2f} | {new * 1e3:.2f} | "
                     f"{new / old:.2f}x | {once * 1e3:.2f} |")
    for p in GQA_PROMPTS:
        ctx = min(p, 763) / 2
        old = previous_layer_time_s(model, a100, p, 0, 0, ctx)
        new = analytic_layer_time_s(model, a100, 1, 2, p, 0, 0, ctx)
        lines.append(f"| prompt, {p} tokens | {old * 1e3:.2f} | {new * 1e3:.2f} | "
                     f"{new / old:.2f}x | {new * 1e3:.2f} |")
    return "\n".join(lines)


def profile_main(args: argparse.Namespace, command: str) -> int:
    """``--profile``: one folder's points against the roofline; written unless ``--no-append``."""
    load = os.getloadavg()[0]
    bandwidth = args.bandwidth_tbs * 1e12 if args.bandwidth_tbs is not None else \
        args.bandwidth_gbs * 1e9 if args.bandwidth_gbs is not None else None
    try:
        folder = read_folder(args.profile)
        roof = choose_roofline(folder, args.gpu, args.tflops, bandwidth)
        points = compare(folder, roof.kind)
    except (HelixUserError, SpecError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    header, table, summary = describe(folder, roof), ratio_table(points), phase_summaries(points)
    print(header, table, "\n".join(summary), sep="\n\n")
    if not args.no_append:
        m = folder.meta
        write_section("bench_costmodel-profile", f"{folder.model.name} {folder.dtype} on "
                      f"{m.get('device_name', m.get('device', '?'))} (the measurement is the profile's, "
                      f"this is arithmetic on it; every point is printed, the ratios in brief here). "
                      f"{header}\n\n{context_table(points)}\n\n"
                      + "".join(f"- {line}\n" for line in summary), heading=HEADING, command=command,
                      load0=load)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", type=Path,
                    default=ROOT.parent / "shared" / "data" / "profiles" / "llama1-30b")
    ap.add_argument("--decode-context", type=float, default=DEFAULT_DECODE_CONTEXT,
                    help="KV tokens each decode point attends over (the profiles do not say)")
    ap.add_argument("--no-append", action="store_true", help="print only")
    one = ap.add_argument_group("one profile folder (written by `helix profile`)")
    one.add_argument("--profile", type=Path, help="compare this folder's points with the roofline")
    one.add_argument("--gpu", help="catalog kind for the roofline (default: the profile's device)")
    one.add_argument("--tflops", type=float, help="peak dense TFLOP/s, replacing the kind's")
    bw = one.add_mutually_exclusive_group()
    bw.add_argument("--bandwidth-tbs", type=float,
                    help="memory bandwidth in TB/s, replacing the kind's")
    bw.add_argument("--bandwidth-gbs", type=float, help="memory bandwidth in GB/s (a CPU's, say)")
    args = ap.parse_args(argv)
    figures = (args.tflops, args.bandwidth_tbs, args.bandwidth_gbs)
    if any(v is not None and not v > 0 for v in figures):
        ap.error("--tflops and --bandwidth-* must be positive")
    if args.profile is None and (args.gpu is not None or any(v is not None for v in figures)):
        ap.error("--gpu, --tflops and --bandwidth-* go with --profile")
    if args.profile is not None:
        return profile_main(args, shlex.join(["python", "scripts/bench_costmodel.py", *argv]))
    load = os.getloadavg()[0]
    rows = calibrate(MODEL_CATALOG["llama-1-30b"], args.profiles, args.decode_context)
    table = calibration_table(rows)
    gqa = gqa_table(args.decode_context)
    print(table, gqa, sep="\n\n")
    if not args.no_append:
        write_section("bench_costmodel", f"Calibration against the LLaMA-1 30B layer profiles; decode "
                      f"points compared at a context of {args.decode_context:g} tokens. Each cell: median "
                      f"/ worst relative error.\n\n{table}\n\nOne layer of a grouped-query-attention "
                      f"model (64 query heads, 8 KV heads), decode at {args.decode_context:g} tokens of "
                      f"context (the previous model at its own best fit, {PREVIOUS_DECODE_CONTEXT}):\n\n"
                      f"{gqa}", heading=HEADING, command="python scripts/bench_costmodel.py", load0=load)
    return 0


if __name__ == "__main__":
    sys.exit(main())
