"""The OpenAI / vLLM surface: harmless unknown fields are ignored (``--strict`` refuses
them), a list of prompts gets one choice each, tools and an unknown ``response_format`` type are a
400 naming the field (structured output itself: ``test_structured_output``), and vLLM's routes
(``/v1/models/{id}``, ``/version``, ``/ping``, ``/tokenize``, ``/detokenize``) answer as vLLM's do.
The real ``openai`` client where it can say it, raw HTTP otherwise; three real workers, the
coordinator and uvicorn in this process."""

from __future__ import annotations

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from helix.server.app import create_app  # noqa: E402
from helix.server.guard import HttpOptions  # noqa: E402
from helix.server.http import HttpThread  # noqa: E402

from tests.builders.serving import PROMPTS  # noqa: E402
from tests.builders.stack import MODEL_NAME  # noqa: E402

HARMLESS = {"store": False, "metadata": {"run": "1"}, "service_tier": "auto",
            "parallel_tool_calls": False, "response_format": {"type": "text"},
            "reasoning_effort": "low", "stream_options": None}


@pytest.fixture(scope="module")
def stack(tiny_stack):
    return tiny_stack


@pytest.fixture(scope="module")
def client(openai_client):
    return openai_client


def test_unknown_harmless_fields_are_ignored_and_strict_refuses_them(stack, client):
    extra = {k: v for k, v in HARMLESS.items() if k != "stream_options"}
    chat = client.chat.completions.create(model=MODEL_NAME, max_tokens=3, temperature=0,
                                          messages=[{"role": "user", "content": "hi"}], extra_body=extra)
    assert chat.choices[0].finish_reason in ("length", "stop")
    comp = client.completions.create(model=MODEL_NAME, prompt="Helix", max_tokens=3, temperature=0,
                                     extra_body={"store": True, "unknown_knob": 7})
    assert comp.choices[0].text is not None
    strict = HttpThread(create_app(stack.coordinator, MODEL_NAME, http=HttpOptions(strict=True)))
    try:
        r = httpx.post(strict.url + "/v1/completions", timeout=30,
                       json={"model": MODEL_NAME, "prompt": "x", "max_tokens": 2, "store": True})
        assert r.status_code == 400 and "store" in r.json()["error"]["message"]
    finally:
        strict.stop()


def test_known_but_unsupported_fields_name_themselves(client):
    msgs = [{"role": "user", "content": "hi"}]
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    with pytest.raises(openai.BadRequestError, match="tools are not supported"):
        client.chat.completions.create(model=MODEL_NAME, messages=msgs, tools=[tool])
    with pytest.raises(openai.BadRequestError, match="response_format.type must be"):
        client.chat.completions.create(model=MODEL_NAME, messages=msgs,
                                       response_format={"type": "json_yaml"})


def test_a_list_of_prompts_gets_one_choice_each_in_order(client):
    prompts = PROMPTS[:5]
    batch = client.completions.create(model=MODEL_NAME, prompt=prompts, max_tokens=4, temperature=0)
    assert [c.index for c in batch.choices] == list(range(5))
    singles = [client.completions.create(model=MODEL_NAME, prompt=p, max_tokens=4, temperature=0)
               for p in prompts]
    assert [c.text for c in batch.choices] == [s.choices[0].text for s in singles]
    assert batch.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)
    assert batch.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles)


def test_vllm_routes(stack, client):
    card = client.models.retrieve(MODEL_NAME)
    assert card.id == MODEL_NAME
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("other")
    assert httpx.get(stack.url + "/version", timeout=10).json()["version"]
    assert httpx.get(stack.url + "/ping", timeout=10).status_code == 200
    assert httpx.post(stack.url + "/ping", timeout=10).status_code == 200
    codec = stack.coordinator.codec
    t = httpx.post(stack.url + "/tokenize", json={"model": MODEL_NAME, "prompt": PROMPTS[0]}, timeout=10).json()
    assert t["tokens"] == codec.encode(PROMPTS[0]) and t["count"] == len(t["tokens"])
    assert t["max_model_len"] == codec.max_context_tokens
    msgs = [{"role": "user", "content": "hi"}]
    t = httpx.post(stack.url + "/tokenize", json={"messages": msgs}, timeout=10).json()
    assert t["tokens"] == codec.encode_chat(msgs)
    d = httpx.post(stack.url + "/detokenize", json={"tokens": codec.encode(PROMPTS[1])}, timeout=10).json()
    assert d["prompt"] == codec.decode(codec.encode(PROMPTS[1]))
    assert httpx.post(stack.url + "/detokenize", json={"tokens": [10**6]}, timeout=10).status_code == 400
    assert httpx.post(stack.url + "/tokenize", json={}, timeout=10).status_code == 400
