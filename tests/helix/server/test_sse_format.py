"""The OpenAI API's bytes on the wire: the SSE chunk sequence ending in ``data: [DONE]`` (read raw with
httpx, since the ``openai`` client stops quietly at the end of the connection), streamed logprobs equal
to the non-streamed ones, and the 504 / 500 / stream-error paths."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from coordinator.requests import Delta, Done, RequestHandle
from coordinator.textcodec import TextCodec
from helix.server.app import create_app

from tests.builders.serving import PROMPTS
from tests.builders.stack import MODEL_NAME, local_stack

httpx = pytest.importorskip("httpx")

pytestmark = pytest.mark.timeout(120)

CHAT_MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPTS[0]}]


@pytest.fixture(scope="module")
def stack(tiny_model):
    with local_stack(tiny_model[0]) as s:
        yield s


def sse_events(raw: str) -> list:
    """Each ``data:`` event of an SSE body: parsed JSON, or the string ``[DONE]``."""
    assert raw.endswith("\n\n"), raw[-80:]
    events = []
    for block in raw.split("\n\n")[:-1]:
        assert block.startswith("data: ") and "\n" not in block, block
        payload = block.removeprefix("data: ")
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def _body(chat: bool, **extra) -> tuple[str, dict]:
    body = {"model": MODEL_NAME, "max_tokens": 8, "temperature": 0, "ignore_eos": True, **extra}
    if chat:
        return "/v1/chat/completions", {"messages": CHAT_MESSAGES, **body}
    return "/v1/completions", {"prompt": PROMPTS[0], **body}


def _post(url: str, path: str, body: dict) -> httpx.Response:
    r = httpx.post(url + path, json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r


def _stream(url: str, path: str, body: dict) -> list:
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        return sse_events(r.read().decode())


@pytest.mark.parametrize("include_usage", [True, False], ids=["usage", "no-usage"])
@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_sse_chunk_sequence_ends_with_done(stack, chat, include_usage):
    path, body = _body(chat)
    whole = _post(stack.url, path, body).json()
    extra = {"stream_options": {"include_usage": True}} if include_usage else {}
    events = _stream(stack.url, path, {**body, **extra})

    assert events[-1] == "[DONE]" and "[DONE]" not in events[:-1]
    chunks = events[:-1]
    obj = "chat.completion.chunk" if chat else "text_completion"
    assert {(c["id"], c["object"], c["model"], c["created"]) for c in chunks} == {
        (chunks[0]["id"], obj, MODEL_NAME, chunks[0]["created"])}
    if include_usage:
        *chunks, usage_chunk = chunks
        assert usage_chunk["choices"] == [] and usage_chunk["usage"] == whole["usage"]
        assert all(c["usage"] is None for c in chunks)   # OpenAI: null on every other chunk
    else:
        assert all("usage" not in c for c in chunks)
    choices = [c["choices"] for c in chunks]
    assert all(len(cs) == 1 and cs[0]["index"] == 0 for cs in choices)
    choices = [cs[0] for cs in choices]
    if chat:
        first, *choices = choices
        assert first["delta"] == {"role": "assistant", "content": ""} and first["finish_reason"] is None
    *content, finish = choices
    assert finish["finish_reason"] == "length" == whole["choices"][0]["finish_reason"]
    assert finish["delta" if chat else "text"] == ({} if chat else "")
    assert content and all(c["finish_reason"] is None for c in content)
    if chat:
        assert all(set(c["delta"]) == {"content"} and c["delta"]["content"] for c in content)
        assert "".join(c["delta"]["content"] for c in content) == whole["choices"][0]["message"]["content"]
    else:
        assert all(c["text"] for c in content)
        assert "".join(c["text"] for c in content) == whole["choices"][0]["text"]
    assert all(c["logprobs"] is None for c in choices)


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_continuous_usage_counts_the_tokens_sent_so_far(stack, chat):
    # vLLM's stream_options.continuous_usage_stats: every chunk carries the usage so far, so a
    # client (helix bench) counts tokens exactly even when a chunk carries several (held-back text).
    path, body = _body(chat, max_tokens=12, **({"logprobs": True, "top_logprobs": 0} if chat
                                                else {"logprobs": 0}))
    whole = _post(stack.url, path, body).json()
    events = _stream(stack.url, path, {**body, "stream_options": {"include_usage": True,
                                                                   "continuous_usage_stats": True}})
    *chunks, usage_chunk, done = events
    assert done == "[DONE]" and usage_chunk["usage"] == whole["usage"]
    prompt = whole["usage"]["prompt_tokens"]
    sent = 0
    for c in chunks:
        lp = c["choices"][0]["logprobs"]
        sent += 0 if lp is None else len(lp["content"] if chat else lp["tokens"])
        assert c["usage"] == {"prompt_tokens": prompt, "completion_tokens": sent,
                              "total_tokens": prompt + sent}
    assert sent == whole["usage"]["completion_tokens"] == 12
    # Without include_usage the option adds nothing (as in vLLM).
    plain = _stream(stack.url, path, {**body, "stream_options": {"continuous_usage_stats": True}})
    assert all("usage" not in c for c in plain[:-1])


def _joined_completion_logprobs(choices: list[dict]) -> dict:
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for c in choices:
        if c["logprobs"] is not None:
            for k in out:
                out[k] += c["logprobs"][k]
    return out


def _joined_chat_logprobs(choices: list[dict]) -> dict:
    return {"content": [e for c in choices if c["logprobs"] is not None for e in c["logprobs"]["content"]]}


def _assert_same_logprobs(got, want) -> None:
    """Equal structure and names; floats equal up to rounding."""
    if isinstance(want, float):
        assert got == pytest.approx(want, rel=1e-6, abs=1e-6)
    elif isinstance(want, dict):
        assert list(got) == list(want)
        for k in want:
            _assert_same_logprobs(got[k], want[k])
    elif isinstance(want, list):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            _assert_same_logprobs(g, w)
    else:
        assert got == want


@pytest.mark.parametrize("stop", [False, True], ids=["plain", "stop-string"])
@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_streamed_logprobs_equal_non_streamed(stack, chat, stop):
    lp = {"logprobs": True, "top_logprobs": 3} if chat else {"logprobs": 3}
    path, body = _body(chat, **lp)
    if stop:   # a stop string holds text back, so some tokens' logprobs ride on the finish chunk
        full = _post(stack.url, path, body).json()["choices"][0]
        text = full["message"]["content"] if chat else full["text"]
        body["stop"] = [text[len(text) // 2:len(text) // 2 + 2]]
    whole = _post(stack.url, path, body).json()
    want = whole["choices"][0]["logprobs"]
    n = whole["usage"]["completion_tokens"]
    if chat:
        assert len(want["content"]) == n and all(len(e["top_logprobs"]) == 3 for e in want["content"])
    else:
        # (a dict keyed by token text: several partial UTF-8 tokens all read U+FFFD and collapse)
        assert len(want["tokens"]) == n and all(1 <= len(t) <= 3 for t in want["top_logprobs"])
        assert want["text_offset"][0] == 0 and want["text_offset"] == sorted(want["text_offset"])
    events = _stream(stack.url, path, body)
    choices = [e["choices"][0] for e in events[:-1] if e["choices"]]
    got = _joined_chat_logprobs(choices) if chat else _joined_completion_logprobs(choices)
    _assert_same_logprobs(got, want)


# --- timeouts and failed generations, with a coordinator that never answers or fails ------------------

class _SilentCoordinator:
    """Stands in for the coordinator: each request gets exactly ``events``, then silence."""

    def __init__(self, codec: TextCodec, events: list) -> None:
        self.codec = codec
        self.config = SimpleNamespace(request_timeout_s=0.3)
        self.events = events
        self.cancelled: list[int] = []

    def submit(self, ids, params, stop=(), loop=None, adapter=None, sibling=False) -> RequestHandle:
        handle = RequestHandle(7, self.cancelled.append, loop)
        for ev in self.events:
            handle.push(ev)
        return handle


FAILED = [Delta((5,), "Hel", ()), Done("abort", 3, 1, error="worker 'cpu-1' stopped answering")]


@pytest.fixture
def silent_app(tiny_model):
    def make(events):
        from starlette.testclient import TestClient
        coord = _SilentCoordinator(TextCodec(tiny_model[0]), events)
        return coord, TestClient(create_app(coord, MODEL_NAME), raise_server_exceptions=False)
    return make


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_timeout_is_504_timeout_error(silent_app, chat):
    coord, client = silent_app([])
    path, body = _body(chat)
    r = client.post(path, json=body)
    assert r.status_code == 504
    err = r.json()["error"]
    assert err["type"] == "timeout_error" and "no output for 0.3 s" in err["message"]
    assert set(coord.cancelled) == {7}   # cancelled (KV freed on every stage)


@pytest.mark.parametrize("events, err_type", [([], "timeout_error"), (FAILED, "server_error")],
                         ids=["timeout", "failed"])
@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_failed_stream_sends_error_event_then_done(silent_app, chat, events, err_type):
    coord, client = silent_app(events)
    path, body = _body(chat)
    with client.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200
        got = sse_events(r.read().decode())
    assert got[-1] == "[DONE]"
    assert "error" in got[-2] and got[-2]["error"]["type"] == err_type
    assert all("error" not in e for e in got[:-2])
    assert coord.cancelled   # the request was cancelled (KV freed) on the way out


def test_failed_generation_is_500_server_error(silent_app):
    _, client = silent_app(FAILED)
    path, body = _body(False)
    r = client.post(path, json=body)
    assert r.status_code == 500
    assert r.json()["error"] == {"message": "worker 'cpu-1' stopped answering", "type": "server_error",
                                 "param": None, "code": None}
