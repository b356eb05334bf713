"""The coordinator's event log: kinds checked, the last hour kept, bounded, counted since start."""

from __future__ import annotations

import pytest

from coordinator.events import KEEP_S, KINDS, MAX_EVENTS, EventLog
from helix.core.cluster_frame import EVENT_KINDS


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
    assert [(e.time_s, e.kind) for e in log.recent()] == [(1000.0, "failure"), (1000.0 + KEEP_S / 2, "drain")]
    assert log.recent()[0].to_dict() == {"time_s": 1000.0, "kind": "failure",
                                         "detail": "cpu-2 is dead (was suspect)"}
    clock.now += KEEP_S / 2 + 1
    assert [e.kind for e in log.recent()] == ["drain"]


def test_unknown_kinds_are_refused_and_the_log_is_bounded():
    log = EventLog(Clock())
    with pytest.raises(ValueError, match="'boom'; known: failure, return"):
        log.record("boom", "x")
    for i in range(MAX_EVENTS + 5):
        log.record("reroute", str(i))
    kept = log.recent()
    assert len(kept) == MAX_EVENTS and kept[0].detail == "5"
    assert log.counts()["reroute"] == MAX_EVENTS + 5   # counted since start, not what is kept


def test_each_kind_is_counted_and_the_frame_gets_its_coarse_kind():
    assert set(KINDS.values()) == set(EVENT_KINDS)   # every frame kind has a recorder
    log = EventLog(Clock())
    assert log.counts() == dict.fromkeys(KINDS, 0)
    log.record("replan_decided", "re-plan (drift): adopted")
    log.record("replan_applied", "new plan applied in 3.0 s")
    log.record("undrain", "cpu-3 takes requests again")
    log.record("return", "cpu-2 is serving again (was dead)")
    assert [e.kind for e in log.recent()] == ["replan", "replan", "drain", "return"]
    counts = log.counts()
    assert counts["replan_decided"] == counts["replan_applied"] == counts["undrain"] == 1
    assert sum(counts.values()) == 4
