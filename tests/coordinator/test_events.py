"""The coordinator's event log: kinds checked, the last hour kept, bounded."""

from __future__ import annotations

import pytest

from coordinator.events import KEEP_S, MAX_EVENTS, EventLog


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_events_are_kept_an_hour_oldest_first():
    clock = Clock()
    log = EventLog(clock)
    log.record("failure", "cpu-2 is dead (was suspect)")
    clock.now += KEEP_S / 2
    log.record("drain", "cpu-3 drains")
    assert [(e.time, e.kind) for e in log.recent()] == [(1000.0, "failure"), (1000.0 + KEEP_S / 2, "drain")]
    assert log.recent()[0].to_dict() == {"time": 1000.0, "kind": "failure",
                                         "detail": "cpu-2 is dead (was suspect)"}
    clock.now += KEEP_S / 2 + 1
    assert [e.kind for e in log.recent()] == ["drain"]


def test_unknown_kinds_are_refused_and_the_log_is_bounded():
    log = EventLog(Clock())
    with pytest.raises(ValueError, match="'boom'; known: replan, failure"):
        log.record("boom", "x")
    for i in range(MAX_EVENTS + 5):
        log.record("replan", str(i))
    kept = log.recent()
    assert len(kept) == MAX_EVENTS and kept[0].detail == "5"
