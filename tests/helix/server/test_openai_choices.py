"""``n``, ``logit_bias`` and ``echo`` on the live OpenAI API, as vLLM answers them: the
``openai`` client where it can say it, raw HTTP for streams. Echo's prompt logprobs against
``transformers``' ``log_softmax`` over the same prompt; three real workers, the coordinator and
uvicorn in this process."""

from __future__ import annotations

import json

import pytest

from tests.builders.serving import PROMPTS
from tests.builders.stack import MODEL_NAME

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
torch = pytest.importorskip("torch")

pytestmark = pytest.mark.timeout(180)

LOGPROB_ATOL = 2e-4


@pytest.fixture(scope="module")
def stack(tiny_stack):
    return tiny_stack


@pytest.fixture(scope="module")
def client(openai_client):
    return openai_client


def _stream(url: str, path: str, body: dict) -> list[dict]:
    """Every SSE data object of a streamed reply (``[DONE]`` checked and dropped)."""
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200, r.read()
        lines = [ln[len("data: "):] for ln in r.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(ln) for ln in lines[:-1]]


def _by_index(chunks: list[dict], key: str = "text") -> dict[int, str]:
    out: dict[int, str] = {}
    for ch in chunks:
        for c in ch["choices"]:
            text = c[key] if key == "text" else (c["delta"].get("content") or "")
            out[c["index"]] = out.get(c["index"], "") + text
    return out


# --- n ---------------------------------------------------------------------------------------------
def test_n_sequences_with_derived_seeds(stack, client):
    ask = dict(model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=8, temperature=1.0, seed=7,
               extra_body={"ignore_eos": True})
    three = client.completions.create(n=3, **ask)
    assert [c.index for c in three.choices] == [0, 1, 2]
    texts = [c.text for c in three.choices]
    assert len(set(texts)) == 3, texts                       # distinct seeds, distinct draws
    assert [c.text for c in client.completions.create(n=3, **ask).choices] == texts   # reproducible
    for j in range(3):   # sequence j draws as a single request seeded seed + j
        one = client.completions.create(n=1, **{**ask, "seed": 7 + j})
        assert one.choices[0].text == texts[j]
    prompt_tokens = one.usage.prompt_tokens
    assert three.usage.prompt_tokens == prompt_tokens           # the prompt counts once
    assert three.usage.completion_tokens == 24
    chat = client.chat.completions.create(model=MODEL_NAME, n=2, max_tokens=5, temperature=0,
                                          messages=[{"role": "user", "content": PROMPTS[1]}],
                                          extra_body={"ignore_eos": True})
    assert [c.index for c in chat.choices] == [0, 1]
    assert chat.choices[0].message.content == chat.choices[1].message.content   # greedy
    assert chat.usage.completion_tokens == 10


def test_n_streams_every_choice_by_index(stack, client):
    body = {"model": MODEL_NAME, "prompt": [PROMPTS[0], PROMPTS[2]], "n": 2, "max_tokens": 6,
            "temperature": 1.0, "seed": 3, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    whole = httpx.post(stack.url + "/v1/completions", json=body | {"stream_options": None},
                       timeout=60).json()
    chunks = _stream(stack.url, "/v1/completions", body)
    assert _by_index(chunks) == {c["index"]: c["text"] for c in whole["choices"]}
    finishes = [c["index"] for ch in chunks for c in ch["choices"] if c["finish_reason"]]
    assert sorted(finishes) == [0, 1, 2, 3]
    assert chunks[-1]["usage"] == whole["usage"]
    assert whole["usage"]["completion_tokens"] == 24
    chat = _stream(stack.url, "/v1/chat/completions",
                   {"model": MODEL_NAME, "n": 3, "max_tokens": 4, "temperature": 0,
                    "messages": [{"role": "user", "content": PROMPTS[3]}]})
    roles = [c["index"] for ch in chat for c in ch["choices"] if c["delta"].get("role")]
    assert sorted(roles) == [0, 1, 2]
    texts = _by_index(chat, "delta")
    assert len(texts) == 3 and len(set(texts.values())) == 1   # greedy: the same three times


def test_bad_n_is_a_400(client):
    for n in (0, 129):
        with pytest.raises(openai.BadRequestError, match="n must be in"):
            client.completions.create(model=MODEL_NAME, prompt="x", n=n, max_tokens=1)


# --- logit_bias ----------------------------------------------------------------------------------
def test_logit_bias_forces_and_bans_tokens(stack, client):
    ask = dict(model=MODEL_NAME, prompt=PROMPTS[4], max_tokens=4, temperature=0,
               logprobs=0, extra_body={"return_tokens_as_token_ids": True, "ignore_eos": True})
    plain = client.completions.create(**ask)
    greedy = [int(t.removeprefix("token_id:")) for t in plain.choices[0].logprobs.tokens]
    banned = client.completions.create(logit_bias={str(greedy[0]): -100}, **ask)
    first = int(banned.choices[0].logprobs.tokens[0].removeprefix("token_id:"))
    assert first != greedy[0]
    forced = client.completions.create(logit_bias={"77": 100}, **ask)
    assert forced.choices[0].logprobs.tokens == ["token_id:77"] * 4
    chat = client.chat.completions.create(model=MODEL_NAME, max_tokens=3, temperature=0,
                                          logit_bias={"77": 100},
                                          messages=[{"role": "user", "content": "hi"}])
    assert chat.choices[0].message.content == stack.coordinator.codec.decode([77] * 3)


@pytest.mark.parametrize("bias, message", [
    ({"999999": 5}, "outside the vocabulary"), ({"5": 101}, "must be in [-100, 100]"),
    ({"5": -100.5}, "must be in [-100, 100]"), ({"abc": 1}, "must be token ids"),
    ({"-3": 1}, "must be token ids"), ({"5": "3"}, "logit_bias.5"), ({"5": True}, "logit_bias.5")])
def test_bad_logit_bias_is_a_400(client, bias, message):
    with pytest.raises(openai.BadRequestError, match=message.replace("[", r"\[").replace("]", r"\]")):
        client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=1, logit_bias=bias)


# --- echo ----------------------------------------------------------------------------------------
def _hf_logprobs(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)


def test_echo_with_logprobs_equals_transformers(stack, client, tiny_model):
    codec = stack.coordinator.codec
    prompt = PROMPTS[2]
    ids = codec.encode(prompt)
    reply = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=3, temperature=0,
                                      echo=True, logprobs=2,
                                      extra_body={"return_tokens_as_token_ids": True})
    choice = reply.choices[0]
    lp = choice.logprobs
    generated = [int(t.removeprefix("token_id:")) for t in lp.tokens[len(ids):]]
    assert choice.text == prompt + codec.decode(generated) and len(generated) == 3
    assert lp.tokens[:len(ids)] == [f"token_id:{t}" for t in ids]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    want = _hf_logprobs(tiny_model[1], ids + generated)
    for i in range(1, len(ids) + 3):   # prompt token i (then the generated ones) from position i - 1
        assert lp.token_logprobs[i] == pytest.approx(float(want[i - 1, (ids + generated)[i]]),
                                                     abs=LOGPROB_ATOL)
        vals, top = want[i - 1].topk(2)
        assert list(lp.top_logprobs[i]) == [f"token_id:{t}" for t in top.tolist()]
        assert list(lp.top_logprobs[i].values()) == pytest.approx(vals.tolist(), abs=LOGPROB_ATOL)
    offsets = [len(codec.decode((ids + generated)[:i])) for i in range(len(ids) + 3)]
    assert lp.text_offset == offsets
    # Streamed: the same text and logprobs, the prompt's in the first chunk.
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 3, "temperature": 0, "echo": True,
            "logprobs": 2, "return_tokens_as_token_ids": True}
    chunks = _stream(stack.url, "/v1/completions", body)
    assert chunks[0]["choices"][0]["text"].startswith(prompt)
    joined = {k: [x for ch in chunks if ch["choices"][0]["logprobs"]
                  for x in ch["choices"][0]["logprobs"][k]]
              for k in ("tokens", "token_logprobs", "text_offset")}
    assert joined == {"tokens": lp.tokens, "token_logprobs": lp.token_logprobs,
                      "text_offset": lp.text_offset}
    assert "".join(ch["choices"][0]["text"] for ch in chunks) == choice.text


def test_echo_without_logprobs_and_echo_alone(stack, client):
    prompt = PROMPTS[5]
    plain = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=4, temperature=0)
    echoed = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=4, temperature=0,
                                       echo=True)
    assert echoed.choices[0].text == prompt + plain.choices[0].text
    assert echoed.choices[0].logprobs is None
    assert echoed.usage == plain.usage
    alone = client.completions.create(model=MODEL_NAME, prompt=[prompt, PROMPTS[6]], max_tokens=0,
                                      echo=True, logprobs=1)
    assert [c.text for c in alone.choices] == [prompt, PROMPTS[6]]
    assert alone.usage.completion_tokens == 0
    codec = stack.coordinator.codec
    assert len(alone.choices[0].logprobs.tokens) == len(codec.encode(prompt))
    with pytest.raises(openai.BadRequestError, match="max_tokens must be >= 1"):
        client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=0)
