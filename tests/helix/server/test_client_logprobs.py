"""``helix.Client`` returns per-token logprobs when a request sets ``logprobs=N``: the same tokens and
values as the HTTP API's non-streamed reply to the same request, from ``generate``, ``stream`` and the
async twins; and none when not asked for."""

from __future__ import annotations

import asyncio

import pytest

from helix.client import Client, Completion, _join

from tests.builders.serving import PROMPTS
from tests.builders.stack import MODEL_NAME, local_stack

httpx = pytest.importorskip("httpx")

pytestmark = pytest.mark.timeout(120)

TOP_N = 4
PROMPT = PROMPTS[1]
GREEDY = {"temperature": 0, "max_tokens": 8, "ignore_eos": True}


@pytest.fixture(scope="module")
def stack(tiny_model):
    with local_stack(tiny_model[0]) as s:
        yield s


def _http_logprobs(url: str, **sampling) -> dict:
    """The non-streamed ``/v1/completions`` logprobs, tokens named ``token_id:<id>``."""
    body = {"model": MODEL_NAME, "prompt": PROMPT, "return_tokens_as_token_ids": True, **sampling}
    r = httpx.post(url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["logprobs"]


def _token_id(name: str) -> int:
    return int(name.removeprefix("token_id:"))


def _via(api: str, address: str, **kw) -> Completion:
    """One request through ``api``; streams are joined chunk by chunk (their own logprobs)."""
    async def run() -> Completion:
        c = Client(address, timeout_s=60)
        try:
            if api == "agenerate":
                return await c.agenerate(PROMPT, **kw)
            return _join([chunk async for chunk in c.astream(PROMPT, **kw)])
        finally:
            await c.aclose()
            c.close()
    if api in ("agenerate", "astream"):
        return asyncio.run(run())
    with Client(address, timeout_s=60) as c:
        return c.generate(PROMPT, **kw) if api == "generate" else _join(list(c.stream(PROMPT, **kw)))


APIS = ["generate", "stream", "agenerate", "astream"]


@pytest.mark.parametrize("api", APIS)
def test_greedy_logprobs_equal_the_http_apis(stack, api):
    want = _http_logprobs(stack.url, logprobs=TOP_N, **GREEDY)
    got = _via(api, stack.grpc.address, logprobs=TOP_N, **GREEDY)
    assert got.token_ids == tuple(_token_id(t) for t in want["tokens"])
    assert len(got.token_ids) == GREEDY["max_tokens"]
    assert len(got.logprobs) == len(got.token_logprobs) == len(got.token_ids)
    assert got.token_logprobs == pytest.approx(want["token_logprobs"], abs=1e-6, rel=0)
    for tok, chosen, top, want_top in zip(got.token_ids, got.token_logprobs, got.logprobs,
                                          want["top_logprobs"]):
        assert len(top) == TOP_N
        assert top == pytest.approx({_token_id(k): v for k, v in want_top.items()}, abs=1e-6, rel=0)
        assert list(top.values()) == sorted(top.values(), reverse=True)   # best first
        assert top[tok] == chosen == max(top.values())   # greedy picks the argmax


@pytest.mark.parametrize("api", APIS)
def test_no_logprobs_unless_asked(stack, api):
    got = _via(api, stack.grpc.address, **GREEDY)
    assert len(got.token_ids) == GREEDY["max_tokens"]
    assert got.logprobs is None and got.token_logprobs is None
    with Client(stack.grpc.address, timeout_s=60) as c:
        assert all(ch.logprobs is None and ch.token_logprobs is None
                   for ch in c.stream(PROMPT, **GREEDY))


def test_zero_logprobs_gives_the_sampled_tokens_only(stack):
    want = _http_logprobs(stack.url, logprobs=0, **GREEDY)
    with Client(stack.grpc.address, timeout_s=60) as c:
        got = c.generate(PROMPT, logprobs=0, **GREEDY)
    assert got.token_logprobs == pytest.approx(want["token_logprobs"], abs=1e-6, rel=0)
    assert got.logprobs == tuple({t: lp} for t, lp in zip(got.token_ids, got.token_logprobs))


def test_sampled_token_outside_the_top_n_is_still_in_its_dict(stack):
    # top-1 with hot sampling: some draws miss the argmax, and vLLM's dict then holds both
    kw = {"temperature": 5.0, "seed": 3, "max_tokens": 24, "ignore_eos": True, "logprobs": 1}
    with Client(stack.grpc.address, timeout_s=60) as c:
        got = c.generate(PROMPT, **kw)
    assert all(d[t] == lp for t, lp, d in zip(got.token_ids, got.token_logprobs, got.logprobs))
    sizes = {len(d) for d in got.logprobs}
    assert sizes <= {1, 2} and 2 in sizes, sizes
