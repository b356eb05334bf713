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

Beyond the four cases, ``--generated N`` runs the same protocol (offline; online too with
``--online``) on N synthetic clusters of ``scripts/gen_cluster.py`` (:data:`GENERATED_SHAPES`:
10-200 nodes, 1-5 regions, two models) and reports the distribution of the decode throughput error
(median and worst), in block ``bench_fidelity-generated``. Its cost grows with the clusters'
size: ``--generated 12 --duration 300 --time-limit 20`` takes ~14 minutes of one core (the
200-node cluster's simulation the most); the time limit bounds each plan, so under load the
planner may score fewer candidates and choose another plan. A large cluster's fill lasts longer
than 300 s; ``--min-stays K`` makes each offline run last at least K of its plan's predicted stays
(:func:`offline_duration_s`).

Usage: ``python scripts/bench_fidelity.py [--duration 600] [--time-limit 60] [--cases single24,...]
[--chunk-tokens N] [--generated N [--generated-seed S] [--min-stays K] [--online]] [--no-append]``. Prints a
table and writes it, with the command, machine and load, to its block of BENCHMARKS.md:
``bench_fidelity`` at the spec's step budget, ``bench_fidelity-chunkN`` with ``--chunk-tokens N``.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from helix.core.costmodel import CostModel
from helix.sim import run as simrun
from helix.sim.engine import SimConfig
from helix.sim.metrics import STEADY_FROM
from helix.sim.workload import load_azure_trace, resolve_trace
from helix.core.errors import HelixUserError
from helix.core.plan import Plan, Prediction
from helix.core.spec import ClusterSpec, WorkloadSpec, load_cluster, parse_cluster
from helix.sim.metrics import SimResult
from planner import PlanOptions
from planner import plan as plan_for_users
from planner.budget import at_budget
from planner.prediction import predict

sys.path.insert(0, str(ROOT / "scripts"))
from benchdoc import write_section
from gen_cluster import generate

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


@functools.lru_cache(maxsize=1)
def trace_requests() -> int:
    """Requests of the simulator's default trace as it filters them (offline draws as many)."""
    opts = simrun.WorkloadOptions()
    return len(load_azure_trace(resolve_trace(opts.trace), opts.max_prompt_tokens,
                                opts.max_output_tokens))


def offline_requests(plan, duration_s: float, available: int) -> int | None:
    """Requests an offline run of ``duration_s`` draws: None (``available``, the trace's number)
    unless the plan's prediction serves more than that in the run, then twice what it serves
    plus what it holds in flight."""
    pr = plan.prediction
    if pr is None:
        return None
    need = math.ceil(2 * (pr.requests_per_s * duration_s + pr.requests_in_flight))
    return need if need > available else None


def run_sim(spec, plan, mode: str, duration_s: float, scheduler: str = "helix",
            rate: float | None = None):
    """(SimResult, the simulator, the requests admitted). Offline: the stationary mix, what
    ``helix simulate`` replays by default, as many requests as the trace holds or, where the plan
    is predicted to serve more in the run (a 200-node plan serves the conversation trace's 16,663
    in ~12 minutes), more (:func:`offline_requests`; lengths are drawn with replacement)."""
    opts = simrun.WorkloadOptions(
        num_requests=offline_requests(plan, duration_s, trace_requests())) \
        if mode == "offline" else simrun.WorkloadOptions(poisson=True, rate_per_s=rate)
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


@dataclass(frozen=True)
class Measured:
    """One cluster planned as ``helix plan`` does and simulated with the protocol above."""
    spec: ClusterSpec
    plan: Plan
    plan_s: float
    """Wall seconds ``planner.plan`` took."""
    steady: float
    """Offline decode tokens/s after the fill (:func:`steady_of`)."""
    whole: float
    """Offline decode tokens/s over the whole run."""
    sim_total: float
    """Offline prompt + decode tokens/s: ``steady`` x (p + o) / o of the requests served."""
    served: Prediction
    """The prediction for the lengths of the requests the offline run served."""
    online: SimResult | None
    """The online run at ``rate``; None when skipped."""
    rate: float
    """Online request rate: the prediction's online load x its predicted request rate."""

    @property
    def decode_error(self) -> float:
        """(predicted - simulated) / simulated decode tokens/s after the fill."""
        return (self.plan.prediction.decode_tokens_per_s - self.steady) / self.steady


def offline_duration_s(duration_s: float, plan, min_stays: float) -> float:
    """The offline run's length: ``duration_s``, or ``min_stays`` of the plan's predicted stays
    (requests in flight / requests per s, Little's law) where that is longer. The fill admits
    every request the KV holds at once, and its after-effect (the requests finishing together,
    the next ones admitted together) lasts about two stays; the steady window is the run's
    second half, so four stays put it after them. A 150-node, 4-region plan (a stay of ~170 s)
    still rises from 3,460 to 3,830 decode tokens/s between 150 and 300 s, and holds ~3,930 from
    300 to 900 s."""
    pr = plan.prediction
    if min_stays <= 0 or pr is None or pr.requests_per_s <= 0:
        return duration_s
    return max(duration_s, math.ceil(min_stays * pr.requests_in_flight / pr.requests_per_s))


def measure(spec: ClusterSpec, duration_s: float, time_limit_s: float,
            online: bool = True, min_stays: float = 0.0) -> Measured:
    """Plan ``spec`` (one solver thread) and simulate the plan offline (for at least
    ``min_stays`` predicted stays: :func:`offline_duration_s`) and, with ``online``, at the
    prediction's online load."""
    t0 = time.perf_counter()
    plan = plan_for_users(spec, PlanOptions(time_limit_s=time_limit_s, threads=1))
    plan_s = time.perf_counter() - t0
    pr = plan.prediction
    offline_s = offline_duration_s(duration_s, plan, min_stays)
    if offline_s > duration_s:
        print(f"  offline run of {offline_s:g} s ({min_stays:g} predicted stays)", file=sys.stderr,
              flush=True)
    off, _, served = run_sim(spec, plan, "offline", offline_s)
    steady = steady_of(off)
    # Prompt + decode tokens/s of the run: its decode rate x (p + o) / o of the requests it served
    # (the prompts admitted at t = 0 to fill the KV would otherwise count as a burst).
    p = sum(r.prompt_tokens for r in served)
    o = sum(r.output_tokens for r in served)
    win, _ = predict(spec, plan, window_cost(spec, served))
    rate = pr.online_load * pr.requests_per_s
    on = run_sim(spec, plan, "online", duration_s, rate=rate)[0] if online else None
    return Measured(spec, plan, plan_s, steady, off.decode_throughput_tokens_per_s,
                    steady * (p + o) / o, win, on, rate)


def fidelity(name: str, duration_s: float, time_limit_s: float,
             chunk_tokens: int | None = None) -> tuple[list[str], Measured]:
    cluster, model = CASES[name]
    spec = spec_of(cluster, model)
    if chunk_tokens is not None:
        spec = at_budget(spec, chunk_tokens)
    m = measure(spec, duration_s, time_limit_s)
    pr, win, on, steady, sim_total = m.plan.prediction, m.served, m.online, m.steady, m.sim_total
    row = (f"| {name} | {m.plan.max_flow_tokens_per_s:,.0f} | {m.plan_s:.0f} s | "
           f"{pr.prompt_decode_tokens_per_s:,.0f} / {sim_total:,.0f} ({_err(pr.prompt_decode_tokens_per_s, sim_total)}) | "
           f"{pr.decode_tokens_per_s:,.1f} / {steady:,.1f} "
           f"({_err(pr.decode_tokens_per_s, steady)}) | "
           f"{m.whole:,.1f} ({_err(pr.decode_tokens_per_s, m.whole)}) | "
           f"{win.prompt_decode_tokens_per_s:,.0f} ({_err(win.prompt_decode_tokens_per_s, sim_total)}) / "
           f"{win.decode_tokens_per_s:,.1f} ({_err(win.decode_tokens_per_s, steady)}) | "
           f"{m.rate:.3f} | "
           f"{pr.ttft_p50_s:.2f} / {on.ttft.p50_s:.2f} ({_err(pr.ttft_p50_s, on.ttft.p50_s)}) | "
           f"{pr.tpot_p50_s:.3f} / {on.request_decode_latency.p50_s:.3f} "
           f"({_err(pr.tpot_p50_s, on.request_decode_latency.p50_s)}) | "
           f"{on.requests_completed}/{on.requests_arrived} |")
    return [row], m


#: Generated clusters' shapes, (nodes, regions, model): 10-200 nodes, 1-5 regions, LLaMA-2 70B
#: and LLaMA-1 30B (a smaller model with a profile and a 2,048-token context, so the trace's
#: lengths fit). ``--generated N`` takes the first N, case i with seed ``--generated-seed`` + i
#: (past the list, the shapes again with the next seeds), so another seed is a held-back set.
GENERATED_SHAPES: tuple[tuple[int, int, str], ...] = (
    (10, 1, "llama-1-30b"), (12, 1, "llama-2-70b"), (20, 2, "llama-2-70b"), (24, 2, "llama-1-30b"),
    (30, 3, "llama-2-70b"), (40, 1, "llama-2-70b"), (50, 4, "llama-1-30b"), (60, 3, "llama-2-70b"),
    (80, 5, "llama-2-70b"), (100, 2, "llama-1-30b"), (150, 4, "llama-2-70b"), (200, 5, "llama-2-70b"),
)


@dataclass(frozen=True)
class GeneratedCase:
    """One synthetic cluster of ``scripts/gen_cluster.py`` with its model."""
    nodes: int
    regions: int
    seed: int
    model: str

    @property
    def name(self) -> str:
        return f"{self.nodes}n-{self.regions}r-s{self.seed}-{self.model.rsplit('-', 1)[-1]}"

    def spec(self) -> ClusterSpec:
        return parse_cluster(generate(self.nodes, self.regions, self.seed, self.model),
                             source=f"generated cluster {self.name}")


def generated_cases(count: int, seed: int = 0) -> list[GeneratedCase]:
    """The first ``count`` cases of :data:`GENERATED_SHAPES`, case i with seed ``seed + i``."""
    return [GeneratedCase(*GENERATED_SHAPES[i % len(GENERATED_SHAPES)][:2], seed + i,
                          GENERATED_SHAPES[i % len(GENERATED_SHAPES)][2]) for i in range(count)]


def generated_row(case: GeneratedCase, m: Measured) -> str:
    """One generated cluster's row: shape, max flow, plan time, decode and prompt + decode tokens/s
    predicted / simulated (error), TTFT and TPOT p50 where the online run was done."""
    pr = m.plan.prediction
    online = "- | -" if m.online is None else (
        f"{pr.ttft_p50_s:.2f} / {m.online.ttft.p50_s:.2f} ({_err(pr.ttft_p50_s, m.online.ttft.p50_s)}) | "
        f"{pr.tpot_p50_s:.3f} / {m.online.request_decode_latency.p50_s:.3f} "
        f"({_err(pr.tpot_p50_s, m.online.request_decode_latency.p50_s)})")
    return (f"| {case.name} | {case.nodes} | {case.regions} | {case.model} | "
            f"{m.plan.max_flow_tokens_per_s:,.0f} | {m.plan_s:.0f} | "
            f"{pr.decode_tokens_per_s:,.1f} / {m.steady:,.1f} ({_err(pr.decode_tokens_per_s, m.steady)}) | "
            f"{pr.prompt_decode_tokens_per_s:,.0f} / {m.sim_total:,.0f} "
            f"({_err(pr.prompt_decode_tokens_per_s, m.sim_total)}) | {online} |")


#: The columns of :func:`generated_row`.
GENERATED_HEADER = ("cluster", "nodes", "regions", "model", "max flow", "plan s", "decode tok/s",
                    "prompt+decode tok/s", "TTFT p50 s", "TPOT p50 s")


def transposed(rows: list[str], fields: list[str]) -> list[str]:
    """``rows`` (of :data:`GENERATED_HEADER`) as a table with a column per cluster and a line per
    field of ``fields``."""
    cells = [[c.strip() for c in r.strip().strip("|").split("|")] for r in rows]
    at = [GENERATED_HEADER.index(f) for f in fields]
    return ["| | " + " | ".join(c[0] for c in cells) + " |", "|---" * (len(cells) + 1) + "|",
            *(f"| {f} | " + " | ".join(c[j] if j < len(c) else "" for c in cells) + " |"
              for f, j in zip(fields, at))]


def error_summary(errors: list[float]) -> str:
    """Median and worst absolute decode throughput error of ``errors`` (fractions), and how many
    are within the targets' 10 % / 20 %."""
    worst = max(errors, key=abs)
    median = statistics.median(abs(e) for e in errors)
    within = sum(abs(e) <= 0.10 for e in errors)
    return (f"{len(errors)} cluster{'' if len(errors) == 1 else 's'}: median |error| {median * 100:.1f} %, worst {worst * 100:+.1f} %; "
            f"{within} within 10 %, {sum(abs(e) <= 0.20 for e in errors)} within 20 % "
            f"(targets: median <= 10 %, worst <= 20 %).")


def generated_fidelity(cases: list[GeneratedCase], duration_s: float, time_limit_s: float,
                       online: bool = False, chunk_tokens: int | None = None,
                       min_stays: float = 0.0) -> tuple[list[str], str]:
    """Each case measured (:func:`measure`; at step budget ``chunk_tokens`` when given): its rows
    and the error summary over them. A case that cannot be planned or has no steady state gets
    a row saying so and no error."""
    rows, errors = [], []
    for case in cases:
        print(f"[{time.strftime('%H:%M:%S')}] {case.name}", file=sys.stderr, flush=True)
        try:
            spec = case.spec()
            if chunk_tokens is not None:
                spec = at_budget(spec, chunk_tokens)
            m = measure(spec, duration_s, time_limit_s, online=online, min_stays=min_stays)
        except (HelixUserError, ValueError) as exc:
            rows.append(f"| {case.name} | {case.nodes} | {case.regions} | {case.model} | "
                        f"not measured: {exc} ||||||")
            continue
        rows.append(generated_row(case, m))
        errors.append(m.decode_error)
        print(rows[-1], file=sys.stderr, flush=True)
    return rows, error_summary(errors) if errors else "no cluster measured."


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
    ap.add_argument("--generated", type=int, default=0, metavar="N",
                    help="instead of --cases: N generated clusters (GENERATED_SHAPES), offline")
    ap.add_argument("--generated-seed", type=int, default=0, metavar="S",
                    help="seed of the first generated cluster (the next get S+1, ...); default 0")
    ap.add_argument("--min-stays", type=float, default=0.0, metavar="K",
                    help="with --generated: offline runs of at least K predicted stays (requests in "
                         "flight / requests per s), so the steady window (the second half) starts "
                         "after the fill's after-effect; 0 (default): --duration only")
    ap.add_argument("--online", action="store_true",
                    help="with --generated: also the online run (TTFT/TPOT p50)")
    ap.add_argument("--no-append", action="store_true", help="print only, leave BENCHMARKS.md")
    args = ap.parse_args()
    load0 = os.getloadavg()[0]
    if args.generated > 0:
        main_generated(args, load0)
        return
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
            swarm_rows.append(versus_swarm(cluster, run.plan, run.spec, run.steady,
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


def main_generated(args: argparse.Namespace, load0: float) -> None:
    cases = generated_cases(args.generated, args.generated_seed)
    print("generated clusters (nodes, regions, seed, model): " +
          "; ".join(f"{c.nodes}, {c.regions}, {c.seed}, {c.model}" for c in cases), file=sys.stderr)
    rows, summary = generated_fidelity(cases, args.duration, args.time_limit, args.online,
                                       args.chunk_tokens, args.min_stays)
    command = (f"python scripts/bench_fidelity.py --generated {args.generated} --generated-seed "
               f"{args.generated_seed} --duration {args.duration:g} --time-limit {args.time_limit:g}"
               f"{f' --min-stays {args.min_stays:g}' if args.min_stays > 0 else ''}"
               f"{' --online' if args.online else ''}"
               f"{'' if args.chunk_tokens is None else f' --chunk-tokens {args.chunk_tokens}'}")
    intro = ("Generated clusters (`scripts/gen_cluster.py`; name: nodes, regions, seed, model), the "
             "protocol above: predicted / simulated (error); offline decode tokens/s after the fill"
             f"{f' (offline runs of at least {args.min_stays:g} predicted stays)' if args.min_stays > 0 else ''}"
             f"{'' if args.online else '; online not run'}. {summary}")
    header = "| " + " | ".join(GENERATED_HEADER) + " |"
    print("\n".join([intro, "", header, "|---" * len(GENERATED_HEADER) + "|", *rows]))
    # BENCHMARKS.md keeps to 500 lines: there, a column per cluster and the main figures.
    fields = ["decode tok/s", *(["TTFT p50 s", "TPOT p50 s"] if args.online else [])]
    text = "\n".join([intro, "", *transposed(rows, fields)])
    if not args.no_append:
        name = "bench_fidelity-generated" + (f"-seed{args.generated_seed}" if args.generated_seed else "") \
            + ("" if args.chunk_tokens is None else f"-chunk{args.chunk_tokens}")
        write_section(name, text, heading="## Plan vs simulator (`scripts/bench_fidelity.py`)",
                      command=command, load0=load0)


if __name__ == "__main__":
    main()
