"""scripts/bench_fidelity.py's offline protocol: a mix that does not drift, read after the fill."""

from __future__ import annotations

import sys

import pytest

from helix.core.plan import ArcFlow, Plan
from helix.sim import run as simrun
from helix.sim.workload import mean_lengths
from helix.core.slices import LayerSlice
from tests.conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "scripts"))
from bench_fidelity import stationary_offline_workload, steady_decode_tokens_per_s  # noqa: E402

PLAN = Plan(model="llama-2-7b", num_layers=32, placements=(LayerSlice("a", 0, 32),),
            arc_flows=(ArcFlow("coordinator", "a", 1.0), ArcFlow("a", "coordinator", 1.0)),
            max_flow_tokens_per_s=1.0)


def test_steady_rate_skips_the_fill_and_counts_missing_buckets_as_zero():
    # 10 s in 1 s buckets: a fill (0, 0, 2, 4, 10) then 10 tokens/s: the last half reads 10.
    ramp = [0, 0, 2, 4, 10, 10, 10, 10, 10, 10]
    assert steady_decode_tokens_per_s(ramp, 1.0, 10.0) == pytest.approx(10.0)
    # The timeline stops at the last token: the two silent buckets still count, as zeros.
    assert steady_decode_tokens_per_s(ramp[:8], 1.0, 10.0) == pytest.approx(6.0)
    # From a fraction that is not on a bucket edge: the first whole bucket after it (t = 3 s on).
    assert steady_decode_tokens_per_s(ramp, 1.0, 10.0, 0.25) == pytest.approx(64 / 7)
    with pytest.raises(ValueError):
        steady_decode_tokens_per_s(ramp, 1.0, 10.0, 1.0)


def test_stationary_mix_is_the_whole_traces_where_the_trace_in_order_drifts():
    """The Azure conversation trace in order: its requests 1,000-3,000 (what hetero42 serves in
    600 s offline) have prompts ~20 % longer than the whole trace's mean; drawn at random they do
    not, and the draw is the same every run."""
    in_order = simrun.make_workload(simrun.WorkloadOptions(), "offline", PLAN)
    whole_p, whole_o = mean_lengths(in_order)
    assert whole_p == pytest.approx(763, abs=5) and whole_o == pytest.approx(232, abs=5)
    assert mean_lengths(in_order[1000:3000])[0] > 1.15 * whole_p   # the drift
    drawn = stationary_offline_workload(PLAN)
    assert len(drawn) == len(in_order)
    for part in (drawn[:1000], drawn[1000:3000]):
        p, o = mean_lengths(part)
        assert p == pytest.approx(whole_p, rel=0.05) and o == pytest.approx(whole_o, rel=0.08)
    assert drawn == stationary_offline_workload(PLAN)
