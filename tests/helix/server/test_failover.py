"""Workers die and freeze while requests run: the coordinator notices, routes around the
node, moves the requests that crossed it to a surviving pipeline, and takes the node back when it
returns. Real processes: cpu-2 is a ``helix worker`` subprocess that the test kills (SIGKILL) or freezes
(SIGSTOP); cpu-0 and cpu-1 are WorkerServers in this process; the plan's pipelines are cpu-0 -> cpu-1
and cpu-0 -> cpu-2, so a route always remains."""

from __future__ import annotations

import signal
import time

import pytest

httpx = pytest.importorskip("httpx")

from coordinator.health import HealthConfig
from coordinator.runtime import RuntimeConfig
from helix.server.http import HttpThread

from tests.builders.serve_stack import ServeCluster
from tests.builders.serving import PROMPTS, hf_greedy, with_capacities
from tests.builders.traffic import (MAX_TOKENS, VIA_2, finish, in_flight_on, join_streams, stream_all,
                                    submit_all, until)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300),
              pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="needs POSIX signals")]


def cluster_of(ckpt, plan, health: HealthConfig) -> ServeCluster:
    """The plan served with cpu-2 in a ``helix worker`` process."""
    return ServeCluster(ckpt, plan, RuntimeConfig(stats_interval_s=0.1, request_timeout_s=60, health=health))


@pytest.fixture
def reference(tiny_model):
    ckpt, model = tiny_model
    ids = [tuple(_encode(ckpt, p)) for p in PROMPTS]
    return {i: hf_greedy(model, i, MAX_TOKENS) for i in ids}


def _encode(ckpt, text):
    from coordinator.textcodec import TextCodec
    return TextCodec(str(ckpt)).encode(text)


def test_kill_9_mid_generation_loses_nothing_and_the_node_comes_back(tiny_model, plan3, reference):
    plan3 = with_capacities(plan3)
    cluster = cluster_of(tiny_model[0], plan3, HealthConfig(suspect_after_s=1.0, dead_after_s=5.0))
    prompts = list(reference)
    try:
        coord = cluster.coord
        http = HttpThread(cluster.stack.app)
        texts = {p: coord.codec.decode(reference[p]) for p in prompts}
        streams = stream_all(http.url, cluster.stack.model_name, prompts, 64)   # 64 SSE streams
        until(lambda: in_flight_on(coord, "cpu-2"), 60, "a request generating through cpu-2")
        cluster.process("cpu-2").send_signal(signal.SIGKILL)
        killed = time.monotonic()
        until(lambda: httpx.get(http.url + "/health", timeout=30).json()["nodes"]["cpu-2"] == "dead",
              10, "/health reporting cpu-2 dead")
        detect_s = time.monotonic() - killed
        for k, (text, finish_reason) in enumerate(join_streams(streams)):   # 64/64 finish, as without
            assert finish_reason in ("length", "stop") and text == texts[prompts[k % len(prompts)]], k
        assert coord.requests_moved >= 1
        assert detect_s < 5   # refused polls: dead without waiting out dead_after_s
        http.stop()
        # The max flow was re-solved on the survivors: cpu-1 now carries all it can (250).
        assert not any("cpu-2" in (a.src, a.dst) for a in coord._flows)
        assert sum(a.flow_tokens_per_s for a in coord._flows if a.src == "coordinator") == 250.0
        before = coord.pipeline_counts[VIA_2]
        finish(submit_all(coord, prompts, 64), prompts, reference)   # the 64 after it
        assert coord.pipeline_counts[VIA_2] == before                  # none through the dead node
        with coord._lock:
            assert not coord._live and not coord._waiting               # nothing leaked
        # A new process for cpu-2 registers: it loads its slice, rejoins and gets traffic again.
        cluster.start_worker("cpu-2")
        until(lambda: coord.node_states()["cpu-2"] == "ok", 90, "cpu-2 back")
        assert coord._flows == plan3.arc_flows                         # the plan's own flows again
        finish(submit_all(coord, prompts, 24), prompts, reference)
        assert coord.pipeline_counts[VIA_2] > before
    finally:
        cluster.close()


def test_frozen_node_gets_no_new_requests_and_its_requests_move_once_suspect(tiny_model, plan3,
                                                                          reference):
    """A frozen node's streams move once it is suspect (another pipeline has room), long before it
    could be declared dead; when it answers again it frees what they held there and serves. Its
    pipeline's tokens stop first: it gets no new requests (stalled) before a stats poll times out."""
    cluster = cluster_of(tiny_model[0], plan3, HealthConfig(suspect_after_s=2.0, dead_after_s=60.0))
    prompts = list(reference)
    try:
        coord = cluster.coord
        stuck = submit_all(coord, prompts, 16)
        until(lambda: _early_on(coord, "cpu-2"), 60, "a request starting to generate through cpu-2")
        cluster.process("cpu-2").send_signal(signal.SIGSTOP)
        frozen = time.monotonic()
        until(lambda: coord.node_states()["cpu-2"] == "suspect", 5, "cpu-2 suspect")
        # Seen on the data plane first (10 token gaps, >= 0.5 s; the poll waits 2 s):
        assert coord.stalls_total["cpu-2"] >= 1
        assert coord.stalled_at["cpu-2"] < coord.health.down_since("cpu-2")
        assert coord.stalls_total["cpu-0"] == coord.stalls_total["cpu-1"] == 0   # cpu-0 -> cpu-1 sent on
        until(lambda: coord.requests_moved >= 1, 5, "cpu-2's requests moving")
        assert time.monotonic() - frozen < 6 and coord.node_states()["cpu-2"] == "suspect"
        finish(stuck, prompts, reference)   # moved while suspect: every one ends, unchanged
        before = coord.pipeline_counts[VIA_2]
        finish(submit_all(coord, prompts, 16), prompts, reference)   # new ones avoid cpu-2
        assert coord.pipeline_counts[VIA_2] == before
        assert coord.node_states()["cpu-2"] == "suspect"
        cluster.process("cpu-2").send_signal(signal.SIGCONT)
        until(lambda: coord.node_states()["cpu-2"] == "ok", 10, "cpu-2 answers again")
        # What the moved requests held on cpu-2 is released there once it answers.
        until(lambda: coord.stats["cpu-2"].num_requests == 0, 10, "cpu-2 freed the moved requests")
        finish(submit_all(coord, prompts, 24), prompts, reference)
        assert coord.pipeline_counts[VIA_2] > before   # back in routing, same process
    finally:
        cluster.close()


def _early_on(coord, node: str) -> bool:
    """A request through ``node`` has streamed a token or two (it is far from done: still there
    when the node freezes a moment later)."""
    with coord._lock:
        return any(r.pipeline is not None and node in r.pipeline.nodes and 1 <= r.num_output_tokens <= 6
                   for r in coord._live.values() if not r.done)


def test_no_pipeline_left_fails_with_503_after_the_grace(tiny_model, plan3):
    pytest.importorskip("httpx")
    import httpx

    from helix.server.http import HttpThread
    cluster = cluster_of(tiny_model[0], plan3, HealthConfig(suspect_after_s=0.5, dead_after_s=2.0,
                                                            no_route_grace_s=2.0))
    try:
        coord = cluster.coord
        http = HttpThread(cluster.stack.app)
        try:
            for w in cluster.local.values():   # cpu-0 holds layer 0 for every pipeline: nothing is left
                w.shutdown()
            until(lambda: coord.node_states()["cpu-0"] == "dead", 10, "cpu-0 dead")
            t0 = time.monotonic()
            r = httpx.post(http.url + "/v1/completions", timeout=60,
                           json={"model": cluster.stack.model_name, "prompt": "hi", "max_tokens": 2})
            assert r.status_code == 503 and "Retry-After" in r.headers
            assert "no pipeline can serve" in r.json()["error"]["message"]
            assert time.monotonic() - t0 < 30
            h = httpx.get(http.url + "/health", timeout=30)
            assert h.status_code == 503 and h.json()["nodes"]["cpu-0"] == "dead"
        finally:
            http.stop()
    finally:
        cluster.close()
