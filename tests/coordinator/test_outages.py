"""The pure pieces of outage handling: since when a node is down and how long it took to come back
(coordinator.health), the share of the plan's capacity a set of nodes serves (coordinator.capacity)
and the waiting queue's bound sized from the restart time (coordinator.admission)."""

from __future__ import annotations

import pytest

from coordinator.admission import WaitingBound
from coordinator.capacity import Capacity
from coordinator.health import HealthConfig, NodeHealth, NodeState

from tests.builders.serving import branching_plan, with_capacities


def test_a_node_is_down_from_suspect_to_ok_and_says_for_how_long():
    health = NodeHealth(["a", "b"], HealthConfig(suspect_after_s=1, dead_after_s=3), now_s=0.0)
    health.answered("b", 1.5)
    assert health.update(1.5)[0].new is NodeState.SUSPECT and health.down_since("a") == 1.5
    health.answered("b", 3.5)
    assert health.update(3.5)[0].new is NodeState.DEAD and health.down_since("a") == 1.5
    health.answered("a", 10.0)
    health.answered("b", 10.0)
    (back,) = health.update(10.0)
    assert back.new is NodeState.OK and back.down_s == 8.5 and health.down_since("a") is None
    assert health.declare_dead("b", 11.0).new is NodeState.DEAD and health.down_since("b") == 11.0


def test_capacity_is_the_max_flow_the_serving_nodes_keep():
    plan = with_capacities(branching_plan())   # cpu-1 may carry 250 where the plan sends it 200
    cap = Capacity(plan)
    assert cap.full_tokens_per_s == 300
    assert cap.fraction({"cpu-0", "cpu-1", "cpu-2"}) == 1.0
    assert cap.fraction({"cpu-0", "cpu-1"}) == pytest.approx(250 / 300)   # cpu-1 takes up slack
    assert cap.fraction({"cpu-0", "cpu-2"}) == pytest.approx(150 / 300)
    assert cap.fraction({"cpu-1", "cpu-2"}) == 0.0                       # nobody holds layer 0


def test_capacity_without_the_flow_graph_counts_whole_pipelines_by_share():
    cap = Capacity(branching_plan())   # pipelines cpu-0 -> cpu-1 (2/3), cpu-0 -> cpu-2 (1/3)
    assert cap.fraction({"cpu-0", "cpu-1"}) == pytest.approx(2 / 3)
    assert cap.fraction({"cpu-0", "cpu-2"}) == pytest.approx(1 / 3)
    assert cap.tokens_per_s({"cpu-0"}) == 0.0


def _steady(bound: WaitingBound, seconds: int, per_s: int, fraction: float = 1.0, t0: float = 0.0):
    for t in range(seconds):
        bound.serving(t0 + t, fraction)
        for i in range(per_s):
            bound.completed(t0 + t + i / per_s)


def test_the_queue_holds_what_the_capacity_left_serves_in_a_restart():
    bound = WaitingBound(floor=8, restart_s=10.0, window_s=30.0)
    assert bound.limit(0.0, 1.0) == 8 and bound.retry_after_s(0.0, 1.0, 100) == 1   # nothing measured
    _steady(bound, 40, per_s=20)
    assert bound.wait_s == 15.0
    assert bound.rate_per_s(40.0, 1.0) == pytest.approx(20, rel=0.02)
    assert bound.limit(40.0, 1.0) == pytest.approx(300, rel=0.02)
    # The biggest node dies: a third of the capacity serves, so a third as many may wait...
    bound.serving(40.0, 1 / 3)
    assert bound.limit(40.0, 1 / 3) == pytest.approx(100, rel=0.02)
    # ...and a refused client is told when the queue will be under its bound again.
    assert bound.retry_after_s(40.0, 1 / 3, 100 + 20) == pytest.approx(3, abs=1)
    assert bound.retry_after_s(40.0, 1 / 3, 10_000) == 15   # never more than the wait bound
    # Completions at the reduced capacity count against the reduced capacity: the rate per unit
    # of capacity holds, 30 s later the measure is all of the degraded period.
    _steady(bound, 30, per_s=7, fraction=1 / 3, t0=40.0)
    assert bound.rate_per_s(70.0, 1.0) == pytest.approx(21, rel=0.05)


def test_the_wait_follows_measured_restarts_and_a_fixed_size_wins():
    bound = WaitingBound(floor=1, restart_s=10.0)
    bound.restarted(4.0)
    bound.restarted(4.0)
    assert bound.restart_s == pytest.approx(5.5) and bound.wait_s == pytest.approx(8.25)
    assert WaitingBound(floor=1, wait_s=2.0).wait_s == 2.0
    fixed = WaitingBound(fixed=3, default_retry_s=1)
    _steady(fixed, 10, per_s=50)
    assert fixed.limit(10.0, 0.1) == 3 and fixed.retry_after_s(10.0, 0.1, 500) == 1
    # A queue whose oldest new request waited past the bound refuses more, whatever the rate says.
    assert bound.overdue(8.3) and not bound.overdue(8.0) and not fixed.overdue(1e9)
