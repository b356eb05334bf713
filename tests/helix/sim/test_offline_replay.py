"""The offline replay: lengths drawn from the whole trace (a mix that does not drift) unless
asked for the trace in order, and the steady state read after the fill beside the whole run."""

from __future__ import annotations

import statistics

import pytest

from helix.core.plan import ArcFlow, Plan
from helix.core.slices import LayerSlice
from helix.sim import run as simrun
from helix.sim.engine import SimConfig
from helix.sim.metrics import steady_decode_tokens_per_s, steady_window_start_s
from helix.sim.workload import load_azure_trace, mean_lengths, resolve_trace, stationary_workload
from tests.builders.sims import burst, make_sim

PLAN = Plan(model="llama-2-7b", num_layers=32, placements=(LayerSlice("a", 0, 32),),
            arc_flows=(ArcFlow("coordinator", "a", 1.0), ArcFlow("a", "coordinator", 1.0)),
            max_flow_tokens_per_s=1.0)


@pytest.fixture(scope="module")
def conv():
    return load_azure_trace(resolve_trace("conv"))


def _lengths(requests):
    return [(r.prompt_tokens, r.output_tokens) for r in requests]


def test_default_offline_replay_draws_from_the_whole_trace_where_the_trace_in_order_drifts(conv):
    """The Azure conversation trace in order: its requests 1,000-3,000 (what hetero42 serves in
    600 s offline) have prompts ~20 % longer than the whole trace's mean; drawn at random (the
    default) they do not."""
    in_order = simrun.make_workload(simrun.WorkloadOptions(in_order=True), "offline", PLAN)
    assert in_order == conv
    whole_p, whole_o = mean_lengths(conv)
    assert whole_p == pytest.approx(763, abs=5) and whole_o == pytest.approx(232, abs=5)
    assert mean_lengths(conv[1000:3000])[0] > 1.15 * whole_p   # the drift
    drawn = simrun.make_workload(simrun.WorkloadOptions(), "offline", PLAN)
    assert len(drawn) == len(conv) and drawn != conv
    for part in (drawn[:1000], drawn[1000:3000]):
        p, o = mean_lengths(part)
        assert p == pytest.approx(whole_p, rel=0.05) and o == pytest.approx(whole_o, rel=0.08)


def test_drawn_lengths_follow_the_traces_distribution(conv):
    drawn = stationary_workload(conv, len(conv), seed=3)
    assert {r.arrival_s for r in drawn} == {0.0}   # offline ignores arrival times
    assert set(_lengths(drawn)) <= set(_lengths(conv))
    for pick in (lambda r: r.prompt_tokens, lambda r: r.output_tokens):
        want = statistics.quantiles(map(pick, conv), n=10)
        got = statistics.quantiles(map(pick, drawn), n=10)
        for w, g in zip(want, got):   # every decile within 5 % (a few tokens at the short end)
            assert g == pytest.approx(w, rel=0.05, abs=3)


def test_offline_draw_is_seeded(conv):
    opts = simrun.WorkloadOptions(num_requests=2000)
    a = simrun.make_workload(opts, "offline", PLAN, seed=1)
    assert a == simrun.make_workload(opts, "offline", PLAN, seed=1)
    b = simrun.make_workload(opts, "offline", PLAN, seed=2)
    assert len(a) == len(b) == 2000 and _lengths(a) != _lengths(b)
    # N requests are drawn from the whole trace, not from its first N.
    first = mean_lengths(conv[:2000])[0]
    assert abs(mean_lengths(a)[0] - mean_lengths(conv)[0]) < abs(first - mean_lengths(conv)[0])


def test_in_order_replays_the_first_n_in_order(conv):
    got = simrun.make_workload(simrun.WorkloadOptions(num_requests=50, in_order=True), "offline",
                               PLAN, seed=7)
    assert got == conv[:50]


def test_steady_rate_skips_the_fill_and_counts_missing_buckets_as_zero():
    # 10 s in 1 s buckets: a fill (0, 0, 2, 4, 10) then 10 tokens/s: the last half reads 10.
    ramp = [0, 0, 2, 4, 10, 10, 10, 10, 10, 10]
    assert steady_decode_tokens_per_s(ramp, 1.0, 10.0) == pytest.approx(10.0)
    assert steady_window_start_s(10.0, 1.0) == 5.0
    # The timeline stops at the last token: the two silent buckets still count, as zeros.
    assert steady_decode_tokens_per_s(ramp[:8], 1.0, 10.0) == pytest.approx(6.0)
    # From a fraction that is not on a bucket edge: the first whole bucket after it (t = 3 s on).
    assert steady_decode_tokens_per_s(ramp, 1.0, 10.0, 0.25) == pytest.approx(64 / 7)
    assert steady_window_start_s(10.0, 1.0, 0.25) == 3.0
    assert steady_decode_tokens_per_s(ramp, 1.0, 10.0, 1.0) is None
    assert steady_decode_tokens_per_s([5.0], 1.0, 1.0) is None


def _one_node_sim(workload, mode="offline", duration_s=60.0):
    plan = Plan("m", 4, (LayerSlice("a", 0, 4),),
                (ArcFlow("coordinator", "a", 1.0), ArcFlow("a", "coordinator", 1.0)), 1.0)
    return make_sim(plan, workload, SimConfig(mode=mode, duration_s=duration_s), kv_tokens=4_000)


def test_offline_steady_state_is_read_after_the_fill():
    """Saturated to the end: the steady figure is the second half's rate, no lower than the
    whole run's (which includes the fill) and no higher than its fastest second."""
    r = _one_node_sim(burst(2000, 100, 20)).run()
    assert r.requests_unfinished > 0
    assert r.steady_from_s == 30.0
    steady = r.steady_decode_throughput_tokens_per_s
    assert steady == pytest.approx(sum(r.throughput_timeline_tokens_per_s[30:]) / 30)
    assert r.decode_throughput_tokens_per_s <= steady <= max(r.throughput_timeline_tokens_per_s)
    assert steady > 0.9 * r.decode_throughput_tokens_per_s
    d = r.to_dict()
    assert d["steady_decode_throughput_tokens_per_s"] == steady and d["steady_from_s"] == 30.0


def test_no_steady_state_online_or_once_the_requests_run_out():
    drained = _one_node_sim(burst(5, 100, 20)).run()
    assert drained.requests_unfinished == 0
    assert drained.steady_decode_throughput_tokens_per_s is None and drained.steady_from_s is None
    online = _one_node_sim(burst(2000, 100, 20, gap_s=0.01), mode="online").run()
    assert online.steady_decode_throughput_tokens_per_s is None
