"""One source of truth for serving limits: the plan carries the spec's dtype, batch limit, KV
high-water mark and each node's KV pool (the cost model's figure, which the simulator uses too),
and served workers run with exactly those (read back over the control plane)."""

from __future__ import annotations

import dataclasses
import os

import pytest

from coordinator.runtime import Coordinator, RuntimeConfig, WorkerHandle
from helix.core.costmodel import CostModel
from helix.core.errors import HelixUserError
from helix.net.control import WORKER_SERVICE, ControlClient
from helix.net.sampling import SamplingParams
from helix.core.plan import Plan
from helix.sim.build import build_simulator
from helix.sim.engine import SimConfig
from helix.sim.workload import TraceRequest
from helix.core.spec import load_cluster
from worker.server import WorkerServer

from tests.builders.serving import branching_plan
from tests.conftest import CLUSTER_SPECS

LOCAL3 = CLUSTER_SPECS / "local3.yaml"


def _stats_over_control(workers: dict[str, str]) -> dict[str, dict]:
    """Each worker's Stats reply, asked over its gRPC control service."""
    out = {}
    for node, address in workers.items():
        client = ControlClient(address, WORKER_SERVICE)
        try:
            out[node] = client.call("Stats")
        finally:
            client.close()
    return out


def _check_runs_with(plan: Plan, stats: dict[str, dict]) -> None:
    s = plan.serving
    for p in plan.placements:
        got = stats[p.node]
        assert got["dtype"] == s.dtype and got["max_batch_seqs"] == s.max_batch_seqs
        assert got["block_size_tokens"] == s.block_size_tokens
        assert got["step_tokens"] == s.step_tokens and got["chunked_prefill"] == (s.chunk_tokens > 0)
        assert got["kv_blocks_total"] == s.kv_capacity_tokens[p.node] // s.block_size_tokens


@pytest.fixture(scope="module")
def local3_plan() -> Plan:
    from helix.commands.demo import plan_local3
    return plan_local3(LOCAL3, time_limit_s=10)


def test_plan_carries_the_cost_models_pools_and_the_simulator_uses_them(local3_plan, tmp_path):
    spec, plan = load_cluster(LOCAL3), local3_plan
    cost = CostModel.for_cluster(spec)
    s = plan.serving
    assert (s.dtype, s.max_batch_seqs, s.kv_high_water) == ("float32", 32, spec.serving.kv_high_water)
    for p in plan.placements:
        want = cost.kv_capacity_tokens(spec.node(p.node), p.num_layers, first=p.start == 0,
                                       last=p.end == plan.num_layers)
        assert s.kv_capacity_tokens[p.node] == want > 0
    path = tmp_path / "plan.yaml"
    plan.save(path)
    assert Plan.load(path).serving == s
    sim = build_simulator(spec, plan, (TraceRequest(0.0, 8, 4),), SimConfig(duration_s=None))
    for node, w in sim.workers.items():
        assert w.policy.blocks.num_blocks == s.kv_blocks(node)
        assert w.policy.config.max_num_seqs == s.max_batch_seqs
        # The step's token budget too: chunked prefill with the spec's budget, as served.
        assert w.policy.config.max_num_batched_tokens == s.step_tokens == spec.serving.chunk_tokens
        assert w.policy.config.chunked_prefill
    assert sim.scheduler.kv.high_water == s.kv_high_water
    whole = build_simulator(spec, plan, (TraceRequest(0.0, 8, 4),),
                            SimConfig(duration_s=None, chunk_tokens=0))
    assert not any(w.policy.config.chunked_prefill for w in whole.workers.values())


def test_in_process_workers_get_the_plans_dtype_pools_and_batch_limit(tiny_model):
    ckpt, _ = tiny_model
    plan = branching_plan({"cpu-0": 1600, "cpu-1": 2400, "cpu-2": 3200}, dtype="bfloat16",
                          max_batch_seqs=7, kv_high_water=0.8, chunk_tokens=96)
    servers = [WorkerServer(p.node, str(ckpt), torch_threads=1) for p in plan.placements]
    coord = Coordinator(plan, str(ckpt), RuntimeConfig(stats_interval_s=0.1))
    try:
        coord.attach([WorkerHandle(s.node, s.control.address, s.data.address) for s in servers])
        _check_runs_with(plan, _stats_over_control({s.node: s.control.address for s in servers}))
        assert {n: st.kv_blocks_total for n, st in coord.stats.items()} == \
            {"cpu-0": 100, "cpu-1": 150, "cpu-2": 200}
        assert coord.scheduler.kv.high_water == 0.8
        # Served in bfloat16: a request goes through both pipelines' stages and finishes.
        for _ in range(2):
            h = coord.submit(coord.codec.encode("Helix serves"), SamplingParams(temperature=0, max_tokens=3))
            done = list(h.events(timeout_s=30))[-1]
            assert done.error is None and done.finish_reason in ("stop", "length")
    finally:
        coord.close()
        for s in servers:
            s.shutdown()


def test_a_plan_without_serving_limits_or_overriding_them_is_refused(tiny_model):
    ckpt, _ = tiny_model
    with pytest.raises(HelixUserError, match="no serving section .* `helix plan"):
        Coordinator(dataclasses.replace(branching_plan(), serving=None), str(ckpt))
    with pytest.raises(HelixUserError, match=r"\['num_kv_blocks'\] come from the plan"):
        Coordinator(branching_plan(), str(ckpt), RuntimeConfig(engine={"num_kv_blocks": 8}))


def test_helix_serve_refuses_a_plan_without_serving_limits_in_one_line(tiny_model, tmp_path, capsys):
    from helix.cli import main
    ckpt, _ = tiny_model
    old = tmp_path / "old-plan.yaml"
    dataclasses.replace(branching_plan(), serving=None).save(old)
    assert main(["serve", str(old), "--model", str(ckpt)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no serving section" in err[0] and "helix plan" in err[0]


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_ray_workers_of_a_planned_cluster_run_with_its_serving_limits(tiny_model, local3_plan):
    """`helix serve`'s stack on Ray, with the plan `helix plan` writes for local3."""
    ray = pytest.importorskip("ray")
    from helix.server.stack import ServeOptions, ServeStack
    ckpt, _ = tiny_model
    os.environ["RAY_AUTH_MODE"] = "disabled"
    ray.init(resources={f"helix_node:{p.node}": 1 for p in local3_plan.placements},
             include_dashboard=False, num_cpus=2, logging_level="WARNING")
    try:
        stack = ServeStack(local3_plan, str(ckpt), ServeOptions(model_name="tiny")).start()
        try:
            workers = {n: w.control_address for n, w in stack.coordinator.workers.items()}
            _check_runs_with(local3_plan, _stats_over_control(workers))
        finally:
            stack.close()
    finally:
        ray.shutdown()


def test_the_step_budget_travels_in_the_plan_and_old_plans_keep_512():
    """New specs default to 256; plans written before the field say what their workers ran (512)."""
    from helix.core.serving import ServingLimits, ServingSpec, UNCHUNKED_STEP_TOKENS
    assert ServingSpec().chunk_tokens == 256
    limits = ServingLimits.of(ServingSpec(chunk_tokens=0), "float16", {"a": 64})
    assert ServingLimits.from_dict(limits.to_dict()) == limits
    assert limits.step_tokens == UNCHUNKED_STEP_TOKENS
    old = {k: v for k, v in limits.to_dict().items() if k != "chunk_tokens"}
    assert ServingLimits.from_dict(old).chunk_tokens == 512   # what their workers ran
    with pytest.raises(Exception, match="chunk_tokens"):
        ServingLimits.from_dict({**limits.to_dict(), "chunk_tokens": -1})
