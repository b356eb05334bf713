"""scripts/bench_chaos.py's bookkeeping: when faults fall and what the per-minute table counts (the
run itself, minutes of Ray workers under load, is the benchmark)."""

from __future__ import annotations

import sys

from tests.conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "scripts"))
from bench_chaos import Fault, Record, minute_rows, report, schedule  # noqa: E402


def test_faults_come_every_60_to_90_s_in_turn_and_leave_time_to_recover():
    kinds = ["kill -9", "SIGSTOP", "3 x kill -9", "link cut"]
    plan = schedule(600.0, (60.0, 90.0), kinds, seed=3, t0=1000.0)
    times = [t for t, _ in plan]
    gaps = [b - a for a, b in zip([1000.0, *times], times)]
    assert 6 <= len(plan) <= 9 and all(60 <= g <= 90 for g in gaps)
    assert times[-1] <= 1000 + 600 - 30
    assert [k for _, k in plan] == [kinds[i % 4] for i in range(len(plan))]
    assert schedule(600.0, (60.0, 90.0), kinds, seed=3, t0=1000.0) == plan   # seeded


def test_the_minute_table_counts_outcomes_ttft_and_tokens_by_minute():
    t0 = 100.0
    records = [Record(110.0, 110.02, 110.5, [110.02] * 16, "ok"),
               Record(130.0, 130.50, 131.0, [130.5] * 16, "ok"),
               Record(170.0, None, 170.01, [], "http_503", "queue_full"),
               Record(175.0, 175.1, 176.0, [175.1] * 4, "error_event")]
    first, second = minute_rows(records, t0, 90.0)
    cells = [c.strip() for c in first.strip("|").split("|")]
    assert cells[:8] == ["0", "2", "2", "0", "0", "0", "0", "20"]   # TTFT p50 of 20 and 500 ms
    assert cells[8] == "500" and float(cells[9]) == round(32 / 60)
    cells = [c.strip() for c in second.strip("|").split("|")]
    assert cells[:7] == ["1", "2", "0", "1", "0", "1", "0"] and cells[9] == str(round(4 / 30))
    text = report(records, [Fault("kill -9", "cpu-0", 140.0, 7.25)], t0, 90.0, 30.0, 22.5,
                  (500.0, 900.0), (510.0, 950.0), "No link cut.")
    assert "1 http_503" in text and "(1 queue_full)" in text and "| 40 | kill -9 | cpu-0 | 7.2 |" in text
    assert "offered 22.5 req/s" in text and "workers 900 -> 950 MB" in text
