"""Planner benchmark: every method on the example clusters, and the reference case.

    python scripts/bench_planner.py [--time-limit 60] [--paper-time-limit 60] [--quick]
    python scripts/bench_planner.py --scale [--sizes 100 250 500 1000] (--time-limit 300, --gap 0.03)

Cases: the reference case (cluster_specs/reference/helix-single24-70b.yaml: the reference planner's
own throughput tables, 1 GB/s links), then single24 / geo24 / hetero42 with LLaMA-2 70B and
LLaMA-1 30B under our cost model, then the reference artifact's published cases
(../shared/data/reference_cases: 3cluster24, cluster42, cluster10, read as `helix convert
--throughput-tables` reads them; cluster42 also with --max-depth 12; 3cluster24 also under one
region label, its regions left to the links). Every method's max flow, proven bound, gap, depth and seconds go
to a table on stdout and into this script's section of BENCHMARKS.md (replaced on each run).
HiGHS runs with one thread so that runs on the shared 2-core machine stay comparable.

``--scale``: synthetic clusters from scripts/gen_cluster.py (N nodes in 5 regions, seed
0, LLaMA-2 70B), each size planned in a fresh process (so its peak RSS is its own) with the milp
method, a 300 s limit and a 3 % gap target unless given; the table goes to its own section of
BENCHMARKS.md, after the planner section.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from helix.core.models import resolve_model
from helix.core.spec import load_cluster
from planner import METHODS, solve
from planner.build import build_problem
from planner.reference import REFERENCE_MAX_FLOW

CASES = [("reference", "cluster_specs/reference/helix-single24-70b.yaml", None)] + [
    (name, f"cluster_specs/{name}.yaml", model)
    for name in ("single24", "geo24", "hetero42") for model in ("llama-2-70b", "llama-1-30b")] + [
    ("hetero210", "cluster_specs/hetero42.yaml", "x5")] + [
    (f"ref-{case}", case, "ini") for case in ("3cluster24", "cluster42", "cluster10")] + [
    ("ref-cluster42-depth12", "cluster42", "ini"), ("ref-3cluster24-links", "3cluster24", "links")]
REFERENCE_CASES = REPO.parent / "shared" / "data" / "reference_cases"
#: The reference artifact's published best max flow per case (README of reference_cases).
PUBLISHED = {"ref-3cluster24": 1212.18, "ref-cluster42": 4892.24, "ref-cluster10": 286.5874}


def reference_spec(case: str, one_region: bool = False):
    """A published case through ``helix convert --throughput-tables`` (the same function);
    ``one_region``: every node under one region label, the network in per-pair links only (the
    planner then finds the regions in the links, :mod:`planner.link_regions`)."""
    from helix.core.helix_ini import convert_ini, load_throughput_tables
    model = "llama-1-30b" if case == "cluster10" else "llama-2-70b"
    tables = load_throughput_tables(REFERENCE_CASES / "throughput_tables.yaml", case)
    paths = (REFERENCE_CASES / f"{case}.ini", REFERENCE_CASES / f"machine_profiles_{case}.ini")
    spec = convert_ini(*paths, model, throughput_tables=tables).spec
    if not one_region:
        return spec
    return convert_ini(*paths, model, regions={"cluster": [n.name for n in spec.nodes]},
                       throughput_tables=tables).spec


def reference_problem(case: str, one_region: bool = False):
    """The placement problem of :func:`reference_spec`."""
    return build_problem(reference_spec(case, one_region))


def replicate(problem, times: int):
    """hetero210: ``times`` copies of a cluster's nodes, every copy linked like the original."""
    import dataclasses

    from planner.problem import COORDINATOR, PlacementProblem
    nodes = tuple(dataclasses.replace(n, name=f"{n.name}-c{r}") for r in range(times)
                  for n in problem.nodes)
    links = {}
    for (a, b), link in problem.links.items():
        for r in range(times):
            if COORDINATOR in (a, b):
                links[(a if a == COORDINATOR else f"{a}-c{r}", b if b == COORDINATOR else f"{b}-c{r}")] = link
                continue
            for r2 in range(times):
                links[(f"{a}-c{r}", f"{b}-c{r2}")] = link
    any_link = next(link for (a, b), link in problem.links.items() if COORDINATOR not in (a, b))
    for n in problem.nodes:
        for r in range(times):
            for r2 in range(times):
                if r != r2:
                    links[(f"{n.name}-c{r}", f"{n.name}-c{r2}")] = any_link
    return PlacementProblem(problem.model, problem.num_layers, nodes, links, problem.spec_hash)


def run_case(name, path, model, args):
    depth = 12 if name.endswith("-depth12") else None
    if model == "x5":
        problem = replicate(build_problem(load_cluster(REPO / path)), 5)
        runs = [("milp", True), ("separate", True)]
    elif model == "links":   # one region label: the regions come from the links
        problem = reference_problem(path, one_region=True)
        runs = [("milp", True)]
    elif model == "ini":
        problem = reference_problem(path)
        runs = [("milp", True)] if depth else [(m, True) for m in METHODS]
    else:
        problem = build_problem(load_cluster(REPO / path), resolve_model(model) if model else None)
        runs = [(m, True) for m in METHODS] + ([("milp", False)] if name == "reference" else [])
    rows = []
    for method, warm in runs:
        limit = args.paper_time_limit if method == "milp-paper" else args.time_limit
        try:
            plan = solve(problem, method, time_limit_s=limit, threads=1, seed=0, gap=args.gap,
                         warm_starts=warm, max_depth=depth)
        except Exception as exc:  # an infeasible heuristic is a row, not a crash
            rows.append((name, problem.model, method if warm else "milp (no warm start)",
                         None, None, None, None, None, None, type(exc).__name__, "-", "-"))
            print(_fmt_row(rows[-1]), flush=True)
            continue
        label = method if warm else "milp (no warm start)"
        e = plan.extras
        rows.append((name, plan.model, label, plan.max_flow_tokens_per_s,
                     plan.upper_bound_tokens_per_s, plan.gap, e.get("depth_max"),
                     e.get("latency_mean_s", 0.0) * 1e3, plan.solve_seconds,
                     e.get("status", "heuristic"), e.get("bound_source", "-"),
                     e.get("found_by", "-")))
        print(_fmt_row(rows[-1]), flush=True)
    return rows


def _fmt_row(r) -> str:
    name, model, method, flow, bound, gap, depth, latency_ms, secs, status, source, found = r
    if flow is None:
        return f"| {name} | {model} | {method} | infeasible | - | - | - | - | - | {status} | - | - |"
    return (f"| {name} | {model} | {method} | {flow:,.1f} | {bound:,.1f} | {gap * 100:.2f} % | "
            f"{depth} | {latency_ms:,.0f} | {secs:.1f} | {status} | {source} | {found} |")


def acceptance(rows) -> list[str]:
    """The planner's targets per case, read from the rows of this run."""
    milp = {r[0]: r for r in rows if r[2] == "milp" and r[3] is not None}
    out = []

    def line(case, text, ok):
        out.append(f"- {case}: {text} ({'met' if ok else 'NOT met'})")

    for case, floor, max_gap in (("ref-3cluster24", 1576, 0.10), ("ref-cluster42", 5870, 0.10)):
        if case in milp:
            r = milp[case]
            line(case, f"{r[3]:,.1f} tokens/s = {r[3] / PUBLISHED[case]:.2f} x the best published "
                 f"{PUBLISHED[case]:,}, gap {r[5]:.1%}; target >= {floor} with gap <= {max_gap:.0%}",
                 r[3] >= floor and r[5] <= max_gap)
    if "ref-cluster10" in milp:
        r = milp["ref-cluster10"]
        line("ref-cluster10", f"{r[3]:,.2f} tokens/s, gap {r[5]:.2%} in {r[8]:.1f} s; target: the "
             "optimum proved (gap <= 1 %) within 10 s", r[5] <= 0.01 and r[8] <= 10)
    if "reference" in milp:
        r = milp["reference"]
        line("reference (single-region 24)", f"{r[3]:,.1f} tokens/s, gap {r[5]:.2%}",
             r[3] >= 2045 and r[5] <= 1e-6)
    for case in ("geo24", "hetero42"):
        for r in (r for r in rows if r[0] == case and r[2] == "milp" and r[3] is not None):
            line(f"{case} {r[1]}", f"gap {r[5]:.2%}; target <= 3 %", r[5] <= 0.03)
    if "ref-cluster42-depth12" in milp and "ref-cluster42" in milp:
        a, b = milp["ref-cluster42"], milp["ref-cluster42-depth12"]
        out.append(f"- --max-depth 12 on cluster42: {b[3]:,.1f} tokens/s (depth {b[6]}, latency "
                   f"{b[7]:,.0f} ms) vs {a[3]:,.1f} (depth {a[6]}, {a[7]:,.0f} ms) unrestricted: "
                   f"{1 - b[3] / a[3]:.1%} less flow; its bound {b[4]:,.1f} holds only for "
                   "placements with >= 7 layers a node and no partial inference")
    return out


NOTES = [
    "",
    "One row per case: milp's placement, then every other method's max flow. *bound*: the least proven",
    "upper bound on every placement's max flow, *bound from* the argument that proved it",
    "(`planner.search`); *status* is `optimal` / `gap` only when a bound proves it; *depth*: most nodes",
    "on a flow-carrying path; *latency*: one pass through a pipeline; *found by*: the stage that found it.",
]

PLANNER = "bench_planner"
HEADING = "## Planner (`scripts/bench_planner.py`)"
RUN_LINE = "- rows of "


def _cases_of(run_line: str) -> set[str]:
    """The cases whose rows a run line (``- rows of a, b: `command` on ...``) stands for."""
    return set(run_line[len(RUN_LINE):run_line.index(": `")].split(", "))


def _case_of(row_line: str) -> str:
    return row_line.split("|")[1].strip()


OTHERS = [m for m in METHODS if m != "milp"]


def _case_rows(rows) -> list[str]:
    """One table row per (case, model): the milp row's figures, then every other method's max flow."""
    out = []
    for key in dict.fromkeys((r[0], r[1]) for r in rows):
        got = {r[2]: r for r in rows if (r[0], r[1]) == key}
        m = got.get("milp")
        if m is None or m[3] is None:
            head = (f"| {key[0]} | {key[1]} | {'infeasible' if m else '-'} | - | - | "
                    f"{m[9] if m else '-'} | - | - | - | - | - |")
        else:
            _, _, _, flow, bound, gap, depth, latency_ms, secs, status, source, found = m
            head = (f"| {key[0]} | {key[1]} | {flow:,.1f} | {bound:,.1f} | {gap * 100:.2f} % | {status} | "
                    f"{source} | {found} | {depth} | {latency_ms:,.0f} | {secs:.1f} |")
        flows = ["-" if o not in got else "infeasible" if got[o][3] is None else f"{got[o][3]:,.1f}"
                 for o in OTHERS]
        out.append(head + " " + " | ".join(flows) + " |")
    return out


def _reference_line(rows) -> str | None:
    """The reference case against the reference planner, and the class MILP alone on it."""
    ref = {r[2]: r for r in rows if r[0] == "reference"}
    r = ref.get("milp")
    if r is None or r[3] is None:
        return None
    text = (f"Reference case: {r[3]:,.1f} tokens/s = {r[3] / REFERENCE_MAX_FLOW:.2f} x the reference "
            f"planner's {REFERENCE_MAX_FLOW} (target >= 2000 with gap <= 2 % in <= 60 s: "
            f"{'met' if r[3] >= 2000 and r[5] <= 0.02 and r[8] <= 60 else 'NOT met'})")
    alone = ref.get("milp (no warm start)")
    if alone is not None and alone[3] is not None:
        text += (f"; the class MILP alone, without warm starts: {alone[3]:,.1f} tokens/s, {alone[9]}, "
                 f"{alone[8]:.1f} s")
    return text + "."


def write_table(rows, args, command: str) -> None:
    """The planner's block of BENCHMARKS.md: this run's rows and, with ``--cases``, the rows of the
    cases not re-run, each under the line of the run that made it."""
    from benchdoc import read_section, stamp, write_section
    run = {r[0] for r in rows}
    order = [c[0] for c in CASES]
    runs = [(f"{RUN_LINE}{', '.join(c for c in order if c in run)}: {stamp(command, args.load)} HiGHS, "
             f"1 thread, gap target {args.gap:.0%}, MILP time limit {args.time_limit:.0f} s (paper MILP "
             f"{args.paper_time_limit:.0f} s).")]
    lines = _case_rows(rows)
    goals = acceptance(rows)
    ref = _reference_line(rows)
    tail = ["", ("hetero210: five copies of hetero42 (210 nodes, 7 GPU kinds), LLaMA-2 70B, all copies "
                 "linked like the original.")]
    if ref:
        tail[-1] += " " + ref
    old = (read_section(PLANNER) or "").splitlines() if args.cases else []
    if old:   # keep the rows, run lines and targets of the cases not re-run this time
        runs = [ln for ln in old if ln.startswith(RUN_LINE) and not _cases_of(ln) <= run] + runs
        kept = [ln for ln in old if ln.startswith("| ") and not ln.startswith(("| cluster", "|---"))
                and _case_of(ln) not in run]
        lines = sorted(kept + lines, key=lambda ln: order.index(_case_of(ln))
                       if _case_of(ln) in order else len(order))
        fresh = {ln[2:].split(":")[0].split()[0] for ln in goals}
        goals = [ln for ln in old if ln.startswith("- ") and not ln.startswith(RUN_LINE)
                 and ln[2:].split(":")[0].split()[0] not in run | fresh] + goals
        if not ref:   # the reference case's sentence, from the paragraph it ends
            tail[-1] += "".join(" Reference case:" + ln.split(" Reference case:", 1)[1]
                                for ln in old if " Reference case:" in ln)
    if goals:
        tail += ["", "Targets (each from its case's latest rows):"] + goals
    head = [("Runs (each case's rows come from the latest run that planned it; seconds are noisy on "
             "a shared machine):"), *runs, "",
            ("| cluster | model | max flow (tokens/s) | bound | gap | status | bound from | found by | "
             "depth | latency (ms) | seconds | " + " | ".join(OTHERS) + " |"),
            "|" + "---|" * (11 + len(OTHERS))]
    write_section(PLANNER, "\n".join(head + lines + tail + NOTES), heading=HEADING)


SCALE = "bench_planner_scale"
SCALE_REGIONS = 5


def scale_one(nodes: int, args) -> dict:
    """Generate, build and plan one synthetic cluster in this process; what the table needs."""
    import json
    import resource
    import time

    from helix.core.spec import parse_cluster
    from scripts.gen_cluster import generate
    t0 = time.perf_counter()
    spec = parse_cluster(generate(nodes, SCALE_REGIONS, seed=0), source=f"gen_cluster {nodes}")
    problem = build_problem(spec)
    t1 = time.perf_counter()
    plan = solve(problem, "milp", time_limit_s=args.time_limit, threads=1, seed=0, gap=args.gap)
    t2 = time.perf_counter()
    # What `helix plan` adds: the routing users get the most from, and its prediction; how many
    # evaluations each of the prediction's fixed points took (offline per routing, online once).
    from helix.core.costmodel import CostModel
    from planner.predicted import best_routing
    from planner.prediction import MAX_ITERATIONS
    from planner.prediction.model import Model
    evaluations: list[int] = []
    solve_fixed_point = Model.solve

    def counted(model, in_flight_of):
        out = solve_fixed_point(model, in_flight_of)
        evaluations.append(model.iterations[-1])
        return out
    Model.solve = counted
    predicted, _ = best_routing(spec, problem, plan, CostModel.for_cluster(spec))
    e = plan.extras
    row = {"nodes": nodes, "regions": SCALE_REGIONS, "build_s": t1 - t0, "solve_s": t2 - t1,
           "predict_s": time.perf_counter() - t2, "total_s": time.perf_counter() - t0,
           "predicted": predicted.prediction.prompt_decode_tokens_per_s,
           "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
           "flow": plan.max_flow_tokens_per_s, "bound": plan.upper_bound_tokens_per_s,
           "gap": plan.gap, "status": e.get("status"), "bound_from": e.get("bound_source"),
           "found_by": e.get("found_by"), "placed": len(plan.placements),
           "fixed_points": len(evaluations), "evaluations_max": max(evaluations, default=0),
           "capped": sum(n >= MAX_ITERATIONS for n in evaluations)}
    print(json.dumps(row), flush=True)
    return row


def _fmt_scale(r: dict) -> str:
    return (f"| {r['nodes']:,} | {r['regions']} | {r['placed']:,} | {r['build_s']:.1f} | "
            f"{r['solve_s']:.1f} | {r['predict_s']:.1f} | {r['total_s']:.1f} | "
            f"{r['peak_rss_mib']:,.0f} | {r['predicted']:,.1f} | {r['flow']:,.1f} | "
            f"{r['bound']:,.1f} | {r['gap'] * 100:.2f} % | {r['status']} | {r['bound_from']} | "
            f"{r['found_by']} | {r.get('fixed_points', '-')} / {r.get('evaluations_max', '-')} / "
            f"{r.get('capped', '-')} |")


def run_scale(args) -> None:
    """Each size in its own process (peak memory per size), then the table to BENCHMARKS.md."""
    import json
    import subprocess
    rows, loads = [], []
    for n in args.sizes:
        loads.append(os.getloadavg()[0])
        cmd = [sys.executable, str(Path(__file__).resolve()), "--scale-one", str(n),
               "--time-limit", str(args.time_limit), "--gap", str(args.gap)]
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO,
                             timeout=args.time_limit * 3 + 600)
        if out.returncode != 0:
            raise SystemExit(f"{n} nodes failed:\n{out.stderr[-3000:]}")
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(_fmt_scale(rows[-1]), flush=True)
    if not args.no_write:
        write_scale_section(rows, args, loads)


def write_scale_section(rows: list[dict], args, loads: list[float]) -> None:
    from benchdoc import write_section
    command = "python scripts/bench_planner.py " + " ".join(sys.argv[1:])
    big = [r for r in rows if r["nodes"] >= 1000]
    verdict = [f"Target: 1,000 nodes in 5 regions planned in <= 300 s within 3 % of a "
               f"proven bound: {r['total_s']:.0f} s with the prediction ({r['build_s'] + r['solve_s']:.0f} "
               f"s without), gap {r['gap']:.2%}, peak {r['peak_rss_mib']:,.0f} MiB "
               f"({'met' if r['total_s'] <= 300 and r['gap'] <= 0.03 else 'NOT met'})."
               for r in big]
    body = [(f"Planner at scale: HiGHS, 1 thread, gap target {args.gap:.0%}, time limit "
             f"{args.time_limit:.0f} s; clusters from `scripts/gen_cluster.py --nodes N --regions "
             f"{SCALE_REGIONS} --seed 0` (LLaMA-2 70B); each size in a fresh process. Load average at "
             f"each size's start: {', '.join(f'{x:.1f}' for x in loads)}."), "",
            ("| nodes | regions | placed | build (s) | solve (s) | predict (s) | total (s) | "
             "peak RSS (MiB) | predicted (tokens/s) | max flow (tokens/s) | bound | gap | status | "
             "bound from | found by | fixed points / evaluations (max) / capped |"),
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
            *[_fmt_scale(r) for r in rows], "", *verdict, "", *SCALE_NOTES]
    write_section(SCALE, "\n".join(body), heading=HEADING, command=command.strip(), load0=loads[0])


SCALE_NOTES = [
    "*build*: generate, validate and build the problem (10^6 links at 1,000 nodes); *solve*:",
    "`planner.solve`; *predict*: what `helix plan` adds (the best routing and its prediction,",
    "*predicted* prompt + decode tokens/s); *peak RSS*: the process's; last column: the prediction's",
    "fixed points solved / most evaluations any took / how many hit the cap.",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--paper-time-limit", type=float, default=60.0)
    ap.add_argument("--gap", type=float, default=0.01)
    ap.add_argument("--quick", action="store_true", help="only the reference case")
    ap.add_argument("--cases", nargs="*", help="only these cases (others' rows are kept)")
    ap.add_argument("--no-write", action="store_true", help="do not touch BENCHMARKS.md")
    ap.add_argument("--scale", action="store_true",
                    help="synthetic clusters of --sizes nodes in 5 regions (the scale table); "
                         "defaults --time-limit 300 and --gap 0.03")
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 250, 500, 1000],
                    help="node counts for --scale (default 100 250 500 1000)")
    ap.add_argument("--scale-one", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.scale or args.scale_one:
        if "--time-limit" not in sys.argv:
            args.time_limit = 300.0
        if "--gap" not in sys.argv:
            args.gap = 0.03
        if args.scale_one:
            scale_one(args.scale_one, args)
        else:
            run_scale(args)
        return
    args.load = os.getloadavg()[0]
    rows = []
    chosen = CASES[:1] if args.quick else [c for c in CASES if not args.cases or c[0] in args.cases]
    for name, path, model in chosen:
        rows += run_case(name, path, model, args)
    command = "python scripts/bench_planner.py " + " ".join(sys.argv[1:])
    if not args.no_write:
        write_table(rows, args, command.strip())


if __name__ == "__main__":
    main()
