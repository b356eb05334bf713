"""Chat templates through ``helix serve``'s own stack (:class:`ServeStack`: the coordinator's gRPC
service, the codec, the OpenAI HTTP app), with two real workers that register over gRPC as
``helix worker`` does (no Ray): what it says at start, what the chat and ``/tokenize`` routes render,
and greedy replies against ``transformers`` on the same weights and the same prompt ids."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import pytest

httpx = pytest.importorskip("httpx")
transformers = pytest.importorskip("transformers")

from coordinator.chat_template import load_chat_template  # noqa: E402
from helix.server.http import HttpThread  # noqa: E402
from helix.server.stack import ServeOptions, ServeStack  # noqa: E402
from helix.net.control import COORDINATOR_SERVICE, ControlClient  # noqa: E402
from worker.server import WorkerServer  # noqa: E402

from tests.builders.chat_checkpoint import (MULTI_TURN, SYSTEM_USER, TOOL_TEMPLATE,  # noqa: E402
                                            input_ids, write_chat_checkpoint)
from tests.builders.serving import two_stage_plan  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

MODEL = "tiny-chat"
MAX_TOKENS = 8
NODES = ("cpu-0", "cpu-1")


@contextmanager
def serve(ckpt, chat_template=None):
    """``helix serve``'s stack over ``ckpt`` (two workers in this process); yields (HTTP client, the
    lines it printed while starting)."""
    lines: list[str] = []
    stack = ServeStack(two_stage_plan(nodes=NODES), str(ckpt),
                       ServeOptions(model_name=MODEL, external_nodes=NODES, register_timeout_s=120,
                                    chat_template=chat_template), progress=lines.append)
    errors: list[BaseException] = []

    def start():
        try:
            stack.start()
        except BaseException as exc:   # reported by the test's thread
            errors.append(exc)
    starter = threading.Thread(target=start, daemon=True)
    starter.start()
    workers, http = [], None
    try:
        deadline = time.monotonic() + 30
        while stack.grpc is None and starter.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not errors, errors
        workers = [WorkerServer(n, str(ckpt), torch_threads=1) for n in NODES]
        reg = ControlClient(stack.grpc.address, COORDINATOR_SERVICE)
        for w in workers:
            reg.call("Register", w.addresses)
        reg.close()
        starter.join(timeout=150)
        assert not starter.is_alive() and not errors, errors
        http = HttpThread(stack.app)
        with httpx.Client(base_url=http.url, timeout=120) as client:
            yield client, lines
    finally:
        if http is not None:
            http.stop()
        stack.close()
        for w in workers:
            w.shutdown()


def _hf_greedy(model, tok, ids) -> tuple[list[int], str]:
    """``transformers``' greedy tokens after ``ids`` and their text."""
    import torch
    out = model.generate(torch.tensor([list(ids)]), max_new_tokens=MAX_TOKENS, do_sample=False,
                         eos_token_id=tok.eos_token_id, pad_token_id=0)
    new = out[0, len(ids):].tolist()
    return new, tok.decode(new, skip_special_tokens=True)


def _chat(client, messages):
    # The model's vocabulary is larger than its tokenizer's: compare ids, not only the text.
    return client.post("/v1/chat/completions", json={
        "model": MODEL, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0,
        "logprobs": True, "return_tokens_as_token_ids": True})


def _reply(r) -> tuple[list[int], str]:
    choice = r.json()["choices"][0]
    return ([int(t["token"].split(":")[1]) for t in choice["logprobs"]["content"]],
            choice["message"]["content"])


@pytest.fixture(scope="module")
def chat_ckpt(tmp_path_factory):
    """(checkpoint, HF model, HF tokenizer) as transformers 5 saves an instruct model."""
    path = tmp_path_factory.mktemp("saved_chat_ckpt")
    model, _ = write_chat_checkpoint(path)
    return path, model, transformers.AutoTokenizer.from_pretrained(str(path))


def test_saved_checkpoint_chats_as_transformers(chat_ckpt):
    ckpt, model, tok = chat_ckpt
    assert (ckpt / "chat_template.jinja").is_file()
    with serve(ckpt) as (client, lines):
        assert f"chat template: {ckpt / 'chat_template.jinja'}" in lines
        for messages in (SYSTEM_USER, MULTI_TURN):
            want = input_ids(tok.apply_chat_template(messages, add_generation_prompt=True,
                                                     tokenize=True))
            t = client.post("/tokenize", json={"model": MODEL, "messages": messages})
            assert t.status_code == 200 and t.json()["tokens"] == want, t.text
            r = _chat(client, messages)
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["prompt_tokens"] == len(want)
            assert _reply(r) == _hf_greedy(model, tok, want)
        # add_generation_prompt=false on /tokenize: no open assistant turn, as transformers.
        t = client.post("/tokenize", json={"messages": MULTI_TURN, "add_generation_prompt": False})
        assert t.json()["tokens"] == input_ids(tok.apply_chat_template(
            MULTI_TURN, add_generation_prompt=False, tokenize=True))

        # Null content: only an assistant turn may have it, and both routes agree.
        user_null = [{"role": "user", "content": None}]
        r, t = _chat(client, user_null), client.post("/tokenize", json={"messages": user_null})
        assert r.status_code == t.status_code == 400
        assert r.json()["error"]["message"] == t.json()["error"]["message"]
        assert "messages[0]: a user message needs 'content'" in r.json()["error"]["message"]
        turn = [MULTI_TURN[0], {"role": "assistant", "content": None}, MULTI_TURN[2]]
        r, t = _chat(client, turn), client.post("/tokenize", json={"messages": turn})
        assert r.status_code == t.status_code == 200, (r.text, t.text)
        empty = [MULTI_TURN[0], {"role": "assistant", "content": ""}, MULTI_TURN[2]]
        assert t.json()["tokens"] == input_ids(tok.apply_chat_template(
            empty, add_generation_prompt=True, tokenize=True))
        assert r.json()["usage"]["prompt_tokens"] == t.json()["count"]


@pytest.fixture(scope="module")
def bare_ckpt(tmp_path_factory):
    """(checkpoint, HF model, HF tokenizer) of the demo model written without any chat template."""
    from helix.commands.demo_checkpoint import write_tiny_checkpoint
    path = tmp_path_factory.mktemp("no_template_ckpt")
    model = write_tiny_checkpoint(path, chat_template=False)
    return path, model, transformers.AutoTokenizer.from_pretrained(str(path))


def test_without_a_template_chat_is_a_400_naming_the_flag(bare_ckpt):
    ckpt, _, _ = bare_ckpt
    with serve(ckpt) as (client, lines):
        assert any(ln.startswith("chat template: none") and "--chat-template" in ln for ln in lines)
        r = _chat(client, SYSTEM_USER)
        assert r.status_code == 400, r.text
        message = r.json()["error"]["message"]
        assert "no chat template" in message and "--chat-template FILE|STRING" in message
        t = client.post("/tokenize", json={"messages": SYSTEM_USER})
        assert t.status_code == 400 and t.json()["error"]["message"] == message
        r = client.post("/v1/completions", json={"model": MODEL, "prompt": "Helix serves",
                                                 "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200, r.text


def test_chat_template_flag_file_serves_as_transformers(bare_ckpt, tmp_path):
    ckpt, model, tok = bare_ckpt
    path = tmp_path / "tool.jinja"
    path.write_text(TOOL_TEMPLATE)
    with serve(ckpt, load_chat_template(str(path))) as (client, lines):
        assert f"chat template: --chat-template {path}" in lines
        want = input_ids(tok.apply_chat_template(SYSTEM_USER, chat_template=TOOL_TEMPLATE,
                                                 add_generation_prompt=True, tokenize=True))
        assert client.post("/tokenize", json={"messages": SYSTEM_USER}).json()["tokens"] == want
        r = _chat(client, SYSTEM_USER)
        assert r.status_code == 200, r.text
        assert _reply(r) == _hf_greedy(model, tok, want)
