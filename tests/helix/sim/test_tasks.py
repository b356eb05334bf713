"""Many fine-tuned tasks in the simulator: the adapter terms each step pays (against a
step computed by hand), the per-task workload mix, and task placement driven by the coordinator's
policy."""

from __future__ import annotations

import pytest

from helix.core.costmodel import AdapterShape, adapter_layer_time_s
from helix.core.errors import HelixUserError
from helix.core.hardware import lookup_gpu
from helix.core.models import resolve_model
from helix.sim.build import build_simulator
from helix.sim.engine import SimConfig
from helix.sim.request import SimRequest
from helix.sim.tasks import TaskMix, assign_tasks
from helix.sim.worker import SimWorker
from helix.sim.workload import TraceRequest
from worker.step_policy import PolicyConfig


def test_adapter_term_of_a_layer_by_hand():
    """LLaMA-2 7B in float16 on one A100-40G, LoRA rank 16 on q_proj (4096 -> 4096) and down_proj
    (11008 -> 4096), a step with two task groups of 10 rows and 1 row. Every GEMM is far below the
    ridge, so each (group, target) costs its bytes at 1555 GB/s x 0.83 plus 3 launches of 5 us:
      q,    10 rows: A, B 16 x 8192 x 2 = 262,144 B + 10 x (4096 + 2 x 4096 + 2 x 16) x 2 = 246,400
      q,     1 row:  262,144 + 24,640
      down, 10 rows: 16 x 15104 x 2 = 483,328 + 10 x (11008 + 2 x 4096 + 32) x 2 = 384,640
      down,  1 row:  483,328 + 38,464
    """
    nbytes = 262_144 + 246_400 + 262_144 + 24_640 + 483_328 + 384_640 + 483_328 + 38_464
    expected = nbytes / (1555e9 * 0.83) + 4 * 3 * 5e-6
    model, a100 = resolve_model("llama-2-7b"), lookup_gpu("A100-40G")
    shape = AdapterShape(16, ("q_proj", "down_proj"))
    assert adapter_layer_time_s(model, a100, 1, 2, [10, 1], shape) == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(61.693e-6, rel=1e-4)
    # Rank 16 never reaches the ridge (~2 r FLOPs per 2 bytes moved): even 4,096 rows cost bytes.
    rows = 4096
    assert 2 * rows * 16 * 8192 / (312e12 * 0.78) < (262_144 + rows * 12_320 * 2) / (1555e9 * 0.83)
    assert adapter_layer_time_s(model, a100, 1, 2, [rows], AdapterShape(16, ("q_proj",))) == \
        pytest.approx((262_144 + rows * 12_320 * 2) / (1555e9 * 0.83) + 15e-6)
    # Two GPUs, tensor parallel: the term's work splits, its launches do not.
    assert adapter_layer_time_s(model, a100, 2, 2, [10, 1], shape) == \
        pytest.approx(nbytes / (2 * 1555e9 * 0.83) + 4 * 3 * 5e-6)
    assert adapter_layer_time_s(model, a100, 1, 2, [], shape) == 0.0


def test_worker_charges_each_task_group_of_a_step():
    groups = []

    def adapter_time(rows):
        groups.append(sorted(rows))
        return 1e-3 * len(rows)
    w = SimWorker("n", 0, 4, 10_000, lambda p, d, dc, pc: 1e-3 * p,
                  PolicyConfig(max_num_batched_tokens=512, self_feeding=False), adapter_time=adapter_time)
    for rid, (prompt, task) in enumerate([(4, "a"), (3, "a"), (2, "b"), (5, None)]):
        w.admit(SimRequest(rid, 0.0, prompt, 2, task), 0, 0, prompt)
    plan = w.policy.schedule()
    # 14 prompt tokens over 4 layers, plus two task groups (a: 7 rows, b: 2); the base model's 5 rows
    # pay nothing.
    assert w.step_time_s(plan) == pytest.approx(4 * 14e-3 + 2e-3)
    assert groups == [[2, 7]]


def test_task_mix_assigns_tasks_deterministically():
    work = tuple(TraceRequest(0.0, 10, 10) for _ in range(4000))
    mix = TaskMix(64, "zipf:1.1", base_fraction=0.25)
    a, b = assign_tasks(work, mix, seed=3), assign_tasks(work, mix, seed=3)
    assert a == b
    names = [r.task for r in a]
    assert 0.22 < names.count(None) / len(names) < 0.28
    assert names.count("task-0") > names.count("task-1") > names.count("task-9") > 0
    assert len(set(names)) == 65
    assert assign_tasks((TraceRequest(0.0, 1, 1, "mine"),), mix)[0].task == "mine"
    for bad in (dict(num_tasks=0), dict(num_tasks=4, skew="zipf:x"), dict(num_tasks=4, skew="pareto"),
                dict(num_tasks=4, replicas=0)):
        with pytest.raises(HelixUserError):
            TaskMix(**bad)


@pytest.fixture(scope="module")
def single24():
    from helix.sim.workload import load_azure_trace, resolve_trace
    from helix.core.spec import load_cluster
    from tests.builders.sims import single24_plan
    spec = load_cluster("cluster_specs/single24.yaml")
    return spec, single24_plan(spec), load_azure_trace(resolve_trace("conv"))[:1500]


def _run(single24, tasks, routes: list | None = None):
    """(simulator, result); ``routes`` gets, for each task request started, whether every stage of
    its pipeline held the task then."""
    spec, plan, work = single24
    sim = build_simulator(spec, plan, work, SimConfig(duration_s=60, tasks=tasks))
    if routes is not None:
        start = sim._start

        def checked(now_s, req, pipeline):
            if req.task is not None:
                routes.append(set(pipeline.nodes) <= sim.placement.nodes_of(req.task))
            return start(now_s, req, pipeline)
        sim._start = checked
    return sim, sim.run()


def test_64_tasks_cost_throughput_and_placement_runs_the_same_policy(single24):
    _, base = _run(single24, None)
    _, everywhere = _run(single24, TaskMix(64))
    routes: list[bool] = []
    sim, placed = _run(single24, TaskMix(64, "zipf:1.1", replicas=1), routes)
    assert everywhere.decode_throughput_tokens_per_s < 0.9 * base.decode_throughput_tokens_per_s
    assert placed.decode_throughput_tokens_per_s < base.decode_throughput_tokens_per_s
    # Tasks sit on one of the plan's two pipelines; the first move is one of the hottest tasks
    # (zipf: the first few), onto the other pipeline.
    placement = sim.placement
    assert len(placement.replicas) == 2 and placement.rounds >= 1
    first = sim.task_moves[0]
    assert first[1] in {f"task-{k}" for k in range(4)} and first[2] != first[3]
    # Every request of a task ran on a pipeline whose every stage held the task.
    assert len(routes) > 50 and all(routes)
    again, placed_again = _run(single24, TaskMix(64, "zipf:1.1", replicas=1))
    assert again.task_moves == sim.task_moves
    assert placed_again.decode_throughput_tokens_per_s == placed.decode_throughput_tokens_per_s


def test_simulate_cli_runs_tasks_and_refuses_bad_options(tmp_path, capsys):
    from helix.cli import main
    from helix.core.spec import load_cluster
    from tests.builders.sims import single24_plan
    spec_path = "cluster_specs/single24.yaml"
    plan_file = tmp_path / "plan.yaml"
    single24_plan(load_cluster(spec_path)).save(plan_file)
    run = ["simulate", spec_path, "--plan", str(plan_file), "--duration", "10"]
    assert main([*run, "--tasks", "8", "--task-skew", "zipf:1.1", "--task-replicas", "1"]) == 0
    assert "8 tasks (zipf:1.1, LoRA rank 16): placed on 2 pipelines" in capsys.readouterr().out
    for args, message in ((["--tasks", "8", "--task-skew", "zipf"], "--task-skew 'zipf': expected"),
                          (["--tasks", "8", "--task-rank", "0"], "--task-rank must be >= 1, got 0"),
                          (["--tasks", "8", "--task-replicas", "0"], "--task-replicas must be >= 1"),
                          (["--task-replicas", "2"], "need --tasks N")):
        assert main([*run, *args]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err
