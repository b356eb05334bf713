"""``helix.Client`` over the coordinator's gRPC service: leaving a stream early frees the request's KV on
every stage (sync and async), and ``sampling_params=`` takes any object with vLLM's attribute names."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import pytest

from helix.client import Client

from tests.builders.serving import PROMPTS
from tests.builders.stack import local_stack

pytestmark = pytest.mark.timeout(120)

MAX_TOKENS = 400   # far more than the 2 read before leaving: the request must end by cancellation


@pytest.fixture(scope="module")
def stack(tiny_model):
    with local_stack(tiny_model[0]) as s:
        yield s


def _wait_cancelled(stack, tokens_before: int, timeout_s: float = 10.0) -> None:
    """KV free on every stage, and the request ended with far fewer tokens than it asked for."""
    stack.wait_kv_free(timeout_s)
    deadline = time.monotonic() + timeout_s
    while stack.generated_tokens() == tokens_before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert 2 <= stack.generated_tokens() - tokens_before < MAX_TOKENS


def test_breaking_out_of_a_stream_frees_kv_on_every_stage(stack):
    before = stack.generated_tokens()
    with Client(stack.grpc.address, timeout_s=60) as c:
        for i, chunk in enumerate(c.stream(PROMPTS[2], temperature=0, max_tokens=MAX_TOKENS,
                                           ignore_eos=True)):
            assert chunk.finish_reason is None
            if i == 1:
                assert stack.kv_blocks_used()["cpu-0"] > 0   # the request is running
                break
        _wait_cancelled(stack, before)


def test_breaking_out_of_an_async_stream_frees_kv_on_every_stage(stack):
    before = stack.generated_tokens()

    async def read_two():
        c = Client(stack.grpc.address, timeout_s=60)
        try:
            n = 0
            async for _ in c.astream(PROMPTS[3], temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True):
                n += 1
                if n == 2:
                    assert stack.kv_blocks_used()["cpu-0"] > 0
                    break
            # the abandoned generator is closed by the event loop (asyncgen finalizer): keep it running
            await asyncio.to_thread(_wait_cancelled, stack, before)
        finally:
            await c.aclose()
            c.close()
    asyncio.run(read_two())


@dataclass
class VllmLikeParams:
    """Stand-in for ``vllm.SamplingParams`` (vLLM is not installable here): its attribute names and
    defaults, plus attributes Helix does not take (``n``, ``skip_special_tokens``)."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    skip_special_tokens: bool = True


def test_sampling_params_duck_typed_like_vllm(stack):
    with Client(stack.grpc.address, timeout_s=60) as c:
        # A prompt whose greedy output spells enough text to cut with a stop string (the random
        # model also picks ids past the tokenizer's 300, which spell nothing).
        for prompt in PROMPTS:
            want = c.generate(prompt, temperature=0, max_tokens=10, ignore_eos=True)
            if len(want.text) >= 6:
                break
        assert len(want.text) >= 6, want.text
        got = c.generate(prompt, VllmLikeParams(temperature=0, max_tokens=10, ignore_eos=True))
        assert (got.text, got.token_ids, got.finish_reason) == (want.text, want.token_ids, "length")
        # seeded sampling, penalties and stop strings all come from the object's attributes
        params = VllmLikeParams(temperature=0.8, top_p=0.9, top_k=20, seed=7, max_tokens=10,
                                ignore_eos=True, repetition_penalty=1.1, presence_penalty=0.2)
        kw = {k: getattr(params, k) for k in ("temperature", "top_p", "top_k", "seed", "max_tokens",
                                              "ignore_eos", "repetition_penalty", "presence_penalty")}
        assert c.generate(prompt, params).token_ids == c.generate(prompt, **kw).token_ids
        stop = want.text[3:5]
        cut = c.generate(prompt, VllmLikeParams(temperature=0, max_tokens=10, ignore_eos=True, stop=[stop]))
        assert cut.finish_reason == "stop" and cut.text == want.text[:want.text.find(stop)]
        # keywords override the object, ``stop=`` its stop strings
        short = c.generate(prompt, VllmLikeParams(temperature=0, max_tokens=10, stop=[stop]),
                           max_tokens=2, stop=[], ignore_eos=True)
        assert short.token_ids == want.token_ids[:2] and short.finish_reason == "length"
        stop_id = want.token_ids[4]
        by_id = c.generate(prompt, VllmLikeParams(temperature=0, max_tokens=10, ignore_eos=True,
                                                  stop_token_ids=[stop_id]))
        assert by_id.token_ids == want.token_ids[:want.token_ids.index(stop_id) + 1]
