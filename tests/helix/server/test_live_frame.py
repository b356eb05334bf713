"""How :class:`helix.server.live.ClusterView` turns the coordinator's state into a frame, over a
stand-in coordinator and a given clock: states renamed, rates from counter differences (none in the
first frame, none across a restart), bytes between regions, nothing made up for a silent node.
The real stack in a browser: test_dashboard.py."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pytest

pytest.importorskip("fastapi")

from coordinator.drain import NodeStatus
from coordinator.events import EventLog
from helix.core.spec import parse_cluster
from helix.net.stats import WorkerStats
from helix.server.live import RATE_S, ClusterView, RecentLatencies
from planner.live_view import check_frame

from tests.builders.serving import branching_plan


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def stats(node: str, steps: int = 0, step_s: float = 0.0, used: int = 2, sent=None) -> WorkerStats:
    return WorkerStats(node=node, configured=True, start=0, end=4, kv_blocks_total=64, kv_blocks_used=used,
                       block_size_tokens=16, dtype="float32", max_batch_seqs=8, num_waiting=0,
                       num_running=1, num_requests=1, steps_total=steps, step_time_s_avg=0.01,
                       last_step_unix_s=None, last_error=None, draining=False,
                       step_time_s_total=step_s, bytes_sent_to=sent or {})


class Data:
    def __init__(self) -> None:
        self.sent: dict[str, int] = {}

    def bytes_sent_to(self) -> dict[str, int]:
        return dict(self.sent)


class Coordinator:
    """What ClusterView reads of a coordinator, set by hand."""

    def __init__(self, clock) -> None:
        self.plan = branching_plan()
        self.stats = {n: stats(n) for n in ("cpu-0", "cpu-1", "cpu-2")}
        self.states = {"cpu-0": "ok", "cpu-1": "ok", "cpu-2": "ok"}
        self.tokens: dict[tuple[str, ...], int] = {}
        self.in_flight: Counter = Counter()
        self.data = Data()
        self.events = EventLog(clock)

    def nodes_status(self) -> list[NodeStatus]:
        return [NodeStatus(p.node, self.states[p.node], p.start, p.end, self.in_flight[("cpu-0", p.node)],
                           None, 0, None) for p in self.plan.placements]

    def pipeline_tokens(self):
        return dict(self.tokens)

    def requests_by_pipeline(self):
        return Counter(self.in_flight)


SPEC = {"model": "tiny-llama", "dtype": "float32", "coordinator": {"region": "us"},
        "regions": {"us": {"bandwidth": "1GB/s"}, "eu": {"bandwidth": "1GB/s"}},
        "inter_region": {"bandwidth": "80Mbps"},
        "nodes": [{"name": "cpu-0", "gpu": "CPU", "memory": "3000KiB", "region": "us"},
                  {"name": "cpu-1", "gpu": "CPU", "memory": "1500KiB", "region": "us"},
                  {"name": "cpu-2", "gpu": "CPU", "memory": "1500KiB", "region": "eu"}]}


def view(spec=None):
    clock = Clock()
    coord = Coordinator(clock)
    return ClusterView(coord, "tiny", RecentLatencies(clock), spec, clock=clock), coord, clock


def test_the_first_frame_knows_no_rate_and_without_a_spec_no_place():
    v, coord, _ = view()
    f = v.frame()
    assert check_frame(f) == []
    assert [(n["name"], n["gpu"], n["region"], n["state"]) for n in f["nodes"]] == [
        ("cpu-0", "unknown", "unknown", "serving"), ("cpu-1", "unknown", "unknown", "serving"),
        ("cpu-2", "unknown", "unknown", "serving")]
    assert all(n["steps_per_s"] is None and n["busy"] is None for n in f["nodes"])
    assert f["nodes"][0]["kv_used_tokens"] == 32 and f["nodes"][0]["kv_capacity_tokens"] == 1024
    assert [p["id"] for p in f["pipelines"]] == ["cpu-0>cpu-1", "cpu-0>cpu-2"]
    assert all(p["decode_tokens_per_s"] is None for p in f["pipelines"])
    assert f["links"] == []
    assert f["cluster"] == {"requests_per_s": 0.0, "ttft_p50_s": None, "ttft_p99_s": None, "tpot_p50_s": None,
                            "tpot_p99_s": None, "window_s": 60}


def test_rates_come_from_counter_differences_and_a_restart_or_silence_has_none():
    v, coord, clock = view()
    v.frame()
    clock.now += 2.0
    coord.stats["cpu-0"] = stats("cpu-0", steps=40, step_s=0.5)
    coord.stats["cpu-1"] = stats("cpu-1", steps=10, step_s=0.1)
    coord.tokens = {("cpu-0", "cpu-1"): 100}
    coord.in_flight = Counter({("cpu-0", "cpu-1"): 3})
    coord.states.update({"cpu-1": "drained", "cpu-2": "dead"})
    v.latencies.first_token(0.2)
    v.latencies.next_token(0.05)
    v.latencies.finished()
    f = v.frame()
    assert check_frame(f) == []
    n0, n1, n2 = f["nodes"]
    assert (n0["steps_per_s"], n0["busy"]) == (20.0, 0.25)
    assert (n1["state"], n1["steps_per_s"]) == ("draining", 5.0)
    assert (n2["state"], n2["steps_per_s"], n2["busy"], n2["kv_used_tokens"]) == ("dead", None, None, None)
    assert n2["kv_capacity_tokens"] == 1024   # the pool is still known
    assert [(p["in_flight"], p["decode_tokens_per_s"]) for p in f["pipelines"]] == [(3, 50.0), (0, 0.0)]
    assert f["cluster"]["ttft_p50_s"] == 0.2 and f["cluster"]["requests_per_s"] == 0.5
    clock.now += 2.0
    coord.stats["cpu-0"] = stats("cpu-0", steps=4)   # a new process: its counters began again
    assert v.frame()["nodes"][0]["steps_per_s"] is None


def test_links_between_regions_carry_the_bytes_sent_across_them():
    v, coord, clock = view(parse_cluster(SPEC))
    f = v.frame()
    assert [(n["gpu"], n["region"]) for n in f["nodes"]] == [("CPU", "us"), ("CPU", "us"), ("CPU", "eu")]
    assert [(k["from_region"], k["to_region"], k["bytes_per_s"]) for k in f["links"]] == [
        ("us", "eu", None), ("eu", "us", None)]
    clock.now += 2.0
    coord.stats["cpu-0"] = stats("cpu-0", sent={"cpu-2": 4000, "cpu-1": 10**6})
    coord.stats["cpu-2"] = stats("cpu-2", sent={"coordinator": 1000})
    coord.data.sent = {"cpu-0": 500}   # coordinator (us) -> cpu-0 (us): inside a region
    links = {(k["from_region"], k["to_region"]): k for k in v.frame()["links"]}
    assert links["us", "eu"]["bytes_per_s"] == 2000.0 and links["eu", "us"]["bytes_per_s"] == 500.0
    assert links["us", "eu"]["bandwidth_bytes_per_s"] == 10e6
    assert links["us", "eu"]["node_pairs"] == links["eu", "us"]["node_pairs"] == 1


def test_a_link_between_regions_counts_the_node_pairs_the_plan_joins_or_that_sent_across_it():
    v, coord, clock = view(parse_cluster(SPEC))
    f = v.frame()   # the plan's: cpu-0 -> cpu-2 one way, cpu-2 -> the coordinator back
    assert [(k["from_region"], k["to_region"], k["node_pairs"]) for k in f["links"]] == [
        ("us", "eu", 1), ("eu", "us", 1)]
    clock.now += 2.0
    coord.stats["cpu-0"] = stats("cpu-0", sent={"cpu-2": 4000})
    coord.stats["cpu-1"] = stats("cpu-1", sent={"cpu-2": 8000})   # off the plan: a moved request
    links = {(k["from_region"], k["to_region"]): k for k in v.frame()["links"]}
    # Two node pairs, two links: 6 kB/s against twice one link's bandwidth.
    assert (links["us", "eu"]["bytes_per_s"], links["us", "eu"]["node_pairs"]) == (6000.0, 2)


def test_events_reach_the_frame():
    v, coord, _ = view()
    coord.events.record("failure", "cpu-2 is dead (was suspect)")
    assert v.frame()["events"] == [{"time_s": 1000.0, "kind": "failure",
                                    "detail": "cpu-2 is dead (was suspect)"}]


def test_a_frame_right_after_another_has_no_rate_rather_than_a_wild_one():
    v, coord, clock = view()
    v.frame()
    clock.now += 1e-3
    coord.stats["cpu-0"] = stats("cpu-0", steps=1)
    assert all(n["steps_per_s"] is None for n in v.frame()["nodes"])


def test_after_a_gap_in_polling_the_first_frame_has_no_rate_rather_than_the_gaps_average():
    v, coord, clock = view()
    v.frame()                        # polled once...
    clock.now += 3600.0              # ...then nobody watched for an hour
    coord.stats["cpu-0"] = stats("cpu-0", steps=36000, step_s=1800.0)
    coord.tokens = {("cpu-0", "cpu-1"): 360000}
    f = v.frame()
    assert f["nodes"][0]["steps_per_s"] is None and f["nodes"][0]["busy"] is None
    assert all(p["decode_tokens_per_s"] is None for p in f["pipelines"])
    clock.now += RATE_S              # the next frame's rate is over the last RATE_S only
    coord.stats["cpu-0"] = stats("cpu-0", steps=36010, step_s=1801.0)
    assert v.frame()["nodes"][0]["steps_per_s"] == 5.0


@dataclass
class _Join:
    node: str
    state: str


class _Elastic:
    """What ClusterView reads of ``server.elastic.Elastic``: its joins by node."""

    def __init__(self, *joins: _Join) -> None:
        self.joins = {j.node: j for j in joins}


def test_a_registered_node_without_layers_is_joining_whether_its_replan_runs_or_kept_the_placement():
    v, coord, _ = view(parse_cluster(SPEC))
    v.elastic = _Elastic(_Join("gpu-a", "planning"), _Join("gpu-b", "idle"), _Join("gpu-c", "failed"),
                         _Join("cpu-1", "serving"))
    f = v.frame()
    assert check_frame(f) == []
    rows = {n["name"]: n for n in f["nodes"]}
    assert sorted(rows) == ["cpu-0", "cpu-1", "cpu-2", "gpu-a", "gpu-b"]   # a failed join has no worker
    assert rows["cpu-1"]["state"] == "serving"
    for name in ("gpu-a", "gpu-b"):
        assert (rows[name]["state"], rows[name]["layers"], rows[name]["region"]) == ("joining", None,
                                                                                     "unknown")


def test_latency_percentiles_sort_each_window_once_and_outside_the_lock_tokens_take(monkeypatch):
    import planner.live_view

    clock = Clock()
    lat = RecentLatencies(clock)
    for i in range(1000):
        lat.first_token(i / 1000)
        lat.next_token(i / 10_000)
    held: list[bool] = []

    def spy(values, *args, **kwargs):
        held.append(lat._lock.locked())
        return sorted(values, *args, **kwargs)

    monkeypatch.setattr(planner.live_view, "sorted", spy, raising=False)
    c = lat.cluster(clock())
    assert held == [False, False]   # one sort per window, next_token never waits for one
    assert (c["ttft_p50_s"], c["tpot_p50_s"]) == (pytest.approx(0.4995), pytest.approx(0.04995))
