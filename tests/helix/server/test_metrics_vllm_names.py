"""``/metrics`` as vLLM names them (``vllm:`` -> ``helix:``), every series labelled ``model_name``:
finished requests by reason, queue time, prompt and generation length histograms, preemptions summed
over the workers' own counts; scraped from the in-process stack after real requests."""

from __future__ import annotations

import time

import pytest

from coordinator.health import HealthConfig
from coordinator.runtime import RuntimeConfig
from helix.net.sampling import SamplingParams
from helix.net.stats import WorkerStats
from helix.server.metrics import ServingMetrics

from tests.builders.serving import PROMPTS
from tests.builders.stack import MODEL_NAME, local_stack

httpx = pytest.importorskip("httpx")
parser = pytest.importorskip("prometheus_client.parser")

pytestmark = pytest.mark.timeout(120)


def _scrape(url: str) -> dict[tuple[str, tuple], float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in parser.text_string_to_metric_families(text) for s in f.samples}


def _value(samples, name: str, **labels) -> float:
    return samples[(name, tuple(sorted({"model_name": MODEL_NAME, **labels}.items())))]


def test_metrics_after_requests(tiny_model):
    with local_stack(tiny_model[0]) as s:
        lengths = []
        for i, max_tokens in enumerate((3, 5)):
            r = httpx.post(s.url + "/v1/completions", timeout=60, json={
                "model": MODEL_NAME, "prompt": PROMPTS[i], "max_tokens": max_tokens,
                "temperature": 0, "ignore_eos": True})
            assert r.status_code == 200, r.text
            lengths.append(r.json()["usage"]["prompt_tokens"])
        handle = s.coordinator.submit(s.coordinator.codec.encode(PROMPTS[2]),
                                      SamplingParams(max_tokens=50, ignore_eos=True))
        s.coordinator.cancel(handle.request_id)
        m = _scrape(s.url)
        # The workers' own counts travel in their stats replies (as a preemption would leave them).
        for server, n in zip(s.servers, (2, 0, 3)):
            server.engine.policy.num_preemptions_total = n
        deadline = time.monotonic() + 10
        while _value(_scrape(s.url), "helix:num_preemptions_total") != 5:
            assert time.monotonic() < deadline, "preemptions never reached the metrics"
            time.sleep(0.1)

    assert _value(m, "helix:request_success_total", finished_reason="length") == 2
    assert _value(m, "helix:request_success_total", finished_reason="abort") == 1
    assert _value(m, "helix:request_success_total", finished_reason="stop") == 0
    assert _value(m, "helix:request_success_total", finished_reason="error") == 0
    assert _value(m, "helix:request_generation_tokens_count") == 2
    assert _value(m, "helix:request_generation_tokens_sum") == 8
    assert _value(m, "helix:request_prompt_tokens_sum") == sum(lengths)
    assert _value(m, "helix:request_generation_tokens_bucket", le="5.0") == 2
    assert _value(m, "helix:request_generation_tokens_bucket", le="2.0") == 0
    assert _value(m, "helix:request_queue_time_seconds_count") == 3
    assert _value(m, "helix:num_preemptions_total") == 0
    # The names the stack already had keep working, now labelled too.
    assert _value(m, "helix:generation_tokens_total") == 8
    assert _value(m, "helix:e2e_request_latency_seconds_count") == 2
    assert _value(m, "helix:time_to_first_token_seconds_count") >= 2
    assert _kv_nodes(m) == {"cpu-0", "cpu-1", "cpu-2"}
    assert all(dict(labels).get("model_name") == MODEL_NAME for _, labels in m), \
        sorted({name for name, labels in m if dict(labels).get("model_name") != MODEL_NAME})


def _kv_nodes(samples) -> set[str]:
    return {dict(labels)["node"] for name, labels in samples if name == "helix:kv_cache_usage_perc"}


def test_kv_usage_of_a_node_that_stops_answering_is_unknown(tiny_model):
    config = RuntimeConfig(stats_interval_s=0.1,
                           health=HealthConfig(suspect_after_s=0.5, dead_after_s=30.0))
    with local_stack(tiny_model[0], config) as s:
        assert _kv_nodes(_scrape(s.url)) == {"cpu-0", "cpu-1", "cpu-2"}
        s.servers[2].shutdown()   # its control server goes: the stats polls get no answer
        deadline = time.monotonic() + 15
        while s.coordinator.node_states()["cpu-2"] == "ok":
            assert time.monotonic() < deadline, "cpu-2 never stopped answering"
            time.sleep(0.1)
        m = _scrape(s.url)
        assert _kv_nodes(m) == {"cpu-0", "cpu-1"}   # no series: unknown, not its last value
        assert _value(m, "helix:node_state", node="cpu-2", state="ok") == 0


def _stats(node: str, preemptions: int) -> WorkerStats:
    return WorkerStats(node, True, 0, 2, 10, 0, 16, "float32", 8, 0, 0, 0, 1, 0.0, None, None, False,
                       num_preemptions_total=preemptions)


def test_preemptions_sum_workers_and_survive_a_silent_or_restarted_node():
    m = ServingMetrics(MODEL_NAME)

    def total() -> float:
        return m.registry.get_sample_value("helix:num_preemptions_total", {"model_name": MODEL_NAME})
    m._count_preemptions({"a": _stats("a", 2), "b": _stats("b", 3)})
    assert total() == 5
    m._count_preemptions({"a": _stats("a", 4)})            # b stopped answering: its 3 stay counted
    assert total() == 7
    m._count_preemptions({"a": _stats("a", 1), "b": _stats("b", 3)})   # a restarted from 0
    assert total() == 8
