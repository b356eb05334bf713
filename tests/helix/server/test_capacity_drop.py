"""Capacity drops without a burst of errors, and health says how much still serves. The in-process
stack (real workers, coordinator, HTTP) on two pipelines sharing no node, as the demo cluster's plan
(cpu-0 whole with two thirds of the flow; cpu-2 -> cpu-1 the rest): cpu-0's worker is shut down
mid-generation. Its requests move (admitted before: never refused, whatever the queue's bound),
``/health`` stays 200 and says a third of the capacity serves and since when cpu-0 is down, as do
``/metrics`` and ``helix nodes``; new requests wait up to the queue's bound and only past it (too
many waiting, or the oldest waiting too long) get 503 with Retry-After."""

from __future__ import annotations

import time
from datetime import datetime

import pytest

from coordinator.health import HealthConfig
from coordinator.runtime import QueueFull, RuntimeConfig
from helix.cli import main
from helix.net.sampling import SamplingParams

from tests.builders.serving import PROMPTS, hf_greedy, parallel_plan
from tests.builders.stack import MODEL_NAME, local_stack
from tests.builders.traffic import MAX_TOKENS, in_flight_on, join_streams, stream_all, until

httpx = pytest.importorskip("httpx")
parser = pytest.importorskip("prometheus_client.parser")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

BOUND = 4   # new requests that may wait (the wait the queue is sized for is ~0 here)


def _gauge(url: str, name: str, **labels) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    want = {"model_name": MODEL_NAME, **labels}
    return next(s.value for f in parser.text_string_to_metric_families(text) for s in f.samples
                if s.name == name and s.labels == want)


def test_losing_the_biggest_node_moves_its_requests_and_the_queue_refuses_only_past_its_bound(
        tiny_model, capsys):
    ckpt, model = tiny_model
    config = RuntimeConfig(stats_interval_s=0.1, request_timeout_s=60, min_waiting_requests=BOUND,
                           max_queue_wait_s=0.01,
                           health=HealthConfig(suspect_after_s=1.0, dead_after_s=5.0))
    with local_stack(ckpt, config, plan=parallel_plan()) as s:
        coord = s.coordinator
        prompts = [tuple(coord.codec.encode(p)) for p in PROMPTS]
        texts = {p: coord.codec.decode(hf_greedy(model, p, MAX_TOKENS)) for p in prompts}
        streams = stream_all(s.url, MODEL_NAME, prompts, 24)
        until(lambda: in_flight_on(coord, "cpu-0"), 60, "a request generating on cpu-0")
        s.servers[0].shutdown()   # cpu-0, two thirds of the capacity, is gone
        down_at = time.time()
        until(lambda: coord.node_states()["cpu-0"] == "dead", 10, "cpu-0 dead")
        for k, (text, finish) in enumerate(join_streams(streams)):   # 24 of 24, none refused
            assert finish in ("length", "stop") and text == texts[prompts[k % len(prompts)]], k
        assert coord.requests_moved > BOUND   # more moved than may wait: they never counted

        h = httpx.get(s.url + "/health", timeout=30)
        body = h.json()
        assert h.status_code == 200 and body["status"] == "degraded", body
        assert body["capacity_fraction"] == pytest.approx(1 / 3, abs=1e-3)
        assert body["capacity_tokens_per_s"] == pytest.approx(100) and body["plan_tokens_per_s"] == 300
        down = body["down"]["cpu-0"]
        assert down["state"] == "dead" and down["for_s"] > 0 and "T" in down["since"]
        assert set(body["down"]) == {"cpu-0"} and body["waiting"]["limit"] == BOUND
        assert abs(datetime.fromisoformat(down["since"]).timestamp() - down_at) < 5
        assert _gauge(s.url, "helix:cluster_capacity_fraction") == pytest.approx(1 / 3, abs=1e-3)
        assert _gauge(s.url, "helix:node_state", node="cpu-0", state="dead") == 1
        capsys.readouterr()
        assert main(["nodes", "--server", s.url]) == 0
        line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("cpu-0"))
        assert "dead, 0 request(s) left, down for" in line, line

        # Nothing can serve now (the last pipeline drains); requests that ran move into the queue.
        params = SamplingParams(temperature=0, max_tokens=4)
        with coord._lock:   # no token comes back meanwhile: the moves are certain
            running = [coord.submit(list(prompts[0]), params) for _ in range(2 * BOUND)]
            coord.drain("cpu-2", force=True, move=True)
            assert coord.num_waiting == 2 * BOUND > coord.queue_limit() == BOUND
            fresh = [coord.submit(list(prompts[1]), params) for _ in range(BOUND)]   # they wait
            with pytest.raises(QueueFull):
                coord.submit(list(prompts[1]), params)
        r = httpx.post(s.url + "/v1/completions", timeout=30,
                       json={"model": MODEL_NAME, "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 503 and r.json()["error"]["code"] == "queue_full", r.text
        assert int(r.headers["Retry-After"]) >= 1
        assert "queue is full" in r.json()["error"]["message"]
        # Fewer wait than the bound allows, but the oldest has waited past the wait it is sized
        # for (0.01 s here): the queue is not draining in time, so a newcomer is refused too.
        for h in fresh[:2]:
            h.cancel()
        time.sleep(0.05)
        with pytest.raises(QueueFull, match="2 new requests wait, the oldest for"):
            coord.submit(list(prompts[1]), params)
        coord.undrain("cpu-2")
        for h in running + fresh:   # all that waited are served once a pipeline is back
            assert list(h.events(timeout_s=60))[-1].error is None
