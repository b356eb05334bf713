"""Chat without ``max_tokens`` generates to the end of the context (or the checkpoint's
``generation_config.json`` ``max_new_tokens``), as vLLM does; legacy completions keep 16 (vLLM too).
Such requests reserve KV for the expected output (a running mean), not the whole context, so several
are admitted at once on workers whose KV holds only two contexts; outgrowing the reservation is the
workers' preemption's business, and every token still equals transformers'. Three real workers, the
coordinator and uvicorn in this process; the ``openai`` client."""

from __future__ import annotations

import json
import shutil

import pytest

from coordinator.kv_estimator import OutputLengthMean
from coordinator.runtime import RuntimeConfig
from helix.net.sampling import SamplingParams

from tests.builders.serving import PROMPTS, branching_plan, hf_greedy
from tests.builders.stack import MODEL_NAME, local_stack

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.timeout(300)

CONTEXT = 160
"""The served context (``--max-model-len``; the tiny model's own is 512), short for a fast test."""
KV_TOKENS = 2 * CONTEXT
"""Each worker's KV: two contexts (the high-water mark: 288 tokens)."""


@pytest.fixture(scope="module")
def stack(tiny_model):
    with local_stack(tiny_model[0], RuntimeConfig(stats_interval_s=0.2, max_model_len=CONTEXT),
                     plan=branching_plan(KV_TOKENS)) as s:
        yield s


def _messages(i: int) -> list[dict]:
    return [{"role": "user", "content": PROMPTS[i]}]


def test_chat_without_max_tokens_runs_to_the_end_of_the_context(stack, tiny_model):
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key="none", max_retries=0, timeout=120)
    context = stack.coordinator.codec.max_context_tokens
    assert context == CONTEXT
    reply = client.chat.completions.create(model=MODEL_NAME, messages=_messages(0), temperature=0)
    usage = reply.usage
    assert usage.completion_tokens > 16
    assert usage.prompt_tokens + usage.completion_tokens == context
    assert reply.choices[0].finish_reason == "length"
    ids = stack.coordinator.codec.encode_chat(_messages(0))
    want = hf_greedy(tiny_model[1], ids, context - len(ids))
    assert reply.choices[0].message.content == stack.coordinator.codec.decode(want)
    # Legacy completions keep OpenAI's and vLLM's 16.
    comp = client.completions.create(model=MODEL_NAME, prompt=PROMPTS[1], temperature=0,
                                     extra_body={"ignore_eos": True})
    assert comp.usage.completion_tokens == 16


def test_such_requests_are_admitted_together_and_outgrow_their_reservation(stack, tiny_model):
    coord, codec = stack.coordinator, stack.coordinator.codec
    context = codec.max_context_tokens
    prompts = [codec.encode_chat(_messages(i)) for i in (2, 3, 5)]
    # As a server whose served outputs averaged 24 tokens so far (the earlier tests' ran long).
    coord.output_length = OutputLengthMean(24)
    handles = [coord.submit(ids, SamplingParams(temperature=0, max_tokens=None)) for ids in prompts]
    # Reserving max_tokens (the rest of the context) would have let only one in.
    assert coord.num_waiting == 0 and coord.scheduler.kv.num_reserved() == 3
    for ids, handle in zip(prompts, handles):
        events = list(handle.events(timeout_s=120))
        done = events[-1]
        assert done.error is None and done.finish_reason == "length"
        assert done.prompt_tokens + done.completion_tokens == context
        got = [t for ev in events[:-1] for t in ev.token_ids]
        assert got == hf_greedy(tiny_model[1], ids, context - len(ids))
    assert sum(s.stats().num_preemptions_total for s in stack.servers) > 0, \
        "three whole contexts fit: the test did not make a request outgrow its reservation"
    stack.wait_kv_free()


def test_generation_config_max_new_tokens_is_the_default(tiny_model, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_model[0], ckpt)
    (ckpt / "generation_config.json").write_text(json.dumps({"max_new_tokens": 40}))
    with local_stack(ckpt) as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=60)
        reply = client.chat.completions.create(model=MODEL_NAME, messages=_messages(0), temperature=0,
                                               extra_body={"ignore_eos": True})
        assert reply.usage.completion_tokens == 40 and reply.choices[0].finish_reason == "length"
        longer = client.chat.completions.create(model=MODEL_NAME, messages=_messages(0), max_tokens=50,
                                                temperature=0, extra_body={"ignore_eos": True})
        assert longer.usage.completion_tokens == 50   # a request's own limit wins
