"""scripts/bench_live.py's calibration: the CPU the coordinator and the load generator spend per
token, written into the spec the simulator reads (the live run itself is the benchmark)."""

from __future__ import annotations

import os
import sys
import time

import pytest

from helix.sim.build import build_simulator
from helix.sim.engine import SimConfig
from helix.sim.workload import TraceRequest
from helix.core.spec import load_cluster
from tests.builders.sims import pipelines_plan
from tests.conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "scripts"))
from bench_live import DECODE_SEQS, SPEC, HostCosts, cpu_seconds, with_host_costs  # noqa: E402


def test_cpu_seconds_counts_this_process_work():
    before, t0 = cpu_seconds(os.getpid()), time.process_time()
    while time.process_time() - t0 < 0.3:
        pass
    assert cpu_seconds(os.getpid()) - before == pytest.approx(0.3, abs=0.05)


def test_measured_costs_reach_the_simulator_through_the_spec(tmp_path):
    # Trace run: 100 requests, 4,000 tokens, the coordinator 1.0 s, the load generator 0.6 s; the
    # same prompts with one token each: 0.3 s, 3 ms a request. Per token apart from requests:
    # (1.0 - 100 x 3 ms) / (4,000 - 100) = 179.5 us; per request 3 ms less one token's.
    costs = HostCosts(tokens=4_000, requests=100, coordinator_cpu_s=1.0, loadgen_cpu_s=0.6,
                      short_requests=100, short_coordinator_cpu_s=0.3)
    token = 0.7 / 3_900
    assert costs.token_cpu_s == pytest.approx(token)
    assert costs.request_cpu_s == pytest.approx(3e-3 - token)
    assert costs.shared_cpu_s == pytest.approx(1.6 / 4_000)
    assert HostCosts(4_000, 100, 1.0, 0.6).token_cpu_s == pytest.approx(250e-6)   # one run only
    # The idle coordinator's polls (10 ms/s over the 10 s trace run) load the workers' cores too.
    polled = HostCosts(4_000, 100, 1.0, 0.6, 100, 0.3, idle_cpu=0.01, trace_s=10.0)
    assert polled.shared_cpu_s == pytest.approx(1.7 / 4_000)
    assert polled.token_cpu_s == pytest.approx(token)
    path = with_host_costs(SPEC, costs, tmp_path / "local2-host.yaml")
    spec = load_cluster(path)
    c = spec.coordinator
    assert (c.token_cpu_s, c.request_cpu_s, c.shared_cpu_s) == (
        pytest.approx(token, abs=1e-7), pytest.approx(3e-3 - token, abs=1e-7), pytest.approx(4e-4))
    assert spec.nodes == load_cluster(SPEC).nodes   # the rest of the spec unchanged
    plan = pipelines_plan(spec, [(["cpu-0"], [8]), (["cpu-1"], [8])])
    hop = build_simulator(spec, plan, (TraceRequest(0.0, 16, 2),), SimConfig(duration_s=None)).hop
    assert (hop.token_s, hop.request_s, hop.shared_s) == (c.token_cpu_s, c.request_cpu_s,
                                                          c.shared_cpu_s)


def test_the_cpu_profiles_measure_every_decode_batch_below_four():
    # On one CPU thread a step of 2 or 3 decodes costs more than one of 4 (small-llama,
    # context 128: 1.5, 2.4, 3.0, 2.3 ms a layer for 1-4 decodes; MKL's 2- and 3-row products cost
    # 2x and 3x one row). Interpolated from 1 and 4 they were charged ~0.65x, and a local2 worker
    # at 50 % load decodes 1-3 a step: the simulated TPOT p50 came out 0.70x the live one.
    from worker.profile import ProfileGrid
    assert {1, 2, 3, 4} <= {int(s) for s in DECODE_SEQS.split(",")}
    assert {1, 2, 3, 4} <= set(ProfileGrid.default("cpu").decode_seqs)
