"""What ``ServingMetrics.render`` reads of a coordinator, without one, and its text parsed back."""

from __future__ import annotations

from collections import Counter

from coordinator.events import EventLog
from helix.net.stats import WorkerStats
from helix.server.metrics import ServingMetrics


def worker_stats(node: str, preemptions: int = 0) -> WorkerStats:
    """A worker's stats reply with ``preemptions`` counted since it started."""
    return WorkerStats(node, True, 0, 2, 10, 0, 16, "float32", 8, 0, 0, 0, 1, 0.0, None, None, False,
                       num_preemptions_total=preemptions)


class StubCoordinator:
    """Two nodes, one of them dead, and a real (empty) event log."""

    num_running, num_waiting, capacity_fraction = 3, 1, 0.5
    requests_moved, moved_prefill_tokens = 2, 40

    def __init__(self) -> None:
        self.restarts = Counter({"n0": 0, "n1": 1})
        self.stats = {"n0": worker_stats("n0")}
        self.events = EventLog()

    def node_states(self):
        return {"n0": "ok", "n1": "dead"}

    def kv_usage_fraction(self):
        return {"n0": 0.25, "n1": 0.0}

    def queue_limit(self):
        return 8


def scrape(metrics: ServingMetrics, coordinator) -> list:
    """``/metrics``' text for ``coordinator``, parsed: every sample."""
    from prometheus_client.parser import text_string_to_metric_families
    text = metrics.render(coordinator).decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]
