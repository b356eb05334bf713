"""``helix:cluster_events_total{kind}``: every kind a series at 0 from the start, and each event the
coordinator's log records counted by its kind, read from the rendered ``/metrics`` text."""

from __future__ import annotations

import threading
import time

from coordinator.events import KINDS, EventLog
from helix.server.metrics import ServingMetrics

from tests.builders.metrics import StubCoordinator, scrape, worker_stats


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


class _SlowLog(EventLog):
    """An event log whose counts take a while to come back (another scrape may read newer ones)."""

    def counts(self) -> dict[str, int]:
        out = super().counts()
        time.sleep(0.002)
        return out


class _BusyCoordinator(StubCoordinator):
    """Events recorded and preemptions counted while it is scraped; its stats too come back slowly."""

    def __init__(self) -> None:
        super().__init__()
        self.events = _SlowLog()
        self.preempted = 0

    @property
    def stats(self):
        out = {"n0": worker_stats("n0", self.preempted)}
        time.sleep(0.002)
        return out

    @stats.setter
    def stats(self, value) -> None:
        pass


def test_concurrent_scrapes_neither_fail_nor_count_twice():
    m, coord = ServingMetrics("m"), _BusyCoordinator()
    stop, failed = threading.Event(), []

    def record() -> None:
        while not stop.is_set():
            coord.events.record("failure", "cpu-2 is suspect (was ok)")
            coord.preempted += 1
            time.sleep(0.0005)

    def scraper() -> None:
        try:
            for _ in range(25):
                scrape(m, coord)
        except Exception as e:   # noqa: BLE001 - any failure of a scrape is the finding
            failed.append(repr(e))

    recorder = threading.Thread(target=record)
    recorder.start()
    scrapers = [threading.Thread(target=scraper) for _ in range(6)]
    for t in scrapers:
        t.start()
    for t in scrapers:
        t.join()
    stop.set()
    recorder.join()
    assert failed == []
    samples = scrape(m, coord)
    assert _events(m, coord)["failure"] == coord.events.counts()["failure"]
    preempted = [s.value for s in samples if s.name == "helix:num_preemptions_total"]
    assert preempted == [coord.preempted]
