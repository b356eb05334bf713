"""Planner benchmark: every method on the example clusters, and the reference case.

    python scripts/bench_planner.py [--time-limit 60] [--paper-time-limit 60] [--quick]
    python scripts/bench_planner.py --scale [--sizes 100 250 500 1000] (--time-limit 300, --gap 0.03)

Cases: the reference case (cluster_specs/reference/helix-single24-70b.yaml: the reference planner's
own throughput tables, 1 GB/s links), then single24 / geo24 / hetero42 with LLaMA-2 70B and
LLaMA-1 30B under our cost model, then the reference artifact's published cases
(../shared/data/reference_cases: 3cluster24, cluster42, cluster10, read as `helix convert
--throughput-tables` reads them; cluster42 also with --max-depth 12). Every method's max flow, proven bound, gap, depth and seconds go
to a table on stdout and into this script's section of BENCHMARKS.md (replaced on each run).
HiGHS runs with one thread so that runs on the shared 2-core machine stay comparable.

``--scale``: synthetic clusters from scripts/gen_cluster.py (N nodes in 5 regions, seed
0, LLaMA-2 70B), each size planned in a fresh process (so its peak RSS is its own) with the milp
method, a 300 s limit and a 3 % gap target unless given; the table goes to its own section of
BENCHMARKS.md, after the planner section.
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
    ("hetero210", "cluster_specs/hetero42.yaml", "x5")] + [
    (f"ref-{case}", case, "ini") for case in ("3cluster24", "cluster42", "cluster10")] + [
    ("ref-cluster42-depth12", "cluster42", "ini")]
REFERENCE_CASES = REPO.parent / "shared" / "data" / "reference_cases"
#: The reference artifact's published best max flow per case (README of reference_cases).
PUBLISHED = {"ref-3cluster24": 1212.18, "ref-cluster42": 4892.24, "ref-cluster10": 286.5874}


def reference_problem(case: str):
    """A published case through ``helix convert --throughput-tables`` (the same function)."""
    from helix.helix_ini import convert_ini, load_throughput_tables
    model = "llama-1-30b" if case == "cluster10" else "llama-2-70b"
    tables = load_throughput_tables(REFERENCE_CASES / "throughput_tables.yaml", case)
    conv = convert_ini(REFERENCE_CASES / f"{case}.ini",
                       REFERENCE_CASES / f"machine_profiles_{case}.ini", model,
                       throughput_tables=tables)
    return build_problem(conv.spec)


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
    depth = 12 if name.endswith("-depth12") else None
    if model == "x5":
        problem = replicate(build_problem(load_cluster(REPO / path)), 5)
        runs = [("milp", True), ("separate", True)]
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


def _widen(line: str) -> str:
    """A row kept from a run before the latency and bound-source columns: '-' in both."""
    cells = line.strip().strip("|").split("|")
    if len(cells) != 10:
        return line
    cells = cells[:7] + [" - "] + cells[7:9] + [" - "] + cells[9:]
    return "|" + "|".join(cells) + "|"


def acceptance(rows) -> list[str]:
    """Issue 11's targets, read from the rows of this run."""
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
    "How to read it. *max flow* is the exact max flow (networkx preflow-push, re-checked with",
    "Edmonds-Karp) of the returned placement; *bound* is a proven upper bound on every placement's",
    "max flow, the least of those found (*bound from*): `fixed_point` (F <= (1/L) sum_i max_k k",
    "min(F, T_i(k), links_i), with region cuts), `cover` (no placement gives every layer nodes worth",
    "that much: the cover MILP refuted it), `class_milp` (the class MILP's dual bound; a relaxation",
    "where links bind), `packing` (no placement fills every layer's slots to that flow, a node of k",
    "layers giving k slots: the packing LP refuted it), `paper_milp` (the paper MILP's dual bound),",
    "`crossing` (every token must change regions, no single link between regions carries that",
    "flow, so two nodes share some layer, and the coverage that wastes exceeds the nodes' slack),",
    "`sharing` (the same shared layer; the layers nodes can hold at that full flow sum to at most",
    "the model's, and no mix of nodes holding more layers than they run at full flow makes room);",
    "*status* speaks of the exact",
    "problem: `optimal` / `gap` only when such a bound proves it, else `feasible`; *gap* = (bound -",
    "max flow) / max flow; *latency* = mean time of one pass through a pipeline; *depth* =",
    "most nodes on a flow-carrying path; *found by* = which stage produced the placement (a heuristic",
    "warm start, `+local` after local search, `regional-milp` = per-region exact class MILPs,",
    "`aligned-chains` = one chain per region, lined up across regions, `milp` =",
    "the class MILP's own incumbent). `milp-paper` falls back to the best heuristic (with a warning)",
    "when it has no incumbent at its time limit; its bound column is still its own.",
]


ANALYSIS = """
Issue 11, geo24 within 3 % (run of 2026-11-25 evening, load average 3.8 at the start): aligned
chains (`planner.search.aligned_chains`, a warm start). Every region of geo24 holds the model,
and solving each alone (the regional MILP, each region proven optimal there) left each region's
integer waste where it fell: us-west ran at its T4s' T(8) = 1,572 tokens/s with its L4s 58 %
busy. The search keeps one chain per region and anneals the chains' node order and layer counts
on the layer profile (the sum over regions of the T(k) holding each layer: its minimum, then
fewer layers at it, less 0.05 x each region's profile variation, which is flow that must change
regions); the 8 best distinct chains of each of 4 runs (20,000 moves) are measured by the exact
max flow, which alone decides. Where one region's chain is weak another's is strong, and the
763 tokens/s links (one per node pair) even out the few hundred tokens/s between them. 70B
8,931.6 -> 9,161.1 tokens/s, gap 5.14 -> 2.07 % (2.51 % against the earlier bound 9,391.0; the
tree's fixed point is now 9,351.0); 30B 13,199.2 -> 13,304.9, gap 3.22 -> 2.35 % (2.40 % against
13,624.5). Both equal single24's best on the same nodes in one region (its `separate`: 9,161.1
with today's tables, 13,304.9), so here the regions cost nothing. ~1-1.5 s a run on a quiet core
(capped at min(10 s, 10 % of the time limit)); single-region clusters and regions that cannot
hold the model alone (3cluster24) get no chains: of the bench cases only geo24 gets a placement
from it, so no other row moves. The bound did not move: tried and dropped, the class MILP with
the exact crossing (links per sender x receiver pair, a one-hot sender count per region and
boundary; 9,351 after 60 s, no better placement, even on west + eu alone) and a region-aware
cover MILP (per-region layer flows, crossings capped per link; no feasible placement in 40 s at
9,000 for 70B or 13,210 for 30B). milp-paper on 30B keeps its own 778.1 incumbent over the warm
start (as before: it falls back only when it has none). The new geo24 70B plan in
bench_fidelity (`--cases geo24 --duration 600 --time-limit 60 --no-append`, committed code in a
clean worktree, load 3.3-5.4): predicted / simulated prompt + decode 1,366 / 1,254 (+9 %),
decode 318.5 / 334.8 (-5 %), TTFT p50 0.53 / 0.46 s (+16 %), TPOT p50 0.161 / 0.154 s (+4 %);
Helix vs Swarm offline 334.8 vs 180.7 decode tokens/s = 1.85x (1.77x with the old plan; target
2.5x not met).

Issue 11, hetero42 with LLaMA-1 30B (run of 2026-11-25 evening, load average ~4): 25,088.9
tokens/s against the fixed point's 25,282.8, gap 7.4 -> 0.77 % (status `gap`, 1.1 s; depth 21 ->
9), found by mixed stages, which skipped this case before (11,510 minimal patterns at 25,000
tokens/s, over the 5,000 cap). Two changes: (1) patterns are pruned by the slack at the target,
exactly: with b_c = max_k k min(T_c(k), X) a pattern loses sum_c m_c b_c - kX >= 0, a solution
reaching L layers loses at most sum_c n_c b_c - LX in all, so a pattern losing more is in no
solution (2,058 patterns left at 25,000; checked against brute force on random small clusters);
(2) the pattern MILP runs without HiGHS's presolve, which cost 6-10x the search on these wide
8-row models (25,033 tokens/s decided in 0.2 CPU s, 1.2 s with presolve). 25,220 is reachable by
mixed stages and 25,250 refuted (by the stage MILP, not a bound on every placement); the run stops
at the 1 % gap target. hetero42 70B stays within it (16,680.1, 0.91 %, 0.5 s; its inputs moved
since the 16,754.2 row: fixed point 16,916 -> 16,832), cluster42 (5,905.8) and single24 30B
(13,415.2) are unchanged (milp, 60 s, checked in a separate script, not rows here).

Issue 11, 3cluster24 proved optimal (run of 2026-11-25 evening, load average 4.3): the sharing
bound (`planner.search.sharing`) sees the whole chain. Above the largest link between regions
some layer has two holders (the crossing bound's chain argument). At a target X each node's
full-flow layer count m (most k with T(k) >= X) sums to L + σ; with σ <= 0 a second holder needs
excess nodes (k > m, so T(k) < X and every layer they hold has another holder too), and counting
holders over the excess nodes' layers gives sum (k T(k) / X - m) >= -σ and sum (k - 2m) >= -2σ
over them; an LP over excess counts refutes X when no mix meets both. On 3cluster24 every target
above the A100s' T(9) = 1,754.38 has σ = 0 (A100 8 + L4 3 + T4 2 layers a node: exactly 80) and
no mix pays (the only excess count with k > 2m, an L4 at 7 layers, runs 0.88 layers short; an
A100 at 9 layers gains ~1 layer but needs 7 more holders): bound 1,992.6 -> 1,754.38, so the
region chain's 1,754.4 is the optimum (gap 0 %, status optimal; `helix plan` stops after the
warm starts, 0.2-0.6 s; the bound itself ~30 ms). Checked against brute force on 563 tiny
two- and three-region clusters (never below the optimum, equal to it on many; 56 of them decided
by the σ = 0 LP). No other case gets it (a region holds the model, or σ > 0). The open question
below (is the optimum under 1,754?) is answered: no. The latency column moved (3,556 -> 1,777 ms)
with the same placement: latency estimates changed in the tree since the last run.

Issue 11 (run of 2026-11-25, load average 10.2 at the start: the time-limited phases got a
fraction of a core). A link-aware valid bound, `crossing` (`planner.search.crossing`): where no
region's nodes can hold the model, some token changes regions at a layer boundary; if one node
ran each side of it, every token would cross one link (at most 915 tokens/s on 3cluster24), so
above the largest link between regions two nodes run some layer side by side. With
layer-coverage accounting (waste on every layer plus each node's shortfall from its best
k min(T(k), X) / X equals the nodes' total slack at X, exactly) X is refuted when the least such
pair costs more than the slack. Closed form, ~1 ms; checked against brute force on tiny
two-region clusters (never below the optimum, 3-34 % below the fixed point there). 3cluster24:
2,045.6 -> 1,992.6. Its placement rose too: the region chain now picks the stage that receives a
crossing for the layers its whole region then covers (three T4 x 4 layers, not three L4 x 6: the
L4s hold 3 layers each on their own), 1,595.1 -> 1,754.4 tokens/s (1.45 x the reference ILP;
re-run alone at load 14.7), the A100s' T(9) binding. Gap 28.2 -> 13.6 %: still NOT the 10 %
target. The slack grows ~0.9 layers per 20 tokens/s below the fixed point while one crossing
costs 0.3-0.8 layers, so local crossing arguments stop near 1,975 even with three-node
crossings (computed, not kept); a bound near 1,754 must see the whole chain. A cover MILP with
region flows per layer and a sender x receiver pair gadget per boundary (a relaxation,
prototyped again) decided no target from 2,040 down to 1,650 in 30-40 s, with or without
pruning node options by the slack. Mixed
stages (`planner.search.mixed_stages`, a warm start): stages of any kinds holding the same k
layers, from a cutting-stock MILP over minimal patterns, bisected on the target: cluster42
5,813.7 -> 5,905.8 (1.21 x the best published, gap 4.3 %, depth 40 -> 28; the earlier claim that
5,870 "may be beyond the optimum" is wrong: one-kind stages were the limit), hetero42 70B
16,239.2 -> 16,754.2 (gap 4.2 -> 0.97 %, in 4 s). hetero42 30B has 10,000+ patterns and is
skipped (7.3 %); geo24 is multi-region (mixed stages only run per region, inside the regional
MILP's sub-solves) and keeps 5.1 / 3.2 %. Also fixed: the cover model capped a range starting
at layer 0 by its coordinator link on every layer, though with partial inference it also takes
tokens mid-range (a hand case refuted 50 where a placement serves 100); only layer 0 is capped
now. The latency column moved for every case (reference 2,926 -> 3,660 ms) without any
placement change: the estimate reads per-layer latencies that concurrent cost-model work in the
tree changed during this run.

Cost-model clusters re-run on 2026-11-25 (load 2.6) after the layer-time model that charges
decode attention and GQA's KV re-reads: every T(k) fell 7-44 %, so their max
flows fell (single24 70B 11,838 -> 9,162; hetero42 20,184 -> 16,239) and their gaps moved:
single24 2.9 -> 2.5 % (70B) and 11.1 -> 2.4 % (30B), geo24 4.1 -> 5.1 % (70B) and 25.0 -> 3.2 %
(30B), hetero42 4.5 -> 4.2 % and 7.9 -> 7.3 %, hetero210 1.5 -> 0.26 % (now in 0.3 s: the warm
starts stop at the gap, issue 15's scale work). The reference cases read their own T(k) tables and
are unchanged. Tried and dropped this session: large-neighbourhood search on the exact (paper)
MILP with 4-10 nodes free (each region, each pair of regions the flow crosses, random handfuls):
on 3cluster24 every sub-solve hit its 3 s limit with its bound at the link-blind 2,045.6 and no
better placement (the big-M relaxation stays weak with most integers fixed).

Issue 11 (runs of 2026-11-24, load average 6-10 on the 2 cores from other work: the time-limited
phases got a fraction of a core). Statuses now speak of the exact problem: `optimal` / `gap` only
where a bound valid for it proves so (brute-force test on tiny clusters with binding links, every
method); the class MILP's own status is `milp_status` in the plan. The 10-node 30B reference case
is proved optimal (286.59) in 0.5 s by the cover bound (the reference needed ~3,800 s of Gurobi;
our class MILP's bound stalled at 338 after 45 s). On 3cluster24 the region chains (crossings
between regions on several links side by side) serve 1,595.1 tokens/s, 1.32 x the reference ILP,
where our best before was Petals' 952.1; but no bound we had then saw the slow links: the fixed
point (2,045.6) stayed the least (the crossing bound, 2026-11-25, does: 1,992.6). Tried and
dropped: the LP relaxations of the class MILP and of a node-level layer MILP with per-pair crossing flows both sit at 2,045.6 (the latter's LP takes over
60 s), and a cover MILP with boundary cuts (crossings need pairs of nodes) leaves even 2,000
undecided after 60 s; so the 10 % gap target is not met. (At F > 1,754 every
A100, L4 and T4 at its largest k with T(k) >= F holds 80 layers in all, exactly the model; but
nodes may also hold more layers at T(k) < F side by side (at F = 1,760 that offers ~90 layers of
coverage), so whether the optimum is below 1,754 is open, not proved.) On cluster42 the packing
bound (6,151.8; the cover bound before it: 6,374.9, 6,364.6 on a quieter run) brings the gap to
5.8 %; the placement (one 40-node chain of stages, 5,813.7) is 1.19 x the best published
(Swarm's 4,892.2), below the 5,870 target: stages of one
GPU kind cover at most 74 of the 80 layers at 5,900 (mixed-kind stages cover all 80 there:
5,905.8 on 2026-11-25). --max-depth 12 costs cluster42 41 % of its flow (3,405.8 = A100 T(7)), for depth 11
instead of 40 and a 2.1 s instead of 2.6 s pass. The cost-model clusters keep 4-28 % gaps: the
cover bound decides no target there within its steps.

The packing bound (`planner.search.packing`, run of 2026-11-24, load average 2-3.5): a node
holding k layers gives k slots of size min(cap, F) / F, and every layer needs slots worth >= 1
(bin covering without the layer order: a relaxation of the cover MILP); its arc-flow LP, bisected
for up to 5 % of the limit before the cover search, takes 0.2 s a target on cluster42. It sees
what the fixed point lets pass, capacity split over layers at will: cluster42 6,528.9 -> 6,151.8
(gap 12.3 % -> 5.8 %; its integer form is still feasible at 6,100, so the LP is nearly all it
gives), geo24 30B 21,437.5 -> 20,983.7 (27.7 % -> 25.0 %), cluster10 340.7 -> 289.5 (the cover
bound still proves 286.59 optimal in 0.5 s); on geo24 70B and hetero42 it meets the fixed point
(small slots fill the gaps), and it does not see links, so 3cluster24 stays at 2,045.6. There a
cover MILP with region flows per layer and crossings limited to one link per sender-receiver pair
unless two nodes sit side by side (binary "two senders" / "two receivers" per boundary) left even
2,040 undecided after 20 s (a prototype, not in the tree). In the geo24 run milp-paper found
incumbents of its own (748 and 599 tokens/s) and so no longer fell back to the regional placement.

What the figures said (run of 2026-11-21). The reference case is solved to proven optimality: one
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
        f"(paper MILP {args.paper_time_limit:.0f} s), load average {args.load:.2f} at the start. "
        "Machine shared with other work: seconds are noisy.",
        "",
        "| cluster | model | method | max flow (tokens/s) | bound | gap | depth | latency (ms) | seconds | status | bound from | found by |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    tail = ["", "hetero210: five copies of hetero42 (210 nodes, 7 GPU kinds), LLaMA-2 70B, all copies "
            "linked like the original."]
    if ref and ref[0][3] is not None:
        r = ref[0]
        tail += ["", f"Reference case: {r[3]:,.1f} tokens/s = {r[3] / REFERENCE_MAX_FLOW:.2f} x the "
                f"reference planner's {REFERENCE_MAX_FLOW} (target >= 2000 with gap <= 2 % in <= 60 s: "
                f"{'met' if r[3] >= 2000 and r[5] <= 0.02 and r[8] <= 60 else 'NOT met'})."]
    path = REPO / "BENCHMARKS.md"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    lines = [_fmt_row(r) for r in rows]
    if args.cases and START in text:  # keep the rows of cases not re-run this time
        run = {r[0] for r in rows}
        old = text[text.index(START):text.index(END)].splitlines()
        kept = [_widen(ln) for ln in old if ln.startswith("| ") and not ln.startswith("| cluster")
                and ln.split("|")[1].strip() not in run]
        lines = kept + lines
        order = [c[0] for c in CASES]
        lines.sort(key=lambda ln: order.index(ln.split("|")[1].strip())
                   if ln.split("|")[1].strip() in order else len(order))
        first_run = next((ln for ln in old if ln.startswith("`python scripts/bench_planner.py")), None)
        if first_run:
            head[2] = (first_run + f" Rows for {', '.join(sorted(run))} re-run with `{command}` on "
                       f"{datetime.date.today()} ({machine}; load average {args.load:.2f} at the "
                       "start).")
        if not ref:
            tail += [""] + [ln for ln in old if ln.startswith("Reference case:")]
    goals = acceptance(rows)
    if args.cases and START in text:  # targets of cases not re-run keep their earlier lines
        run = {r[0] for r in rows}
        old = text[text.index(START):text.index(END)].splitlines()
        fresh = {ln[2:].split(":")[0].split()[0] for ln in goals}
        goals = [ln for ln in old if ln.startswith("- ") and ln[2:].split(":")[0].split()[0]
                 not in run | fresh] + goals
    if goals:
        tail += ["", "Issue 11 targets (each from its case's latest rows):", ""] + goals
    body = "\n".join([START] + head + lines + tail + NOTES + ANALYSIS + [END])
    if START in text and END in text:
        text = text[:text.index(START)] + body + text[text.index(END) + len(END):]
    else:
        text = text.rstrip("\n") + "\n\n" + body + "\n"
    path.write_text(text)


SCALE_START, SCALE_END = "<!-- bench_planner_scale:start -->", "<!-- bench_planner_scale:end -->"
SCALE_REGIONS = 5


def scale_one(nodes: int, args) -> dict:
    """Generate, build and plan one synthetic cluster in this process; what the table needs."""
    import json
    import resource
    import time

    from helix.spec import parse_cluster
    from scripts.gen_cluster import generate
    t0 = time.perf_counter()
    spec = parse_cluster(generate(nodes, SCALE_REGIONS, seed=0), source=f"gen_cluster {nodes}")
    problem = build_problem(spec)
    t1 = time.perf_counter()
    plan = solve(problem, "milp", time_limit_s=args.time_limit, threads=1, seed=0, gap=args.gap)
    t2 = time.perf_counter()
    # What `helix plan` adds: the routing users get the most from, and its prediction; how many
    # evaluations each of the prediction's fixed points took (offline per routing, online once).
    from helix.costmodel import CostModel
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
    machine = f"{os.cpu_count()} cores, {cpu_model()}, Python {platform.python_version()}"
    command = "python scripts/bench_planner.py " + " ".join(sys.argv[1:])
    big = [r for r in rows if r["nodes"] >= 1000]
    verdict = [f"Target: 1,000 nodes in 5 regions planned in <= 300 s within 3 % of a "
               f"proven bound: {r['total_s']:.0f} s with the prediction ({r['build_s'] + r['solve_s']:.0f} "
               f"s without), gap {r['gap']:.2%}, peak {r['peak_rss_mib']:,.0f} MiB "
               f"({'met' if r['total_s'] <= 300 and r['gap'] <= 0.03 else 'NOT met'})."
               for r in big]
    body = [SCALE_START, "### Planner at scale (`bench_planner.py --scale`)", "",
            f"`{command.strip()}` on {datetime.date.today()} ({machine}); HiGHS, 1 thread, "
            f"gap target {args.gap:.0%}, time limit {args.time_limit:.0f} s; clusters from "
            f"`scripts/gen_cluster.py --nodes N --regions {SCALE_REGIONS} --seed 0` (LLaMA-2 70B); "
            f"each size in a fresh process. Load average at each size's start: "
            f"{', '.join(f'{x:.1f}' for x in loads)} (the 2 cores were shared with other agents: "
            "seconds are inflated accordingly).", "",
            "| nodes | regions | placed | build (s) | solve (s) | predict (s) | total (s) | "
            "peak RSS (MiB) | predicted (tokens/s) | max flow (tokens/s) | bound | gap | status | "
            "bound from | found by | fixed points / evaluations (max) / capped |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
            *[_fmt_scale(r) for r in rows], "", *verdict, "", *SCALE_NOTES, SCALE_END]
    path = REPO / "BENCHMARKS.md"
    text = path.read_text()
    if SCALE_START in text and SCALE_END in text:
        text = text[:text.index(SCALE_START)] + "\n".join(body) + \
            text[text.index(SCALE_END) + len(SCALE_END):]
    elif END in text:   # right after the planner section
        at = text.index(END) + len(END)
        text = text[:at] + "\n\n" + "\n".join(body) + text[at:]
    else:
        text = text.rstrip("\n") + "\n\n" + "\n".join(body) + "\n"
    path.write_text(text)


SCALE_NOTES = [
    "*build* = generate the spec, validate it, build the placement problem (every ordered pair of",
    "vertices gets a link: 10^6 at 1,000 nodes); *solve* = `planner.solve` (bound, warm starts,",
    "search, exact max flow, verification); *predict* = what `helix plan` adds (the routing users",
    "get the most from, `planner.predicted.best_routing`, and its prediction, *predicted* = prompt",
    "+ decode tokens/s); *peak RSS* = the process's ru_maxrss (Python, numpy, networkx and HiGHS",
    "included); *placed* = nodes holding layers. Bound and status as in the planner section (valid",
    "for the exact problem); *found by* = the placement's origin.",
    "",
    "What it took (runs of 2026-11-25, 1,000 nodes, load average 5-7 before the last step): the",
    "first run spent 307 s and 361 MiB, all of it outside the MILP, which never ran (a warm start",
    "was within the gap): building the problem (ClusterSpec.node and PlacementProblem.node were",
    "list scans: 21 s at 500 nodes; now dict look-ups and one shared Link per region pair class),",
    "node classes (pairwise Python loops; now colour refinement on numpy link matrices), the",
    "fixed-point bound (an lru_cache hashing the whole problem per call, g summed per node; now per",
    "distinct node kind), max flows on graphs of ~10^5 arcs (now arcs that cannot bind, capacity >=",
    "min(T_i, T_j), go through one hub per boundary layer and region pair: 91k -> 57k arcs, more",
    "where regions are fast), verification by Edmonds-Karp (105 s; now a min-cut certificate in",
    "linear time) and warm starts evaluated after the gap target was already met (pipelines alone",
    "40 s; now skipped and named in `warm_starts_skipped`). 307 s -> 80 s -> 7 s. Seeds 1 and 2 and",
    "20-50 Mb/s between regions give the same picture (0.24-0.32 %, 5-10 s). Per-region processes",
    "are not built: the whole solve is now 5-10 s, little for them to save on 2 shared cores.",
    "",
    "`helix plan` on the 1,000-node cluster took longer than the planner: the prediction's path x",
    "node matrices were dense (thousands of paths x 1,000 nodes, up to 2N+1 filling steps) and",
    "each routing phase rebuilt all 10^6 links: 241 s of the 255 s `helix plan`'s steps took (load",
    "~3). Now sparse (`planner.prediction.incidence.Incidence`, same predictions to 6e-15) and only the arcs",
    "with flow updated: `helix plan /tmp/c1000.yaml --gap 0.03 --threads 1 -o plan.yaml` ran in",
    "74 s wall, 367 MiB peak, at load average 5.3 (plan.yaml 5.7 MB).",
    "",
    "The prediction's fixed point (issue 12; runs of 2026-11-25 ~22:45, load 2.1-2.6): it never",
    "converged at these sizes before. Only the decode batches were damped; the request rates came",
    "back undamped into the links' M/G/1 waits, so a rate overshoot loaded a 100 Mb/s link to its",
    "0.95 cap (a path's wait 8.4 s, 0.6 s at the fixed point's rates), the rates collapsed, and a",
    "third of the nodes swung between two batches (period 2) until the 60-iteration cap. A routing's",
    "prediction was one phase of that cycle (300-node Swarm plan: 17,422 tokens/s when stopped at 60",
    "iterations, 38,001 at 61, fixed point 27,442; its other routings up to 37 % below theirs), and",
    "the routing chosen by comparing such numbers was arbitrary. Now `planner.prediction.fixed_point.Mixer` mixes",
    "batches and rates together (damped per coordinate, Anderson-accelerated near the fixed point;",
    "the argument is in its docstring). Last column: fixed points solved (offline per routing with",
    "pipelines, then the chosen routing's offline and online) / most evaluations any took / how many",
    "hit the cap (200): none. Same sizes, old code, right after (`--no-write` in a worktree of",
    "5d2d285, load 2.1-2.5): predict 0.9 / 7.0 / 11.7 / 24.2 s, predicted 5,610.8 / 27,888.2 /",
    "65,844.7 / 136,137.0 tokens/s (the chosen routings' phases happened to lie within 5 % of their",
    "fixed points), peak 356 MiB at 1,000 nodes; now 0.5 / 1.9 / 4.5 / 7.0 s. Besides converging in",
    "11-44 evaluations (the offline solve ran all 60 before), only the chosen routing gets the",
    "online solve, the routings filter the 10^6 links once per phase kind, the filling keeps its",
    "per-node use as one array, and the scheduler's fallback asks its hop rule per pair of layer",
    "ranges and plays its rounds on arrays (each checked to give the same answers). Left at 1,000",
    "nodes (`best_routing` 6.7 s at load 2.7): the routings' max flows 1.5 s (+0.5 s building them),",
    "the filling 1.7 s, the cost model's step times 1.5 s (Python, ~10 us per node and evaluation),",
    "the model's set-up 1.4 s (the fallback 0.7 s of it). The solver's own flows predict 0 tokens/s",
    "at 500 and 1,000 nodes: they split over so many paths that every share is below",
    "`helix.pipelines.MIN_SHARE` (1e-4), so the kind-chain routings carry the prediction. `helix",
    "plan` on the same 1,000-node spec (`--gap 0.03 --threads 1 -o plan.yaml`) now takes 15.9 s wall",
    "and 332 MiB peak (load 3.2; 74 s above), plan.yaml written by libyaml's emitter (same bytes,",
    "4.4 s instead of 7.4).",
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
                    help="synthetic clusters of --sizes nodes in 5 regions (issue 15's table); "
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
        write_section(rows, args, command.strip())


if __name__ == "__main__":
    main()
