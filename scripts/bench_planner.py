"""Planner benchmark: every method on the example clusters, and the reference case.

    python scripts/bench_planner.py [--time-limit 60] [--paper-time-limit 60] [--quick]

Cases: the reference case (cluster_specs/reference/helix-single24-70b.yaml: the reference planner's
own throughput tables, 1 GB/s links), then single24 / geo24 / hetero42 with LLaMA-2 70B and
LLaMA-1 30B under our cost model. Every method's max flow, proven bound, gap, depth and seconds go
to a table on stdout and into this script's section of BENCHMARKS.md (replaced on each run).
HiGHS runs with one thread so that runs on the shared 2-core machine stay comparable.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from helix.models import resolve_model  # noqa: E402
from helix.spec import load_cluster  # noqa: E402
from planner import METHODS, solve  # noqa: E402
from planner.build import build_problem  # noqa: E402
from planner.reference import REFERENCE_MAX_FLOW  # noqa: E402

START, END = "<!-- bench_planner:start -->", "<!-- bench_planner:end -->"
CASES = [("reference", "cluster_specs/reference/helix-single24-70b.yaml", None)] + [
    (name, f"cluster_specs/{name}.yaml", model)
    for name in ("single24", "geo24", "hetero42") for model in ("llama-2-70b", "llama-1-30b")] + [
    ("hetero210", "cluster_specs/hetero42.yaml", "x5")]


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


def cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
        return re.search(r"model name\s*:\s*(.+)", text).group(1).strip()
    except (OSError, AttributeError):
        return platform.processor() or "unknown CPU"


def run_case(name, path, model, args):
    if model == "x5":
        problem = replicate(build_problem(load_cluster(REPO / path)), 5)
        runs = [("milp", True), ("separate", True)]
    else:
        problem = build_problem(load_cluster(REPO / path), resolve_model(model) if model else None)
        runs = [(m, True) for m in METHODS] + ([("milp", False)] if name == "reference" else [])
    rows = []
    for method, warm in runs:
        limit = args.paper_time_limit if method == "milp-paper" else args.time_limit
        try:
            plan = solve(problem, method, time_limit_s=limit, threads=1, seed=0, gap=args.gap,
                         warm_starts=warm)
        except Exception as exc:  # an infeasible heuristic is a row, not a crash
            rows.append((name, problem.model, method if warm else "milp (no warm start)",
                         None, None, None, None, None, type(exc).__name__, "-"))
            print(_fmt_row(rows[-1]), flush=True)
            continue
        label = method if warm else "milp (no warm start)"
        rows.append((name, plan.model, label, plan.max_flow_tokens_per_s,
                     plan.upper_bound_tokens_per_s, plan.gap, plan.extras.get("depth_max"),
                     plan.solve_seconds, plan.extras.get("status", "heuristic"),
                     plan.extras.get("found_by", "-")))
        print(_fmt_row(rows[-1]), flush=True)
    return rows


def _fmt_row(r) -> str:
    name, model, method, flow, bound, gap, depth, secs, status, found = r
    if flow is None:
        return f"| {name} | {model} | {method} | infeasible | - | - | - | - | {status} | - |"
    return (f"| {name} | {model} | {method} | {flow:,.1f} | {bound:,.1f} | {gap * 100:.2f} % | "
            f"{depth} | {secs:.1f} | {status} | {found} |")


NOTES = [
    "",
    "How to read it. *max flow* is the exact max flow (networkx preflow-push, re-checked with",
    "Edmonds-Karp) of the returned placement; *bound* is a proven upper bound on every placement's",
    "max flow: the fixed point F <= (1/L) sum_i max_k k min(F, T_i(k), links_i) with region cuts,",
    "tightened by the class MILP's dual bound (`milp`), or the paper MILP's own dual bound",
    "(`milp-paper`, as the reference reported it); *gap* = (bound - max flow) / max flow; *depth* =",
    "most nodes on a flow-carrying path; *found by* = which stage produced the placement (a heuristic",
    "warm start, `+local` after local search, `regional-milp` = per-region exact class MILPs, `milp` =",
    "the class MILP's own incumbent). `milp-paper` falls back to the best heuristic (with a warning)",
    "when it has no incumbent at its time limit; its bound column is still its own.",
]


ANALYSIS = """
What the figures say (run of 2026-11-21). The reference case is solved to proven optimality: one
chain of all 24 nodes (4 A100 x 8 layers at T(8) = 2046, 8 L4 x 3, 12 T4 x 2) serves 2046
tokens/s, and the fixed-point bound is exactly 2046, so the gap is 0 (1.59 x the reference
planner's 1289.6). The class MILP alone, without any warm start, also proves it optimal (1.2 s;
up to 7 s in an earlier run while the CPU was shared). The paper MILP on HiGHS finds no incumbent
in 60 s on the reference and single24 70B, and only poor ones elsewhere (676-966 tokens/s); its
own bound is 40-1,900 x the flow, like the reference's 2,000-7,000 % gaps. Under our cost model
the gaps that remain on the 24/42-node clusters (3-28 %) are not closed: neither HiGHS's branch
and bound nor its heuristics move incumbent or bound within 60 s (a 300 s run on single24 70B
moved neither), so the best placement comes from the structured warm starts (`stages`,
`separate`, per-region MILPs) and local search. The bound assumes nodes share layers
fractionally; where k T(k) peaks at a few layers (the 30B cases) many nodes must run side by side
on each layer and integer stages waste capacity the bound does not see, so we expect much of the
gap to be the bound's, but these runs do not prove it. With more nodes (hetero210) that waste
averages out and the gap shrinks.""".splitlines()


def write_section(rows, args, command: str) -> None:
    machine = f"{os.cpu_count()} cores, {cpu_model()}, Python {platform.python_version()}"
    ref = [r for r in rows if r[0] == "reference" and r[2] == "milp"]
    head = [
        "## Planner (`helix plan`): max flow, proven bound, gap",
        "",
        f"`{command}` on {datetime.date.today()} ({machine}); HiGHS, 1 thread, "
        f"gap target {args.gap:.0%}, MILP time limit {args.time_limit:.0f} s "
        f"(paper MILP {args.paper_time_limit:.0f} s). Machine shared with other work: seconds are noisy.",
        "",
        "| cluster | model | method | max flow (tokens/s) | bound | gap | depth | seconds | status | found by |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    tail = ["", "hetero210: five copies of hetero42 (210 nodes, 7 GPU kinds), LLaMA-2 70B, all copies "
            "linked like the original."]
    if ref and ref[0][3] is not None:
        r = ref[0]
        tail = ["", f"Reference case: {r[3]:,.1f} tokens/s = {r[3] / REFERENCE_MAX_FLOW:.2f} x the "
                f"reference planner's {REFERENCE_MAX_FLOW} (target >= 2000 with gap <= 2 % in <= 60 s: "
                f"{'met' if r[3] >= 2000 and r[5] <= 0.02 and r[7] <= 60 else 'NOT met'})."]
    path = REPO / "BENCHMARKS.md"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    lines = [_fmt_row(r) for r in rows]
    if args.cases and START in text:  # keep the rows of cases not re-run this time
        run = {r[0] for r in rows}
        old = text[text.index(START):text.index(END)].splitlines()
        kept = [ln for ln in old if ln.startswith("| ") and not ln.startswith("| cluster")
                and ln.split("|")[1].strip() not in run]
        lines = kept + lines
        order = [c[0] for c in CASES]
        lines.sort(key=lambda ln: order.index(ln.split("|")[1].strip())
                   if ln.split("|")[1].strip() in order else len(order))
        first_run = next((ln for ln in old if ln.startswith("`python scripts/bench_planner.py")), None)
        if first_run:
            head[2] = (first_run + f" Rows for {', '.join(sorted(run))} re-run with `{command}` on "
                       f"{datetime.date.today()} ({machine}).")
        if not ref:
            tail += [""] + [ln for ln in old if ln.startswith("Reference case:")]
    body = "\n".join([START] + head + lines + tail + NOTES + ANALYSIS + [END])
    if START in text and END in text:
        text = text[:text.index(START)] + body + text[text.index(END) + len(END):]
    else:
        text = text.rstrip("\n") + "\n\n" + body + "\n"
    path.write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--paper-time-limit", type=float, default=60.0)
    ap.add_argument("--gap", type=float, default=0.01)
    ap.add_argument("--quick", action="store_true", help="only the reference case")
    ap.add_argument("--cases", nargs="*", help="only these cases (others' rows are kept)")
    ap.add_argument("--no-write", action="store_true", help="do not touch BENCHMARKS.md")
    args = ap.parse_args()
    rows = []
    chosen = CASES[:1] if args.quick else [c for c in CASES if not args.cases or c[0] in args.cases]
    for name, path, model in chosen:
        rows += run_case(name, path, model, args)
    command = "python scripts/bench_planner.py " + " ".join(sys.argv[1:])
    if not args.no_write:
        write_section(rows, args, command.strip())


if __name__ == "__main__":
    main()
