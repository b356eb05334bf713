"""The reference artifact's published cases read through ``helix convert``: our Petals-style and
SWARM-style placements and the reference ILP's layouts, scored by our max flow, beside the
artifact's published figures.

    python scripts/reference_baselines.py [--no-append]

Inputs: ../shared/data/reference_cases (the artifact's INI clusters, its T(k) tables, its ILP
layouts) and the single-region case in cluster_specs/reference; published layouts copied into
tests/planner/data. Prints a table and rewrites this script's block of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from helix.core.helix_ini import convert_ini, load_throughput_tables, read_layout
from planner.build import build_problem
from planner.flowgraph import max_flow
from planner.reference import reference_single24_70b
from planner.search.baselines import petals, swarm

HEADING = "## Baselines on the reference artifact's cases (`scripts/reference_baselines.py`)"
CASES = {"3cluster24": "llama-2-70b", "cluster42": "llama-2-70b", "cluster10": "llama-1-30b"}
#: tokens/s the artifact published (reference_cases/README.md): (ILP, Swarm, Petals)
PUBLISHED = {"single24": (1289.56, 757.85, 952.11), "3cluster24": (1212.18, 616.38, 952.11),
             "cluster42": (4137.55, 4892.24, 3292.24), "cluster10": (286.5874, 286.59, 193.50)}
DATA = REPO.parent / "shared" / "data" / "reference_cases"
LAYOUTS = REPO / "tests" / "planner" / "data"


def problems():
    yield "single24", reference_single24_70b(artifact_order=True), "hand-written copy (rounded tables)"
    for case, model in CASES.items():
        tables = load_throughput_tables(DATA / "throughput_tables.yaml", case)
        conv = convert_ini(DATA / f"{case}.ini", DATA / f"machine_profiles_{case}.ini", model,
                           throughput_tables=tables)
        note = (f"{len(conv.regions.members)} region(s) "
                f"{'/'.join(str(len(m)) for m in conv.regions.members.values())}, "
                f"{len(conv.spec.links)} link overrides")
        yield case, build_problem(conv.spec), note


def scored(problem, placement) -> float:
    return max_flow(problem, placement).value_tokens_per_s


def row(case, problem, note) -> list[str]:
    ilp, pub_swarm, pub_petals = PUBLISHED[case]
    sol = next((d / f"{case}_ilp_sol.ini" for d in (DATA, LAYOUTS)
                if (d / f"{case}_ilp_sol.ini").exists()), None)
    ilp_ours = "-"
    if sol is not None:
        ilp_ours = f"{scored(problem, {problem.nodes[i].name: r for i, r in read_layout(sol).items()}):.2f}"
    cells = [case, note, f"{ilp:.2f}", ilp_ours]
    for name, heuristic, published in (("swarm", swarm, pub_swarm), ("petals", petals, pub_petals)):
        placement = heuristic(problem, 0)
        same = "-"
        layout = LAYOUTS / f"{case}_{name}_sol.ini"
        if layout.exists():
            ref = {problem.nodes[i].name: r for i, r in read_layout(layout).items()}
            same = "identical" if ref == placement else "differs"
        cells += [f"{published:.2f}", f"{scored(problem, placement):.2f}", same]
    return cells


def table(rows) -> str:
    head = ["case", "converted", "ILP published", "ILP layout, our flow", "Swarm published",
            "Swarm ours", "Swarm layout", "Petals published", "Petals ours", "Petals layout"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-append", action="store_true", help="print only; leave BENCHMARKS.md")
    args = ap.parse_args()
    if not DATA.is_dir():
        sys.exit(f"reference cases not found at {DATA}")
    t0 = time.perf_counter()
    load = os.getloadavg()[0]
    rows = [row(*p) for p in problems()]
    text = table(rows)
    print(text)
    if args.no_append:
        return
    from benchdoc import write_section  # scripts/ is this script's import path
    write_section("reference_baselines", f"{time.perf_counter() - t0:.1f} s. Max flow in tokens/s; seed 0."
                  f"\n\n{text}", heading=HEADING, command="python scripts/reference_baselines.py", load0=load)


if __name__ == "__main__":
    main()
