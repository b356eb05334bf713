"""Hostile and broken HTTP input against the real stack in this process (three
WorkerServers, the Coordinator, uvicorn): no 5xx, ever; a good request still answers afterwards.

Raw sockets send what no HTTP client library would (short bodies, invalid UTF-8, lying
Content-Length); httpx sends the rest.
"""

from __future__ import annotations

import itertools
import json
import socket
import time

import pytest

httpx = pytest.importorskip("httpx")

from helix.server.app import create_app  # noqa: E402
from helix.server.guard import HttpOptions  # noqa: E402
from helix.server.http import HttpThread  # noqa: E402

from tests.builders.stack import MODEL_NAME, local_stack  # noqa: E402

GOOD = {"model": MODEL_NAME, "prompt": "Helix serves", "max_tokens": 2, "temperature": 0}
GOOD_CHAT = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2,
             "temperature": 0}


@pytest.fixture(scope="module")
def stack(tiny_model):
    ckpt, _ = tiny_model
    with local_stack(ckpt) as s:
        yield s


@pytest.fixture(scope="module")
def strict(stack):
    """A second front door on the same coordinator: an API key, a 4 KiB body limit, a 1 s body timeout."""
    http = HttpThread(create_app(stack.coordinator, MODEL_NAME, http=HttpOptions(
        api_key="s3cret", max_body_bytes=4096, body_timeout_s=1.0)))
    yield http
    http.stop()


def raw(host: str, port: int, data: bytes, timeout_s: float = 10.0) -> tuple[int | None, bytes]:
    """Send bytes, read until the server closes or ``timeout_s``; (status or None, whole reply)."""
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        sock.sendall(data)
        chunks, deadline = [], time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                break
            chunks.append(chunk)
            if b"\r\n\r\n" in b"".join(chunks) and _complete(b"".join(chunks)):
                break
    reply = b"".join(chunks)
    status = int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/") else None
    return status, reply


def _complete(reply: bytes) -> bool:
    head, _, body = reply.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False


def post_raw(http, path: str, body: bytes, content_length: int | None = None,
             extra_headers: bytes = b"") -> bytes:
    n = len(body) if content_length is None else content_length
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {n}\r\n").encode() + extra_headers + b"\r\n" + body


def test_lone_surrogates_are_400_not_500(stack):
    for path, body in [("/v1/completions", {**GOOD, "prompt": "a\ud800b"}),
                       ("/v1/chat/completions", {**GOOD_CHAT, "messages": [{"role": "user",
                                                                            "content": "x\udfffy"}]}),
                       ("/v1/completions", {**GOOD, "stop": ["\ud83d"]})]:
        r = httpx.post(stack.url + path, content=json.dumps(body), timeout=30,
                       headers={"content-type": "application/json"})
        assert r.status_code == 400, r.text
        assert "invalid Unicode" in r.json()["error"]["message"]


def test_prompt_past_the_context_in_bytes_is_refused_before_tokenizing(stack):
    limit = stack.coordinator.codec.max_text_bytes
    r = httpx.post(stack.url + "/v1/completions", json={**GOOD, "prompt": "a" * (limit + 1)}, timeout=30)
    assert r.status_code == 400
    assert f"holds at most {limit} bytes" in r.json()["error"]["message"]


def test_body_limits_and_timeouts(strict):
    auth = b"Authorization: Bearer s3cret\r\n"
    # Announces more than it sends: answered 408 after the 1 s deadline, not held forever.
    t0 = time.monotonic()
    status, reply = raw(strict.host, strict.port, post_raw(strict, "/v1/completions", b'{"model"',
                                                           content_length=500, extra_headers=auth))
    assert status == 408 and b"body_timeout" in reply
    assert time.monotonic() - t0 < 8
    # Announces too much: 413 before reading.
    status, _ = raw(strict.host, strict.port, post_raw(strict, "/v1/completions", b"{}",
                                                       content_length=10**9, extra_headers=auth))
    assert status == 413
    # Sends too much without announcing it (chunked): 413 once the bytes pass the limit.
    big = json.dumps({**GOOD, "prompt": "x" * 10_000}).encode()
    chunked = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Transfer-Encoding: chunked\r\n" + auth + b"\r\n" +
               f"{len(big):x}\r\n".encode() + big + b"\r\n0\r\n\r\n")
    status, _ = raw(strict.host, strict.port, chunked)
    assert status == 413
    # A bad Content-Length is a 4xx (uvicorn or the guard), never a 5xx.
    status, _ = raw(strict.host, strict.port, post_raw(strict, "/v1/completions", b"{}",
                                                       content_length=-5, extra_headers=auth))
    assert status is not None and 400 <= status < 500


def test_api_key(strict, stack):
    url = f"http://{strict.host}:{strict.port}"
    assert httpx.post(url + "/v1/completions", json=GOOD, timeout=30).status_code == 401
    r = httpx.post(url + "/v1/completions", json=GOOD, timeout=30,
                   headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert httpx.get(url + "/v1/models", timeout=30).status_code == 401
    ok = httpx.post(url + "/v1/completions", json=GOOD, timeout=30,
                    headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200, ok.text
    assert httpx.get(url + "/metrics", timeout=30).status_code == 200   # open unless asked
    guarded = HttpThread(create_app(stack.coordinator, MODEL_NAME, http=HttpOptions(
        api_key="k", protect_health=True)))
    try:
        assert httpx.get(guarded.url + "/metrics", timeout=30).status_code == 401
        assert httpx.get(guarded.url + "/metrics", timeout=30,
                         headers={"Authorization": "Bearer k"}).status_code == 200
    finally:
        guarded.stop()
    with pytest.raises(ValueError):
        HttpOptions(api_key="  ")


BAD_VALUES = [None, True, "x", -1, 0, 2**70, -2**70, 1e308, -1e308, float("nan"), float("inf"), [], {},
              [[]], [None], "\ud800", "\x00", {"a": [1, {"b": None}]}, [1, "a"], 3.5]
FIELDS = ["model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p", "n", "stream",
          "stop", "seed", "logprobs", "stop_token_ids", "presence_penalty", "repetition_penalty",
          "min_tokens", "stream_options", "logit_bias", "echo", "best_of", "ignore_eos"]
CHAT_FIELDS = ["messages", "max_completion_tokens", "logprobs", "top_logprobs", "max_tokens"]


def corpus() -> list[tuple[str, bytes]]:
    """(path, body) pairs: every field with every wrong type, plus broken JSON of every kind."""
    out = []
    for field, value in itertools.product(FIELDS, BAD_VALUES):
        out.append(("/v1/completions", json.dumps({**GOOD, field: value}).encode()))
    for field, value in itertools.product(CHAT_FIELDS, BAD_VALUES):
        out.append(("/v1/chat/completions", json.dumps({**GOOD_CHAT, field: value}).encode()))
    for msg in [{"role": "wizard", "content": "x"}, {"content": "x"}, {"role": "user", "content": 5},
                {"role": "user", "content": [{"type": "image", "url": "x"}]},
                {"role": "user", "content": [{"type": "text"}]}, "hello", None, []]:
        out.append(("/v1/chat/completions", json.dumps({**GOOD_CHAT, "messages": [msg]}).encode()))
    whole = json.dumps(GOOD).encode()
    out += [("/v1/completions", whole[:n]) for n in range(0, len(whole), 7)]    # truncated
    out += [("/v1/completions", b"[" * 100_000 + b"]" * 100_000),               # deeply nested
            ("/v1/completions", b'{"a":' * 50_000 + b"1" + b"}" * 50_000),
            ("/v1/completions", b"\xff\xfe\x00garbage"), ("/v1/completions", b'{"prompt": "\xc3\x28"}'),
            ("/v1/completions", b"null"), ("/v1/completions", b"[]"), ("/v1/completions", b"1"),
            ("/v1/completions", b'"s"'), ("/v1/completions", b""),
            ("/v1/completions", json.dumps({**GOOD, "prompt": [0, -1, 2**63]}).encode()),
            ("/v1/completions", json.dumps({**GOOD, "prompt": [[1, 2], [3]]}).encode()),
            ("/v1/completions", json.dumps({**GOOD, "max_tokens": 10**9}).encode()),
            ("/v1/completions", json.dumps({**GOOD, "model": "other"}).encode()),
            ("/v1/nope", whole), ("/v1/models", whole)]
    return out


def test_fuzz_corpus_gets_no_5xx(stack):
    cases = corpus()
    assert len(cases) >= 200
    statuses: dict[int, int] = {}
    fives = []
    with httpx.Client(base_url=stack.url, timeout=60) as client:
        for path, body in cases:
            r = client.post(path, content=body, headers={"content-type": "application/json"})
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            if r.status_code >= 500:
                fives.append((path, body[:120], r.status_code, r.text[:200]))
    assert not fives, fives[:5]
    assert statuses.get(200, 0) < len(cases) // 4, statuses   # the corpus is mostly refused
    # Bytes no client library sends: invalid UTF-8 headers, a lying length, a bare newline.
    host, port = stack.http.host, stack.http.port
    for data in [post_raw(None, "/v1/completions", b"\xff" * 64),
                 b"POST /v1/completions HTTP/1.1\r\nHost: \xff\xfe\r\nContent-Length: 2\r\n\r\n{}",
                 b"GARBAGE\r\n\r\n", b"POST /v1/completions HTTP/1.1\r\nContent-Length: abc\r\n\r\n{}"]:
        status, _ = raw(host, port, data, timeout_s=10)
        assert status is None or status < 500, (data[:60], status)
    r = httpx.post(stack.url + "/v1/completions", json=GOOD, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


def test_grpc_generate_needs_the_api_key_too(stack):
    """--api-key is not bypassed over the native gRPC API."""
    from coordinator.grpc_api import CoordinatorService, Registry
    from helix.client import Client, ClientError
    from helix.net.control import start_server
    svc = CoordinatorService(Registry(), "tiny", api_key="s3cret")
    svc.coordinator = stack.coordinator
    server = start_server([svc.handler()], "127.0.0.1", 0)
    try:
        with Client(server.address, timeout_s=60) as c, pytest.raises(ClientError, match="UNAUTHENTICATED"):
            c.generate("Helix", temperature=0, max_tokens=2)
        with Client(server.address, timeout_s=60, api_key="wrong") as c, \
                pytest.raises(ClientError, match="UNAUTHENTICATED"):
            c.generate("Helix", temperature=0, max_tokens=2)
        with Client(server.address, timeout_s=60, api_key="s3cret") as c:
            assert len(c.generate("Helix", temperature=0, max_tokens=2, ignore_eos=True).token_ids) == 2
    finally:
        server.stop()


def test_http_options_never_show_the_api_key():
    from helix.server.guard import HttpOptions
    assert "sesame" not in repr(HttpOptions(api_key="sesame"))
