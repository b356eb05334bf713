"""The incremental decision path makes exactly the decisions of the whole-graph one it replaced
(reference_scheduler.py): a seeded random replay of schedule / release / observe / direct reserve /
hop-delay calls on 42-node plans, every scheduler, compared call by call."""

from __future__ import annotations

import pytest

from coordinator.schedulers import SCHEDULERS
from tests.coordinator.replay import hetero42_plan, random_plan, replay


@pytest.mark.parametrize("name", SCHEDULERS)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_42_node_plans_decide_as_before(name, seed):
    admitted = replay(random_plan(seed), name, seed)
    assert admitted > 100   # the replay exercised admissions, not only masking


def test_hetero42_plan_decides_as_before():
    plan = hetero42_plan()
    assert len(plan.placements) == 42
    for name in SCHEDULERS:
        assert replay(plan, name, seed=7, steps=2000) > 100
