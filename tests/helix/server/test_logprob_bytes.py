"""Chat logprobs carry each token's raw UTF-8 ``bytes`` (top alternatives too), streamed and not; the
bytes of the output's tokens, joined, are the reply's text. The completions format has no ``bytes``
field (OpenAI's legacy format, as vLLM serves it)."""

from __future__ import annotations

import json

import pytest

from tests.builders.serving import PROMPTS
from tests.builders.stack import MODEL_NAME, local_stack

httpx = pytest.importorskip("httpx")

pytestmark = pytest.mark.timeout(120)

BODY = {"model": MODEL_NAME, "max_tokens": 12, "temperature": 0, "ignore_eos": True,
        "messages": [{"role": "user", "content": PROMPTS[1]}], "logprobs": True, "top_logprobs": 3,
        "return_tokens_as_token_ids": True}


@pytest.fixture(scope="module")
def stack(tiny_model):
    with local_stack(tiny_model[0]) as s:
        yield s


def _streamed_content(url: str, body: dict) -> tuple[list[dict], str]:
    entries, text = [], ""
    with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True},
                      timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                choice = json.loads(line.removeprefix("data: "))["choices"][0]
                text += choice["delta"].get("content") or ""
                if choice.get("logprobs"):
                    entries += choice["logprobs"]["content"]
    return entries, text


def test_chat_logprobs_carry_raw_bytes(stack):
    codec = stack.coordinator.codec
    r = httpx.post(stack.url + "/v1/chat/completions", json=BODY, timeout=60)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    content = choice["logprobs"]["content"]
    assert len(content) == 12
    def want(entry) -> list[int] | None:   # null for an id past the tokenizer's vocabulary
        raw = codec.token_bytes(int(entry["token"].removeprefix("token_id:")))
        return None if raw is None else list(raw)
    for e in content:
        assert e["bytes"] == want(e)
        assert all(alt["bytes"] == want(alt) for alt in e["top_logprobs"])
    assert any(e["bytes"] for e in content)
    ids = [int(e["token"].removeprefix("token_id:")) for e in content]
    special = set(codec.tokenizer.get_added_tokens_decoder())
    joined = b"".join(bytes(e["bytes"] or []) for e, i in zip(content, ids) if i not in special)
    # A random model emits invalid UTF-8 too: the text shows it as U+FFFD, as decode does.
    assert joined.decode(errors="replace") == choice["message"]["content"]

    streamed, text = _streamed_content(stack.url, BODY)
    assert text == choice["message"]["content"]
    assert [e["bytes"] for e in streamed] == [e["bytes"] for e in content]
    assert [[a["bytes"] for a in e["top_logprobs"]] for e in streamed] == \
        [[a["bytes"] for a in e["top_logprobs"]] for e in content]


def test_chat_bytes_without_token_ids_and_completions_have_none(stack):
    body = {k: v for k, v in BODY.items() if k != "return_tokens_as_token_ids"}
    r = httpx.post(stack.url + "/v1/chat/completions", json=body, timeout=60)
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert any(e["bytes"] for e in content)
    assert all(e["bytes"] is None or bytes(e["bytes"]).decode(errors="replace") == e["token"]
               for e in content)
    r = httpx.post(stack.url + "/v1/completions", timeout=60, json={
        "model": MODEL_NAME, "prompt": PROMPTS[1], "max_tokens": 4, "logprobs": 2})
    assert set(r.json()["choices"][0]["logprobs"]) == {"tokens", "token_logprobs", "top_logprobs",
                                                      "text_offset"}
