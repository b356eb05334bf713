"""Plan vs simulator: does ``helix plan``'s prediction hold in ``helix simulate``?

For each case (LLaMA-2 70B on single24, geo24, hetero42; LLaMA-1 30B on single24):

1. plan it as ``helix plan`` does (``planner.plan``: the placement with the highest predicted
   throughput) and read its prediction;
2. offline simulation (saturated): prompt + decode and decode tokens/s against the prediction
   (target: within 15 %). The prediction is a steady state at the spec's mean lengths (the whole
   filtered trace's), so the run has one, as ``helix simulate --mode offline`` does by default:
   lengths drawn at random from the whole trace (:func:`helix.sim.workload.stationary_workload`;
   the trace in order drifts: its requests 1,000-3,000, which hetero42 serves in 600 s, have
   prompts of 900-960 tokens against the trace's 763), measured over the run's second half
   (``SimResult.steady_decode_throughput_tokens_per_s``: the first minutes are the fill, every
   request the KV holds admitted at t = 0 and prefilled together, ~120 s at half rate on
   hetero42). The whole run's figure is shown beside it;
3. online simulation at 75 % of the predicted request rate, Poisson arrivals with lengths drawn
   from the trace: TTFT and time per output token p50 against the prediction (target: within 25 %).

Then Helix placement + scheduler against Swarm placement + scheduler, offline, same workload (targets:
single24 >= 1.8x, geo24 >= 2.5x in decode tokens/s).

Usage: ``python scripts/bench_fidelity.py [--duration 600] [--time-limit 60] [--cases single24,...]
[--chunk-tokens N] [--no-append]``. Prints a table and writes it, with the command, machine and load, to
its block of BENCHMARKS.md: ``bench_fidelity`` at the spec's step budget, ``bench_fidelity-chunkN``
with ``--chunk-tokens N``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from helix.core.costmodel import CostModel
from helix.sim import run as simrun
from helix.sim.engine import SimConfig
from helix.sim.metrics import STEADY_FROM
from helix.core.spec import WorkloadSpec, load_cluster
from planner import PlanOptions
from planner import plan as plan_for_users
from planner.budget import at_budget
from planner.prediction import predict

sys.path.insert(0, str(ROOT / "scripts"))
from benchdoc import write_section

#: name -> (cluster spec, model, or None for the spec's own)
CASES = {"single24": ("single24", None), "geo24": ("geo24", None),
         "hetero42": ("hetero42", None), "single24-30b": ("single24", "llama-1-30b")}


def spec_of(cluster: str, model: str | None):
    """The example cluster's spec, with another catalog ``model`` when given (the simulator reads
    the spec's model, so the spec itself is rewritten)."""
    path = ROOT / "cluster_specs" / f"{cluster}.yaml"
    if model is None:
        return load_cluster(path)
    data = yaml.safe_load(path.read_text())
    data["model"] = model
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as fh:
        yaml.safe_dump(data, fh)
    try:
        return load_cluster(Path(fh.name))
    finally:
        os.unlink(fh.name)


def run_sim(spec, plan, mode: str, duration_s: float, scheduler: str = "helix",
            rate: float | None = None):
    """(SimResult, the simulator, the requests admitted). Offline: the stationary mix, what
    ``helix simulate`` replays by default."""
    opts = simrun.WorkloadOptions() if mode == "offline" else \
        simrun.WorkloadOptions(poisson=True, rate_per_s=rate)
    workload = simrun.make_workload(opts, mode, plan, 0, window_s=duration_s)
    sim = simrun.build_simulator(spec, plan, workload, SimConfig(mode=mode, duration_s=duration_s),
                                 scheduler)
    result = sim.run()
    return result, sim, workload[:result.requests_admitted]


def window_cost(spec, served) -> CostModel:
    """The spec's cost model for the lengths of the requests a run served (a few thousand drawn
    from the trace: their means differ from the spec's by the draw's noise)."""
    p = [r.prompt_tokens for r in served]
    o = [r.output_tokens for r in served]
    workload = WorkloadSpec(mean_prompt_tokens=sum(p) / len(p), mean_output_tokens=sum(o) / len(o),
                            resident_prompt_tokens=sum(a * b for a, b in zip(p, o)) / sum(o))
    cost = CostModel.for_cluster(spec)
    return CostModel(cost.model, cost.dtype_bytes, workload, cost.serving, cost.profiles,
                     cost.throughput_tables)


def _err(pred: float | None, got: float | None) -> str:
    if pred is None or got is None or got == 0:
        return "-"
    return f"{(pred - got) / got * 100:+.0f} %"


def fidelity(name: str, duration_s: float, time_limit_s: float,
             chunk_tokens: int | None = None) -> tuple[list[str], dict]:
    cluster, model = CASES[name]
    spec = spec_of(cluster, model)
    if chunk_tokens is not None:
        spec = at_budget(spec, chunk_tokens)
    t0 = time.perf_counter()
    plan = plan_for_users(spec, PlanOptions(time_limit_s=time_limit_s, threads=1))
    plan_s = time.perf_counter() - t0
    pr = plan.prediction
    off, _, served = run_sim(spec, plan, "offline", duration_s)
    steady = steady_of(off)
    # Prompt + decode tokens/s of the run: its decode rate x (p + o) / o of the requests it served
    # (the prompts admitted at t = 0 to fill the KV would otherwise count as a burst).
    p = sum(r.prompt_tokens for r in served)
    o = sum(r.output_tokens for r in served)
    sim_total = steady * (p + o) / o
    win, _ = predict(spec, plan, window_cost(spec, served))
    rate = pr.online_load * pr.requests_per_s
    on, _, _ = run_sim(spec, plan, "online", duration_s, rate=rate)
    row = (f"| {name} | {plan.max_flow_tokens_per_s:,.0f} | {plan_s:.0f} s | "
           f"{pr.prompt_decode_tokens_per_s:,.0f} / {sim_total:,.0f} ({_err(pr.prompt_decode_tokens_per_s, sim_total)}) | "
           f"{pr.decode_tokens_per_s:,.1f} / {steady:,.1f} "
           f"({_err(pr.decode_tokens_per_s, steady)}) | "
           f"{off.decode_throughput_tokens_per_s:,.1f} ({_err(pr.decode_tokens_per_s, off.decode_throughput_tokens_per_s)}) | "
           f"{win.prompt_decode_tokens_per_s:,.0f} ({_err(win.prompt_decode_tokens_per_s, sim_total)}) / "
           f"{win.decode_tokens_per_s:,.1f} ({_err(win.decode_tokens_per_s, steady)}) | "
           f"{rate:.3f} | "
           f"{pr.ttft_p50_s:.2f} / {on.ttft.p50_s:.2f} ({_err(pr.ttft_p50_s, on.ttft.p50_s)}) | "
           f"{pr.tpot_p50_s:.3f} / {on.request_decode_latency.p50_s:.3f} "
           f"({_err(pr.tpot_p50_s, on.request_decode_latency.p50_s)}) | "
           f"{on.requests_completed}/{on.requests_arrived} |")
    return [row], {"spec": spec, "plan": plan, "offline": steady}


def steady_of(result) -> float:
    """The offline run's decode tokens/s after the fill (:data:`STEADY_FROM` of the run on)."""
    steady = result.steady_decode_throughput_tokens_per_s
    if steady is None:
        raise ValueError(f"run {result.label!r} of {result.duration_s:g} s has no steady state "
                         "(too short, or it ran out of requests)")
    return steady


def versus_swarm(cluster: str, helix_plan, spec, helix_offline, duration_s: float,
                 time_limit_s: float) -> str:
    swarm_plan = plan_for_users(spec, PlanOptions(method="swarm", time_limit_s=time_limit_s))
    swarm, _, _ = run_sim(spec, swarm_plan, "offline", duration_s, scheduler="swarm")
    h, s = helix_offline, steady_of(swarm)
    return (f"| {cluster} | {h:,.1f} | {s:,.1f} | {h / s:.2f}x | "
            f"{helix_plan.prediction.decode_tokens_per_s:,.1f} | "
            f"{swarm_plan.prediction.decode_tokens_per_s:,.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=600.0, help="simulated s per run")
    ap.add_argument("--time-limit", type=float, default=60.0, help="planner time limit per case")
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES))
    ap.add_argument("--chunk-tokens", type=int, default=None,
                    help="step token budget (serving.chunk_tokens) for planning, prediction and "
                    "simulation; default: the spec's")
    ap.add_argument("--no-append", action="store_true", help="print only, leave BENCHMARKS.md")
    args = ap.parse_args()
    load0 = os.getloadavg()[0]
    cases = [c for c in args.cases.split(",") if c]
    rows, runs = [], {}
    for name in cases:
        print(f"[{time.strftime('%H:%M:%S')}] {name}", file=sys.stderr, flush=True)
        r, runs[name] = fidelity(name, args.duration, args.time_limit, args.chunk_tokens)
        rows += r
    swarm_rows = []
    for cluster in ("single24", "geo24"):
        if cluster in runs:
            print(f"[{time.strftime('%H:%M:%S')}] swarm on {cluster}", file=sys.stderr, flush=True)
            run = runs[cluster]
            swarm_rows.append(versus_swarm(cluster, run["plan"], run["spec"], run["offline"],
                                           args.duration, args.time_limit))
    command = (f"python scripts/bench_fidelity.py --duration {args.duration:g} --time-limit "
               f"{args.time_limit:g} --cases {','.join(cases)}"
               f"{'' if args.chunk_tokens is None else f' --chunk-tokens {args.chunk_tokens}'}")
    out = [("Each cell: predicted by `helix plan` / measured by `helix simulate` "
           "(error of the prediction). Offline: saturated, lengths drawn at random from the whole "
           f"trace, decode tokens/s from {STEADY_FROM:g} of the run's duration on (after the fill; the "
           "whole run's figure beside it; the model is also evaluated with the lengths of the "
           "requests the run served); online: Poisson at "
           "75 % of the predicted request rate, lengths from the trace. Targets: throughput "
           "within 15 %, TTFT/TPOT p50 within 25 %."), "",
           ("| case | max flow | plan time | prompt+decode tok/s | decode tok/s | decode, whole run | "
           "predicted for the served requests' lengths: prompt+decode / decode | online req/s | "
           "TTFT p50 s | TPOT p50 s | online done/arrived |"),
           "|---|---|---|---|---|---|---|---|---|---|---|", *rows]
    if swarm_rows:
        out += ["", ("Helix placement + scheduler vs Swarm placement + scheduler, offline, same "
                 "workload, decode tokens/s after the fill (targets: single24 >= 1.8x, geo24 >= 2.5x):"), "",
                ("| cluster | Helix decode tok/s | Swarm decode tok/s | ratio | Helix predicted | "
                 "Swarm predicted |"), "|---|---|---|---|---|---|", *swarm_rows]
    text = "\n".join(out)
    print(text)
    if not args.no_append:
        name = "bench_fidelity" if args.chunk_tokens is None else f"bench_fidelity-chunk{args.chunk_tokens}"
        write_section(name, text, heading="## Plan vs simulator (`scripts/bench_fidelity.py`)",
                      command=command, load0=load0)


if __name__ == "__main__":
    main()
