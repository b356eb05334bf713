"""Pipelines whose output stopped (coordinator.stalls): pure, on made-up times."""

from __future__ import annotations

import pytest

from coordinator.stalls import StallConfig, StallWatch

A, B = ("cpu-0",), ("cpu-2", "cpu-1")


def _steady(watch: StallWatch, pipeline, start: float, gap: float, n: int) -> float:
    t = start
    for _ in range(n):
        watch.output(pipeline, t)
        t += gap
    return t - gap


def test_a_silent_pipeline_is_stalled_after_many_usual_gaps():
    watch = StallWatch(StallConfig(after_gaps=10, min_s=0.2))
    last_a = _steady(watch, A, 0.0, 0.03, 50)
    last_b = _steady(watch, B, 0.0, 0.03, 50)
    assert watch.limit_s(A) == pytest.approx(0.3)
    # Both have requests in flight since before their last output; B keeps sending.
    assert watch.stalled_nodes({A: 0.5, B: 0.5}, last_a + 0.25) == set()
    watch.output(B, last_b + 0.35)
    assert watch.stalled_nodes({A: 0.5, B: 0.5}, last_a + 0.4) == {"cpu-0"}
    watch.output(A, last_a + 0.45)                  # output resumes
    assert watch.stalled_nodes({A: 0.5, B: 0.5}, last_a + 0.46) == set()


def test_silence_counts_from_the_oldest_request_in_flight_and_never_below_the_floor():
    watch = StallWatch(StallConfig(after_gaps=10, min_s=0.5))
    last = _steady(watch, A, 0.0, 0.01, 20)          # usual gap 10 ms: the floor rules
    assert watch.limit_s(A) == pytest.approx(0.5)
    # Idle for a minute, then a request goes out: silent since it was sent, not since the last token.
    assert watch.stalled_nodes({A: last + 60.0}, last + 60.4) == set()
    assert watch.stalled_nodes({A: last + 60.0}, last + 60.6) == {"cpu-0"}
    # No pipeline in flight: nothing is stalled, however long the silence.
    assert watch.stalled_nodes({}, last + 600.0) == set()


def test_a_node_on_a_pipeline_still_sending_is_not_blamed_and_batches_leave_no_gap():
    watch = StallWatch(StallConfig(after_gaps=10, min_s=0.1))
    shared_a, shared_b = ("x", "y"), ("z", "y")
    for t in (0.0, 0.02, 0.04):
        for _ in range(5):                           # five tokens of one message: one output
            watch.output(shared_a, t)
        watch.output(shared_b, t)
    assert watch.limit_s(shared_a) == pytest.approx(0.2)   # gaps of 20 ms, not 0
    watch.output(shared_b, 1.0)
    assert watch.stalled_nodes({shared_a: 0.0, shared_b: 0.0}, 1.01) == {"x"}   # y still sends
    assert StallWatch(StallConfig(enabled=False)).stalled_nodes({shared_a: 0.0}, 99.0) == set()
    with pytest.raises(ValueError):
        StallConfig(after_gaps=1.0)


def test_a_pipeline_without_gaps_of_its_own_borrows_the_largest_other():
    watch = StallWatch(StallConfig(after_gaps=10, min_s=0.1))
    _steady(watch, A, 0.0, 0.05, 10)                 # A: 50 ms gaps
    watch.output(B, 0.3)                             # B: one message so far
    assert watch.limit_s(B) == pytest.approx(0.5)
    assert watch.stalled_nodes({B: 0.0}, 0.7) == set()
    assert watch.stalled_nodes({B: 0.0}, 0.81) == {"cpu-2", "cpu-1"}
    assert StallWatch().limit_s(A) is None           # nobody has a gap yet: no verdict
