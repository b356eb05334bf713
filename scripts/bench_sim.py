"""Benchmarks of ``helix simulate``; writes its tables to its blocks of BENCHMARKS.md.

1. Speed (``--speed-only`` runs just this part, block ``bench_sim_speed``): simulated seconds per
   wall second and peak memory of single24 + LLaMA-2 70B offline (Helix placement + scheduler,
   ``--speed-duration``, target >= 100) and of hetero42 online at 0.75 load (``--online-duration``,
   target >= 50 within 300 MiB); and the wall time of ``helix simulate --compare``'s 15 runs on
   single24 offline (``--compare-duration``; plans made beforehand, not timed; target < 60 s).
2. Paper comparison on single24 and geo24, Azure conversation trace, offline and online (0.75 load):
   helix placement + helix scheduler vs swarm + swarm vs separate pipelines + random.
3. Chunked prefill on/off on geo24 (Helix placement + scheduler): p99 decode latency, throughput.

Usage: ``python scripts/bench_sim.py [--speed-only] [--speed-duration 120] [--online-duration 1800]
[--compare-duration 300] [--time-limit 60] [--no-append]``. Placements come from the planner
(``planner.plan``); nothing is hard-coded.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from helix.core.serving import CHECKED_STEP_BUDGETS
from helix.sim import run as simrun
from helix.sim.engine import SimConfig
from helix.core.spec import load_cluster

TRIO = (("milp", "helix"), ("swarm", "swarm"), ("separate", "random"))


def plans_for(cluster: str, time_limit_s: float, methods=("milp", "swarm", "separate")):
    spec = load_cluster(ROOT / "cluster_specs" / f"{cluster}.yaml")
    return spec, {m: simrun.make_plan(spec, m, time_limit_s) for m in methods}


def _speed_row(label: str, spec, plan, mode: str, duration_s: float,
               heap: bool) -> tuple[str, float]:
    """One timed run and, with ``heap``, its Python-heap peak in a second identical run under
    tracemalloc (two to three times slower)."""
    opts = simrun.WorkloadOptions(load=0.75)
    workload = simrun.make_workload(opts, mode, plan, window_s=duration_s)
    cfg = SimConfig(mode=mode, duration_s=duration_s)
    r = simrun.simulate(spec, plan, workload, cfg, "helix")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    heap_peak_mb = float("nan")
    if heap:
        tracemalloc.start()
        simrun.simulate(spec, plan, workload, cfg, "helix")
        heap_peak_mb = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    print(f"speed {label}: {r.duration_s:.0f} sim s in {r.wall_s:.1f} s wall = "
          f"{r.sim_s_per_wall_s:.1f}x, {r.events} events, peak RSS {rss:.0f} MiB, "
          f"sim heap peak {heap_peak_mb:.1f} MiB", flush=True)
    return (f"| {label}, {plan.method} + helix | {r.duration_s:.0f} | {r.wall_s:.1f} | "
            f"**{r.sim_s_per_wall_s:.1f}** | {r.events} | {r.events / r.wall_s:,.0f} | "
            f"{r.decode_throughput_tokens_per_s:.1f} | {rss:.0f} MiB | "
            f"{'-' if not heap else f'{heap_peak_mb:.1f} MiB'} |"), r.wall_s


def speed(all_plans, duration_s: float, online_s: float) -> list[str]:
    """single24 offline and hetero42 online (0 s: skipped): simulated s per wall s, memory."""
    lines = [("| run | simulated s | wall s | sim s / wall s | events | events/s | decode tok/s | "
              "process peak RSS so far | simulation heap peak |"),
             "|---|---|---|---|---|---|---|---|---|"]
    spec, plans = all_plans["single24"]
    lines.append(_speed_row("single24 70B offline", spec, plans["milp"], "offline", duration_s,
                            heap=True)[0])
    if online_s > 0:
        spec, plans = all_plans["hetero42"]
        lines.append(_speed_row("hetero42 online 0.75 load", spec, plans["milp"], "online",
                                online_s, heap=False)[0])
    return lines


def compare_wall(plan_spec, duration_s: float) -> list[str]:
    """Wall time of ``helix simulate --compare``'s grid (every method x scheduler, offline) on
    plans made beforehand, in as many processes as the command uses by default, and one after
    another."""
    spec, plans = plan_spec
    jobs = simrun.default_jobs()
    walls = {}
    for n in sorted({jobs, 1}, reverse=True):
        t0 = time.perf_counter()
        rows = simrun.compare(spec, SimConfig(duration_s=duration_s), simrun.WorkloadOptions(),
                              plans=plans, jobs=n)
        walls[n] = time.perf_counter() - t0
        print(f"compare: {len(rows)} runs of {duration_s:g} sim s in {walls[n]:.1f} s wall "
              f"({n} process{'es' if n > 1 else ''})", flush=True)
    slowest = max(rows, key=lambda r: r.result.wall_s)
    one = f"; one after another {walls[1]:.1f} s" if jobs > 1 else ""
    return [f"- `--compare` on single24, offline, {duration_s:g} simulated s a run: {len(rows)} runs "
            f"in **{walls[jobs]:.1f} s** wall in {jobs} process{'es' if jobs > 1 else ''} (the "
            f"command's default `--jobs`){one} (slowest {slowest.method} + {slowest.scheduler}, "
            f"{slowest.result.wall_s:.1f} s); planning not counted."]


def _ms(x):
    return "-" if x is None else f"{x * 1e3:.0f}"


def row(cluster, mode, label, flow, r) -> str:
    return (f"| {cluster} | {mode} | {label} | {flow:.0f} | **{r.decode_throughput_tokens_per_s:.1f}** | "
            f"{r.requests_completed} | {_ms(r.ttft.p50_s)} / {_ms(r.ttft.p99_s)} | "
            f"{_ms(r.request_decode_latency.mean_s)} / {_ms(r.request_decode_latency.p99_s)} | "
            f"{_ms(r.inter_token_latency.p99_s)} | {r.preemptions} | {r.wall_s:.1f} |")


def paper_comparison(all_plans, duration_s: float) -> list[str]:
    """Offline, then online at 0.75 x the Helix plan's max flow (the paper's definition), then
    online at 0.75 x the Helix placement's *simulated* offline throughput (a load it can carry)."""
    lines = [("| cluster | mode | placement + scheduler | plan max flow tok/s | decode tok/s | "
             "completed | TTFT p50 / p99 ms | decode ms/token mean / p99 | ITL p99 ms | "
             "preemptions | wall s |"), "|---|---|---|---|---|---|---|---|---|---|---|"]
    ratios = []
    for cluster, (spec, plans) in all_plans.items():
        helix_offline = None
        for mode in ("offline", "online", "online-measured"):
            # Same requests for every row: the online rate comes from the Helix plan.
            opts = simrun.WorkloadOptions(load=0.75)
            if mode == "online-measured":
                mean_output = simrun.mean_lengths(simrun.make_workload(opts, "offline", plans["milp"]))[1]
                opts = dataclasses.replace(opts, rate_per_s=0.75 * helix_offline / mean_output)
            sim_mode = "offline" if mode == "offline" else "online"
            workload = simrun.make_workload(opts, sim_mode, plans["milp"], window_s=duration_s)
            got = {}
            for method, sched in TRIO:
                cfg = SimConfig(mode=sim_mode, duration_s=duration_s, label=f"{method}+{sched}")
                t0 = time.perf_counter()
                r = simrun.simulate(spec, plans[method], workload, cfg, sched)
                got[method] = r.decode_throughput_tokens_per_s
                print(f"{cluster} {mode} {method}+{sched}: {r.decode_throughput_tokens_per_s:.1f} "
                      f"tok/s ({time.perf_counter() - t0:.0f} s)", flush=True)
                label = mode if mode != "online-measured" else \
                    f"online {opts.rate_per_s:.2f} req/s"
                lines.append(row(cluster, label, f"{method} + {sched}",
                                 plans[method].max_flow_tokens_per_s, r))
            if mode == "offline":
                helix_offline = got["milp"]
            ratios.append(f"{cluster} {mode}: Helix/Swarm = {_ratio(got['milp'], got['swarm'])}, "
                          f"Helix/(separate+random) = {_ratio(got['milp'], got['separate'])}")
    return lines + [""] + [f"- {x}" for x in ratios]


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b > 0 else "inf (baseline produced no token)"


def chunking(plan_spec, duration_s: float) -> list[str]:
    spec, plans = plan_spec
    workload = simrun.make_workload(simrun.WorkloadOptions(), "offline", plans["milp"])
    lines = [("| geo24 offline, milp + helix | decode tok/s | TTFT p50 / p99 ms | "
              "decode ms/token mean / p99 | ITL p50 / p99 ms | preemptions |"),
             "|---|---|---|---|---|---|"]
    for chunk in (0, *CHECKED_STEP_BUDGETS):   # off, and the budgets the prediction is checked at
        r = simrun.simulate(spec, plans["milp"], workload,
                            SimConfig(duration_s=duration_s, chunk_tokens=chunk), "helix")
        print(f"geo24 chunk {chunk}: {r.decode_throughput_tokens_per_s:.1f} tok/s, ITL p99 "
              f"{r.inter_token_latency.p99_s}", flush=True)
        lines.append(f"| --chunk-tokens {chunk}{' (off)' if chunk == 0 else ''} | "
                     f"{r.decode_throughput_tokens_per_s:.1f} | {_ms(r.ttft.p50_s)} / {_ms(r.ttft.p99_s)} | "
                     f"{_ms(r.request_decode_latency.mean_s)} / {_ms(r.request_decode_latency.p99_s)} | "
                     f"{_ms(r.inter_token_latency.p50_s)} / {_ms(r.inter_token_latency.p99_s)} | "
                     f"{r.preemptions} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--speed-only", action="store_true",
                    help="only the speed part (block bench_sim_speed)")
    ap.add_argument("--speed-duration", type=float, default=120.0,
                    help="simulated s of the single24 offline speed run")
    ap.add_argument("--online-duration", type=float, default=1800.0,
                    help="simulated s of the hetero42 online speed run (0: skip it)")
    ap.add_argument("--compare-duration", type=float, default=300.0,
                    help="simulated s of each comparison / chunking run")
    ap.add_argument("--time-limit", type=float, default=60.0, help="planner time limit (milp)")
    ap.add_argument("--no-append", action="store_true", help="print only, leave BENCHMARKS.md")
    args = ap.parse_args()
    load0 = os.getloadavg()[0]
    cmd = (f"python scripts/bench_sim.py --speed-duration {args.speed_duration:g} "
           f"--online-duration {args.online_duration:g} --compare-duration "
           f"{args.compare_duration:g} --time-limit {args.time_limit:g}")
    single24 = plans_for("single24", args.time_limit, simrun.COMPARE_METHODS)
    all_plans = {"single24": single24}
    if args.online_duration > 0:
        all_plans["hetero42"] = plans_for("hetero42", args.time_limit, ("milp",))
    out = ["Speed (targets: single24 offline >= 100 simulated s per wall s; hetero42 online >= 50 "
           "within 300 MiB; `--compare` < 60 s):", ""]
    out += speed(all_plans, args.speed_duration, args.online_duration)
    out += [""] + compare_wall(single24, args.compare_duration)
    if args.speed_only:
        text = "\n".join(out)
        print(text)
        if not args.no_append:
            from benchdoc import write_section  # scripts/ is this script's import path
            write_section("bench_sim_speed", text, heading="## Simulator (`scripts/bench_sim.py`)",
                          command=cmd + " --speed-only", load0=load0)
        return
    all_plans["geo24"] = plans_for("geo24", args.time_limit)
    out += ["", (f"Paper comparison ({args.compare_duration:g} simulated s per run; online = "
            "0.75 x Helix plan's max flow in requests/s; online N req/s = 0.75 x the Helix "
            "placement's simulated offline decode throughput / mean output):"), ""]
    out += paper_comparison({c: all_plans[c] for c in ("single24", "geo24")}, args.compare_duration)
    out += ["", f"Chunked prefill on geo24 ({args.compare_duration:g} simulated s, offline):", ""]
    out += chunking(all_plans["geo24"], args.compare_duration)
    text = "\n".join(out)
    print(text)
    if not args.no_append:
        from benchdoc import write_section  # scripts/ is this script's import path
        write_section("bench_sim", text, heading="## Simulator (`scripts/bench_sim.py`)", command=cmd,
                      load0=load0)


if __name__ == "__main__":
    main()
