"""``stop_reason`` in completion and chat choices, as vLLM reports it: the stop string that appeared,
the ``stop_token_ids`` id that was sampled, or null (EOS, a length limit). Real workers, coordinator
and HTTP app (:func:`tests.builders.stack.local_stack`); EOS is made certain with ``logit_bias``."""

from __future__ import annotations

import json

import pytest

from tests.builders.serving import PROMPTS
from tests.builders.stack import MODEL_NAME

httpx = pytest.importorskip("httpx")

pytestmark = pytest.mark.timeout(180)

EOS = 2   # the demo checkpoint's eos_token_id


def _post(stack, chat: bool, prompt: str = PROMPTS[0], **body) -> dict:
    body = {"model": MODEL_NAME, "temperature": 0, "max_tokens": 12, **body}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    r = httpx.post(stack.url + ("/v1/chat/completions" if chat else "/v1/completions"), json=body,
                   timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def _text(choice: dict) -> str:
    return choice["message"]["content"] if "message" in choice else choice["text"]


def _with_stop_string(stack, chat: bool) -> tuple[str, str, str]:
    """(prompt, its greedy text, a stop string in it): two characters that first appear after the
    start (the random-weight model often spells incomplete UTF-8, which no stop string can match)."""
    for prompt in PROMPTS:
        text = _text(_post(stack, chat, prompt, ignore_eos=True))
        for i in range(1, len(text) - 1):
            stop = text[i:i + 2]
            if "\ufffd" not in stop and stop.strip() and text.find(stop) == i:
                return prompt, text, stop
    pytest.skip("no greedy reply spells a stop string")


def _ids(stack, n: int) -> list[int]:
    """The greedy completion's first ``n`` token ids."""
    r = httpx.post(stack.url + "/v1/completions", timeout=60, json={
        "model": MODEL_NAME, "prompt": PROMPTS[0], "temperature": 0, "max_tokens": n, "logprobs": 0,
        "ignore_eos": True, "return_tokens_as_token_ids": True})
    return [int(t.split(":")[1]) for t in r.json()["choices"][0]["logprobs"]["tokens"]]


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_stop_reason_names_what_stopped(tiny_stack, chat):
    prompt, text, stop = _with_stop_string(tiny_stack, chat)
    full = _post(tiny_stack, chat, prompt, ignore_eos=True)
    assert (full["finish_reason"], full["stop_reason"]) == ("length", None)
    cut = _post(tiny_stack, chat, prompt, ignore_eos=True, stop=["never-there", stop])
    assert (cut["finish_reason"], cut["stop_reason"]) == ("stop", stop)
    assert _text(cut) == text[:text.find(stop)]
    # EOS (forced by logit_bias): null, even when the id is also a stop token id (EOS is checked
    # first, as in vLLM); with ignore_eos it is the stop token id that stopped it.
    eos = _post(tiny_stack, chat, logit_bias={str(EOS): 100}, stop_token_ids=[EOS])
    assert (eos["finish_reason"], eos["stop_reason"]) == ("stop", None)
    by_id = _post(tiny_stack, chat, logit_bias={str(EOS): 100}, stop_token_ids=[EOS], ignore_eos=True)
    assert (by_id["finish_reason"], by_id["stop_reason"]) == ("stop", EOS)


def test_stop_token_id_of_the_greedy_reply(tiny_stack):
    ids = _ids(tiny_stack, 6)
    stop_id = next(t for t in ids[2:] if t != EOS and t not in ids[:2])
    got = _post(tiny_stack, False, ignore_eos=True, stop_token_ids=[stop_id])
    assert (got["finish_reason"], got["stop_reason"]) == ("stop", stop_id)


def test_a_stop_string_on_the_last_allowed_token_is_a_stop(tiny_stack):
    """The worker ends the request at ``max_tokens`` on the token whose text completes the stop
    string: vLLM reports that as ``stop`` with the string, not ``length``."""
    for prompt in PROMPTS:
        for n in range(2, 12):
            shorter, longer = (_text(_post(tiny_stack, False, prompt, ignore_eos=True, max_tokens=k))
                               for k in (n - 1, n))
            last = longer[len(shorter):]
            if (longer.startswith(shorter) and last.strip() and "\ufffd" not in longer
                    and longer.find(last) == len(shorter)):
                got = _post(tiny_stack, False, prompt, ignore_eos=True, max_tokens=n, stop=[last])
                assert (got["finish_reason"], got["stop_reason"], got["text"]) == ("stop", last, shorter)
                return
    pytest.skip("no token of a greedy reply has text of its own")


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_streamed_finish_chunk_carries_stop_reason(tiny_stack, chat):
    prompt, _, stop = _with_stop_string(tiny_stack, chat)
    body = {"model": MODEL_NAME, "temperature": 0, "max_tokens": 12, "ignore_eos": True,
            "stop": stop, "stream": True}
    body.update({"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt})
    path = "/v1/chat/completions" if chat else "/v1/completions"
    with httpx.stream("POST", tiny_stack.url + path, json=body, timeout=60) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    choices = [c for e in events for c in e["choices"]]
    assert [(c["finish_reason"], c["stop_reason"]) for c in choices if "stop_reason" in c] == \
        [("stop", stop)]
    assert all(c["finish_reason"] is None for c in choices if "stop_reason" not in c)
