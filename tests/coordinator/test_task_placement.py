"""Placing fine-tuned tasks across the plan's pipelines: the pure policy
(:mod:`coordinator.task_placement`) and the scheduler's routing over the nodes that hold a task."""

from __future__ import annotations

import pytest

from coordinator.kv_estimator import KVEstimator
from coordinator.pipeline import RequestInfo
from coordinator.schedulers import make_scheduler
from coordinator.task_placement import Move, PlacementConfig, TaskPlacement
from helix.core.pipelines import enumerate_pipelines

from tests.builders.serving import branching_plan

# Two disjoint pipelines of equal share, and a third node set that overlaps neither.
REPLICAS = [("a0", "a1"), ("b0", "b1")]


def _placement(**config) -> TaskPlacement:
    p = TaskPlacement(REPLICAS, [1.0, 1.0], PlacementConfig(**config))
    for task in ("hot", "idle", "warm"):   # least used first, then by (tasks + 1) / share: 0, 1, 0
        p.add_task(task)
    return p


def test_new_tasks_spread_over_replicas():
    p = _placement()
    assert [p.replicas_of(t) for t in ("hot", "idle", "warm")] == [(0,), (1,), (0,)]
    assert p.nodes_of("idle") == {"b0", "b1"} and p.nodes_of(None) is None


def _load(p: TaskPlacement, now_s: float, **tokens) -> list[Move]:
    for task, n in tokens.items():
        p.record(task, n)
    assert p.due(now_s)
    return p.rebalance(now_s)


def test_hot_task_migrates_to_the_idle_replica_deterministically():
    runs = []
    for _ in range(2):
        p = _placement(min_interval_s=5, max_interval_s=40)
        assert not p.due(0.0)          # the first call starts the clock
        moves = _load(p, 10.0, hot=600, warm=400)   # replica 0: 100 tokens/s, replica 1: 0
        runs.append(moves)
        # Migrating either task evens it to 60 / 40; ties go by name: "hot" moves, whole.
        assert moves == [Move("hot", 1, 0, ("b0", "b1"), ("a0", "a1"))]
        assert p.nodes_of("hot") == {"a0", "a1"}     # nothing changes until the driver commits
        p.commit(moves[0])
        assert p.replicas_of("hot") == (1,) and p.nodes_of("hot") == {"b0", "b1"}
        assert p.utilization() == pytest.approx([40.0, 60.0])
        assert p.interval_s == 5
        # Balanced now: rounds that move nothing wait longer and longer, up to the maximum.
        assert not p.due(14.0)
        assert _load(p, 15.0, hot=300, warm=200) == []
        assert p.interval_s == 10
        assert _load(p, 25.0, hot=600, warm=400) == [] and p.interval_s == 20
        assert _load(p, 45.0, hot=1200, warm=800) == [] and p.interval_s == 40
        assert _load(p, 85.0, hot=2400, warm=1600) == [] and p.interval_s == 40
    assert runs[0] == runs[1]


def test_a_task_too_hot_for_one_replica_is_replicated():
    p = _placement()
    p.due(0.0)
    moves = _load(p, 10.0, hot=1000, idle=10)
    # Moving "hot" whole would only swap the busy replica; a second replica halves its load.
    assert moves == [Move("hot", 1, None, ("b0", "b1"), ())]
    p.commit(moves[0])
    assert p.replicas_of("hot") == (0, 1) and p.nodes_of("hot") == {"a0", "a1", "b0", "b1"}


def test_a_failed_move_leaves_the_task_and_is_decided_again():
    p = _placement()
    p.due(0.0)
    (move,) = _load(p, 10.0, hot=600, warm=400)
    # Pending: counted as made (60 / 40), so nothing moves, and "hot" is not moved twice.
    assert _load(p, 20.0, hot=600, warm=400) == []
    p.abort(move)
    assert p.replicas_of("hot") == (0,)
    again = _load(p, 40.0, hot=1200, warm=800)
    assert [m.task for m in again] == ["hot"]


def test_scheduler_routes_a_task_only_over_nodes_that_hold_it():
    plan = branching_plan()
    pipes = enumerate_pipelines(plan)
    assert [p.nodes for p in pipes] == [("cpu-0", "cpu-1"), ("cpu-0", "cpu-2")]
    placement = TaskPlacement([p.nodes for p in pipes], [p.share for p in pipes])
    # No load yet: tasks go in proportion to the shares (2/3, 1/3), ties to the first replica.
    assert [placement.add_task(t) for t in ("t0", "t2", "t1")] == [
        {"cpu-0", "cpu-1"}, {"cpu-0", "cpu-1"}, {"cpu-0", "cpu-2"}]
    assert placement.nodes_of("t1") == {"cpu-0", "cpu-2"}
    kv = KVEstimator({p.node: 10**9 for p in plan.placements}, high_water=0.9)
    sched = make_scheduler("helix", plan, kv)
    got: dict = {}
    for i in range(60):
        task = (None, "t0", "t1")[i % 3]
        pipeline = sched.schedule(RequestInfo(i, 10, 10), placement.nodes_of(task))
        got.setdefault(task, set()).add(pipeline.nodes)
    assert got == {None: {("cpu-0", "cpu-1"), ("cpu-0", "cpu-2")}, "t0": {("cpu-0", "cpu-1")},
                   "t1": {("cpu-0", "cpu-2")}}
    # The only pipeline holding the task full: its requests wait, though cpu-1 has room.
    kv.observe("cpu-2", 2 * 10**9)
    assert sched.schedule(RequestInfo(99, 10, 10), placement.nodes_of("t1")) is None
    assert sched.schedule(RequestInfo(100, 10, 10), placement.nodes_of("t0")).nodes == ("cpu-0", "cpu-1")


def test_tasks_follow_a_new_plan():
    p = _placement()
    p.due(0.0)
    (move,) = _load(p, 10.0, hot=1000, idle=10)    # "hot" replicated on both
    p.commit(move)
    # The new plan: a0 joins b's pipeline, a1 leaves; a new small pipeline of c0 alone.
    held = {"hot": frozenset({"a0", "a1", "b0", "b1"}), "idle": frozenset({"b0", "b1"}),
            "warm": frozenset({"a0", "a1"})}
    new, moves = TaskPlacement.follow(p, [("a0", "b1"), ("b0", "b1"), ("c0",)], [2, 1, 1], held)
    assert new.replicas_of("hot") == (0, 1) and new.replicas_of("idle") == (1,)
    # "warm" is held whole by no new pipeline: no route until it is loaded where fewest nodes lack
    # it (a0 -> b1: one node; the others lack two and one, the bigger share first).
    assert new.replicas_of("warm") == () and new.nodes_of("warm") == frozenset()
    assert moves == [Move("warm", 0, None, ("b1",), ())]
    assert new.rate("hot") == p.rate("hot") and new.interval_s == p.interval_s
    assert all(m.task != "warm" for m in new.rebalance(30.0))   # pending: not moved again
    new.commit(moves[0])
    assert new.nodes_of("warm") == {"a0", "b1"}
