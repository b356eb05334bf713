"""scripts/benchdoc.py: a benchmark's block of BENCHMARKS.md is rewritten in place, never appended."""

from __future__ import annotations

import sys

from tests.conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "scripts"))
from benchdoc import markers, read_section, stamp, write_section

BEFORE = """# Benchmarks

## Planner

<!-- bench_planner:start -->
| cluster | max flow |
|---|---|
| single24 | 9,161 |
<!-- bench_planner:end -->

How to read it: written by hand, kept.

## Draining a node

Reading of the drain figures, by hand.

## Chaos

<!-- bench_chaos:start -->
old chaos figures
<!-- bench_chaos:end -->
"""


def test_a_second_write_replaces_the_first_and_leaves_the_rest(tmp_path):
    path = tmp_path / "BENCHMARKS.md"
    path.write_text(BEFORE)
    write_section("bench_planner", "| cluster | max flow |\n|---|---|\n| single24 | 9,200 |", path=path)
    write_section("bench_planner", "| cluster | max flow |\n|---|---|\n| single24 | 9,300 |", path=path)
    after = path.read_text()
    assert after.count("<!-- bench_planner:start -->") == after.count("<!-- bench_planner:end -->") == 1
    assert "9,300" in after and "9,200" not in after and "9,161" not in after
    assert read_section("bench_planner", path).splitlines()[-1] == "| single24 | 9,300 |"
    # Everything outside the block is byte for byte what it was.
    start, end = markers("bench_planner")
    assert after[:after.index(start)] == BEFORE[:BEFORE.index(start)]
    assert after[after.index(end):] == BEFORE[BEFORE.index(end):]


def test_a_missing_block_goes_under_its_heading_once(tmp_path):
    path = tmp_path / "BENCHMARKS.md"
    path.write_text(BEFORE)
    for figure in ("1.0", "2.0"):
        write_section("bench_drain", f"drained after {figure} s", heading="## Draining a node", path=path)
    after = path.read_text()
    assert after.count("<!-- bench_drain:start -->") == 1
    assert read_section("bench_drain", path) == "drained after 2.0 s"
    # Inside its heading's section, after the hand-written reading, before the next heading.
    assert (after.index("Reading of the drain figures") < after.index("<!-- bench_drain:start -->")
            < after.index("## Chaos"))
    assert read_section("bench_chaos", path) == "old chaos figures"
    assert after.replace(f"{markers('bench_drain')[0]}\ndrained after 2.0 s\n"
                         f"{markers('bench_drain')[1]}\n\n", "") == BEFORE


def test_a_new_heading_and_block_go_at_the_end(tmp_path):
    path = tmp_path / "BENCHMARKS.md"
    path.write_text(BEFORE)
    write_section("bench_new", "figures", heading="## New benchmark", path=path)
    after = path.read_text()
    assert after.startswith(BEFORE.rstrip("\n"))
    assert after.endswith("## New benchmark\n\n<!-- bench_new:start -->\nfigures\n<!-- bench_new:end -->\n")
    assert read_section("bench_absent", path) is None


def test_the_stamp_names_the_command_machine_load_and_date(tmp_path):
    path = tmp_path / "BENCHMARKS.md"
    write_section("bench_x", "table", command="python scripts/bench_x.py --quick", load0=1.25, path=path)
    first = read_section("bench_x", path).splitlines()[0]
    assert first.startswith("`python scripts/bench_x.py --quick` on 20")
    assert " UTC (" in first and " cores, " in first and "load average 1.2 at the start" in first
    assert stamp("c", 0.0).endswith(" at the end).")
