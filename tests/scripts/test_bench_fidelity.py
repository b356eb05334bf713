"""scripts/bench_fidelity.py reads the offline protocol from helix.sim: the stationary mix that
``helix simulate`` replays by default, and its steady state after the fill
(tests/helix/sim/test_offline_replay.py tests both)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from tests.conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "scripts"))
import bench_fidelity  # noqa: E402


def test_the_bench_reads_the_simulators_steady_state():
    run = SimpleNamespace(label="x", duration_s=600.0, steady_decode_throughput_tokens_per_s=712.5)
    assert bench_fidelity.steady_of(run) == 712.5
    with pytest.raises(ValueError, match="no steady state"):
        bench_fidelity.steady_of(SimpleNamespace(label="x", duration_s=1.0,
                                                 steady_decode_throughput_tokens_per_s=None))



def test_offline_runs_last_the_asked_stays():
    """``--min-stays K``: an offline run lasts K predicted stays (requests in flight / requests per
    s) where that is longer than ``--duration``; 0, or no prediction, keeps ``--duration``."""
    plan = SimpleNamespace(prediction=SimpleNamespace(requests_in_flight=3900.0, requests_per_s=19.5))
    assert bench_fidelity.offline_duration_s(300.0, plan, 3) == 600          # 3 x 200 s
    assert bench_fidelity.offline_duration_s(900.0, plan, 3) == 900.0        # already longer
    assert bench_fidelity.offline_duration_s(300.0, plan, 0) == 300.0
    assert bench_fidelity.offline_duration_s(300.0, SimpleNamespace(prediction=None), 3) == 300.0


def test_long_offline_runs_draw_enough_requests():
    """The trace's requests suffice for most runs (None: the same draw as ``helix simulate``); a
    plan predicted to serve more in the run draws twice what it serves plus what it holds."""
    small = SimpleNamespace(prediction=SimpleNamespace(requests_in_flight=400.0, requests_per_s=2.0))
    assert bench_fidelity.offline_requests(small, 600.0, 16_663) is None
    big = SimpleNamespace(prediction=SimpleNamespace(requests_in_flight=4000.0, requests_per_s=23.0))
    assert bench_fidelity.offline_requests(big, 678.0, 16_663) == 2 * (23 * 678 + 4000)
    assert bench_fidelity.trace_requests() > 1000   # the packaged trace, filtered


def test_generated_cases_span_the_shapes_and_seeds():
    cases = bench_fidelity.generated_cases(len(bench_fidelity.GENERATED_SHAPES) + 2, seed=5)
    assert [c.seed for c in cases] == list(range(5, 5 + len(cases)))
    assert (cases[-1].nodes, cases[-1].regions) == (cases[1].nodes, cases[1].regions)
    first = cases[:len(bench_fidelity.GENERATED_SHAPES)]
    assert min(c.nodes for c in first) == 10 and max(c.nodes for c in first) == 200
    assert {c.regions for c in first} == {1, 2, 3, 4, 5}
    assert {c.model for c in first} == {"llama-2-70b", "llama-1-30b"}
    assert len({c.name for c in cases}) == len(cases)


def test_error_summary_reads_median_and_worst():
    text = bench_fidelity.error_summary([0.05, -0.12, 0.02, 0.25])
    assert text.startswith("4 clusters: median |error| 8.5 %, worst +25.0 %; 2 within 10 %, 3 within 20 %")


def test_generated_mode_runs_end_to_end():
    """A 10-node cluster, 120 simulated s: one row, and the summary is that row's error."""
    case = bench_fidelity.GeneratedCase(10, 1, 0, "llama-1-30b")
    rows, summary = bench_fidelity.generated_fidelity([case], duration_s=120, time_limit_s=5)
    assert len(rows) == 1 and rows[0].startswith(f"| {case.name} | 10 | 1 | llama-1-30b |")
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    pred, sim = (float(x.replace(",", "")) for x in cells[6].split(" (")[0].split(" / "))
    assert pred > 0 and sim > 0
    error = (pred - sim) / sim * 100
    assert summary.startswith("1 cluster: median |error| ")
    median = float(summary.split("median |error| ")[1].split(" %")[0])
    worst = float(summary.split("worst ")[1].split(" %")[0])
    # The row rounds the two figures to 0.1 token/s, the summary the error to 0.1 %.
    assert abs(abs(error) - median) < 0.2 and abs(error - worst) < 0.2


def test_transposed_puts_a_cluster_per_column():
    rows = ["| a | 10 | 1 | m | 1,000 | 5 | 9.0 / 10.0 (-10 %) | 30 / 31 (-3 %) | - | - |",
            "| b | 20 | 2 | m | not measured: too small ||||||"]
    table = bench_fidelity.transposed(rows, ["max flow", "decode tok/s"])
    assert table[0] == "| | a | b |" and table[1] == "|---|---|---|"
    assert table[2] == "| max flow | 1,000 | not measured: too small |"
    assert table[3] == "| decode tok/s | 9.0 / 10.0 (-10 %) |  |"
