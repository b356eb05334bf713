"""A client that leaves before a non-streamed reply is ready cancels its requests (every choice of
``n``), as one that leaves a stream does: KV freed on every stage and generation stopped, not run to
``max_tokens`` (or, for chat without ``max_tokens``, to the end of the context) for nobody."""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlparse

import pytest

from tests.builders.stack import MODEL_NAME, local_stack

pytestmark = pytest.mark.timeout(120)

N = 3
MAX_TOKENS = 400


@pytest.fixture(scope="module")
def stack(tiny_model):
    with local_stack(tiny_model[0]) as s:
        yield s


def _post_then_leave(stack, path: str, body: dict) -> None:
    """Send the request on a raw socket, wait until its sequences hold KV, then close the socket."""
    url = urlparse(stack.url)
    data = json.dumps(body).encode()
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        deadline = time.monotonic() + 30
        while not stack.kv_blocks_used()["cpu-0"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert stack.kv_blocks_used()["cpu-0"], "the request never started"


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": "a b c", "max_tokens": MAX_TOKENS}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),   # to context end
], ids=["completions", "chat-without-max-tokens"])
def test_leaving_a_non_streamed_request_cancels_every_choice(stack, path, body):
    before = stack.generated_tokens()
    _post_then_leave(stack, path, {"model": MODEL_NAME, "n": N, "ignore_eos": True,
                                   "temperature": 0, **body})
    stack.wait_kv_free(timeout_s=30)   # before the fix: only once every sequence had finished
    time.sleep(0.5)   # the requests' Done events are counted as they land
    made = stack.generated_tokens() - before
    # Run to the end, the N sequences make N * MAX_TOKENS (chat: more); cancelled, far fewer
    # (none when the client left during the prefill).
    assert made < N * MAX_TOKENS // 2, made
    assert not stack.coordinator._live, "the coordinator still tracks the requests"


def test_n_larger_than_the_queue_is_served_not_a_503_forever(tiny_model):
    """``n`` sequences beyond ``max_waiting_requests``: the first is admitted as any request, its
    siblings follow it past the queue's limit; before, the reply was a 503 'retry after 1 s' that
    no retry could ever pass, even on an idle server."""
    import httpx
    from coordinator.runtime import RuntimeConfig
    from tests.builders.serving import branching_plan
    # Workers whose KV holds ~2 requests of 60 tokens: most of the 8 sequences must wait.
    config = RuntimeConfig(stats_interval_s=0.2, max_waiting_requests=1, max_model_len=64)
    with local_stack(tiny_model[0], config, plan=branching_plan(128)) as s:
        r = httpx.post(s.url + "/v1/completions", timeout=90, json={
            "model": MODEL_NAME, "prompt": "a b c", "n": 8, "max_tokens": 56, "ignore_eos": True})
        assert r.status_code == 200, r.text
        assert sorted(c["index"] for c in r.json()["choices"]) == list(range(8))
        assert r.json()["usage"]["completion_tokens"] == 8 * 56
        s.wait_kv_free()
