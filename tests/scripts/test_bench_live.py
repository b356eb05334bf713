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
from helix.spec import load_cluster
from tests.builders.sims import pipelines_plan
from tests.conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "scripts"))
from bench_live import SPEC, HostCosts, cpu_seconds, with_host_costs  # noqa: E402


def test_cpu_seconds_counts_this_process_work():
    before, t0 = cpu_seconds(os.getpid()), time.process_time()
    while time.process_time() - t0 < 0.3:
        pass
    assert cpu_seconds(os.getpid()) - before == pytest.approx(0.3, abs=0.05)


def test_measured_costs_reach_the_simulator_through_the_spec(tmp_path):
    costs = HostCosts(tokens=4_000, coordinator_cpu_s=1.0, loadgen_cpu_s=0.6)
    assert (costs.token_cpu_s, costs.shared_cpu_s) == (pytest.approx(250e-6), pytest.approx(400e-6))
    path = with_host_costs(SPEC, costs, tmp_path / "local2-host.yaml")
    spec = load_cluster(path)
    assert spec.coordinator.token_cpu_s == pytest.approx(250e-6)
    assert spec.coordinator.shared_cpu_s == pytest.approx(400e-6)
    assert spec.nodes == load_cluster(SPEC).nodes   # the rest of the spec unchanged
    plan = pipelines_plan(spec, [(["cpu-0"], [8]), (["cpu-1"], [8])])
    hop = build_simulator(spec, plan, (TraceRequest(0.0, 16, 2),), SimConfig(duration_s=None)).hop
    assert (hop.token_s, hop.shared_s) == (pytest.approx(250e-6), pytest.approx(400e-6))
