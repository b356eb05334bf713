"""``helix:cluster_events_total{kind}``: every kind a series at 0 from the start, and each event the
coordinator's log records counted by its kind, read from the rendered ``/metrics`` text."""

from __future__ import annotations

from coordinator.events import KINDS
from helix.server.metrics import ServingMetrics

from tests.builders.metrics import StubCoordinator, scrape


def _events(metrics: ServingMetrics, coordinator) -> dict[str, float]:
    return {s.labels["kind"]: s.value for s in scrape(metrics, coordinator)
            if s.name == "helix:cluster_events_total" and s.labels["model_name"] == "m"}


def test_every_kind_starts_at_zero():
    assert _events(ServingMetrics("m"), StubCoordinator()) == dict.fromkeys(KINDS, 0.0)


def test_a_recorded_event_counts_once_under_its_kind():
    m, coord = ServingMetrics("m"), StubCoordinator()
    coord.events.record("replan_decided", "re-plan (drift): adopted")
    coord.events.record("replan_applied", "new plan applied in 3.0 s")
    coord.events.record("failure", "cpu-2 is suspect (was ok)")
    coord.events.record("failure", "cpu-2 is dead (was suspect)")
    first = _events(m, coord)
    assert first == {**dict.fromkeys(KINDS, 0.0), "replan_decided": 1.0, "replan_applied": 1.0,
                     "failure": 2.0}
    assert _events(m, coord) == first   # a second scrape adds nothing
    coord.events.record("restart", "cpu-2: a new worker process registered")
    coord.events.record("return", "cpu-2 is serving again (was dead)")
    assert _events(m, coord) == {**first, "restart": 1.0, "return": 1.0}
