"""LangChain's OpenAI integration against a live Helix server: ``ChatOpenAI`` invoke and
stream, and ``OpenAI.batch``, which packs the prompts into one ``/v1/completions`` request (a list
of prompts: one choice each, in order). Skipped when ``langchain-openai`` is not installed."""

from __future__ import annotations

import json

import pytest

from tests.builders.serving import PROMPTS
from tests.builders.stack import MODEL_NAME

langchain_openai = pytest.importorskip("langchain_openai",
                                       reason="langchain-openai is not installed (pip install "
                                              "langchain-openai, or the dev extra)")
httpx = pytest.importorskip("httpx")

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def stack(tiny_stack):
    return tiny_stack


def _direct(url: str, path: str, body: dict) -> dict:
    r = httpx.post(url + path, json={"model": MODEL_NAME, "temperature": 0, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_chat_openai_invoke_and_stream(stack):
    llm = langchain_openai.ChatOpenAI(model=MODEL_NAME, base_url=stack.url + "/v1", api_key="none",
                                      temperature=0, max_tokens=8, max_retries=0, timeout=60)
    question = [("user", PROMPTS[0])]
    want = _direct(stack.url, "/v1/chat/completions",
                   {"max_tokens": 8, "messages": [{"role": "user", "content": PROMPTS[0]}]})
    answer = llm.invoke(question)
    assert answer.content == want["choices"][0]["message"]["content"]
    assert answer.usage_metadata["output_tokens"] == want["usage"]["completion_tokens"]
    pieces = [chunk.content for chunk in llm.stream(question)]
    assert len(pieces) > 1 and "".join(pieces) == answer.content


def test_openai_batch_packs_prompts_into_one_request(stack):
    seen: list[dict] = []

    def record(request: httpx.Request) -> None:
        if request.url.path.endswith("/completions"):
            seen.append(json.loads(request.content))

    llm = langchain_openai.OpenAI(model=MODEL_NAME, base_url=stack.url + "/v1", api_key="none",
                                  temperature=0, max_tokens=6, max_retries=0, timeout=60,
                                  http_client=httpx.Client(event_hooks={"request": [record]}))
    prompts = PROMPTS[:5]
    got = llm.batch(prompts)
    assert len(seen) == 1 and seen[0]["prompt"] == prompts   # one request, every prompt
    want = [_direct(stack.url, "/v1/completions", {"prompt": p, "max_tokens": 6})["choices"][0]["text"]
            for p in prompts]
    assert got == want
