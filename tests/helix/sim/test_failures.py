"""The simulator's node failures (``SimConfig.failures``), as the live coordinator handles them: a node
goes down, is declared dead ``detect_s`` later, its requests move to another pipeline, it may come
back and get requests again. Nothing is lost and every token counts once."""

import dataclasses

import pytest

from helix.core.plan import COORDINATOR
from helix.sim.engine import NodeFailure, SimConfig
from tests.builders.plans import make_plan
from tests.builders.sims import burst, make_sim


def two_pipelines():
    """coordinator -> A [0,2) -> B [2,4) -> coordinator, and the same through C and D."""
    return make_plan(4, {"A": (0, 2), "B": (2, 4), "C": (0, 2), "D": (2, 4)},
                     {(COORDINATOR, "A"): 1.0, ("A", "B"): 1.0, ("B", COORDINATOR): 1.0,
                      (COORDINATOR, "C"): 1.0, ("C", "D"): 1.0, ("D", COORDINATOR): 1.0})


def _run(failures=(), n=40, scheduler="helix", mode="offline", gap_s=0.0):
    workload = burst(n, 20, 30, gap_s)
    sim = make_sim(two_pipelines(), workload, SimConfig(mode=mode, duration_s=None, failures=failures),
                   scheduler=scheduler)
    return sim, sim.run(), workload


def _conserved(r, workload):
    assert r.requests_completed == len(workload) and r.requests_unfinished == 0
    assert r.requests_rejected == 0
    assert r.tokens_generated == sum(q.output_tokens for q in workload)   # each token once
    assert r.tokens_generated_completed == r.tokens_requested_completed


def test_a_dead_node_moves_its_requests_and_nothing_is_lost():
    _, healthy, workload = _run()
    sim, r, _ = _run((NodeFailure("B", at_s=2.0, detect_s=0.3),))
    _conserved(r, workload)
    assert r.requests_moved >= 1 and r.moved_prefill_tokens >= 20 * r.requests_moved
    b = sim.workers["B"]
    assert b.down and b.busy_s < 2.0 + 1e-9           # B worked until it died, never after
    assert r.duration_s > healthy.duration_s           # one pipeline left: the work takes longer
    assert max(r.samples["itl_s"]) >= 0.3              # the moved requests paused


def test_a_node_that_comes_back_gets_requests_again():
    failure = NodeFailure("B", at_s=1.0, down_for_s=1.0, detect_s=0.3)
    sim, r, workload = _run((failure,), n=80, mode="online", gap_s=0.1)   # arrivals for 8 s
    _conserved(r, workload)
    assert r.requests_moved >= 1
    b = sim.workers["B"]
    never_back, _, _ = _run((dataclasses.replace(failure, down_for_s=None),), n=80, mode="online",
                            gap_s=0.1)
    assert not b.down and b.busy_s > never_back.workers["B"].busy_s + 1.0   # it worked again


def test_failures_are_deterministic_and_checked():
    runs = [_run((NodeFailure("D", at_s=1.5, detect_s=0.5),))[1] for _ in range(2)]
    assert dataclasses.replace(runs[0], wall_s=0, samples={}) == dataclasses.replace(runs[1], wall_s=0,
                                                                                      samples={})
    with pytest.raises(ValueError, match="unknown node"):
        _run((NodeFailure("Z", at_s=1.0),))
    with pytest.raises(ValueError):
        NodeFailure("A", at_s=-1)


def test_every_first_stage_down_leaves_requests_waiting_without_error():
    workload = burst(10, 20, 30)
    sim = make_sim(two_pipelines(), workload, SimConfig(
        duration_s=30.0, failures=(NodeFailure("A", 1.0), NodeFailure("C", 1.0))))
    r = sim.run()
    assert r.requests_completed < len(workload)
    assert r.requests_arrived == r.requests_completed + r.requests_unfinished + r.requests_rejected


def test_a_node_back_before_anyone_noticed_still_loses_nothing():
    """Down for 1 s, detection after 5 s: the empty node answers first, which is when its requests
    move (as a restarted worker's registration moves them live); the late detection changes nothing."""
    failure = NodeFailure("B", at_s=1.0, down_for_s=1.0, detect_s=5.0)
    sim, r, workload = _run((failure,), n=80, mode="online", gap_s=0.1)
    _conserved(r, workload)
    assert r.requests_moved >= 1 and not sim.active


def test_two_outages_of_one_node_lose_nothing():
    """The first outage's detection is due during the second outage; every request still ends,
    each token counted once."""
    early = NodeFailure("B", at_s=1.0, down_for_s=0.5, detect_s=3.0)    # back at 1.5, detected "at 4"
    late = NodeFailure("B", at_s=3.5, detect_s=2.0)                      # down again at 3.5 for good
    sim, r, workload = _run((early, late), n=80, mode="online", gap_s=0.1)
    _conserved(r, workload)
