"""Structured output on the engine: the last stage samples only what keeps the reply a
prefix of its regex and stops once it is complete; a request moved to another pipeline resumes its
automaton from the tokens it had; a compiling regex holds only its own request; a regex that cannot
be built fails only its request. The demo checkpoint (random weights, its real tokenizer)."""

from __future__ import annotations

import json
import re
import threading
import time
from collections import defaultdict

import pytest

pytest.importorskip("outlines_core")
pytest.importorskip("transformers")

from helix.net.io_types import NewRequest, StageInput  # noqa: E402
from helix.net.sampling import SamplingParams  # noqa: E402
from helix.server.structured import guided_regex  # noqa: E402
from worker.engine import SliceEngine  # noqa: E402
from worker.engine_config import EngineConfig  # noqa: E402

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 6}, "ok": {"type": "boolean"},
    "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
    "required": ["name", "ok", "tags"]}
REGEX = guided_regex({"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA}})
PROMPT = (1, 40, 41, 42, 43)


@pytest.fixture(scope="module")
def demo_ckpt(tmp_path_factory):
    from helix.commands.demo_checkpoint import write_tiny_checkpoint
    path = tmp_path_factory.mktemp("guided_ckpt")
    write_tiny_checkpoint(path)
    return path


@pytest.fixture(scope="module")
def codec(demo_ckpt):
    from coordinator.textcodec import TextCodec
    return TextCodec(demo_ckpt)


def _engine(ckpt) -> SliceEngine:
    engine = SliceEngine.from_checkpoint(ckpt, 0, 8, EngineConfig(eos_token_ids=(2,)))
    assert engine.weights.is_first and engine.weights.is_last
    return engine


def _input(rid, ids, params: SamplingParams) -> StageInput:
    return StageInput(rid, 0, token_ids=tuple(ids), new_request=NewRequest(rid, len(ids), params,
                                                                          tuple(ids)))


def _run(engine: SliceEngine, inputs, max_steps: int = 2000, on_step=None):
    """Step until idle: (tokens by request, finish reasons, failures)."""
    tokens, reasons, failures = defaultdict(list), {}, {}
    pending = list(inputs)
    for i in range(max_steps):
        for o in engine.step(pending):
            tokens[o.request_id].append(o.token.token_id)
            if o.finish_reason:
                reasons[o.request_id] = o.finish_reason
        pending = []
        failures.update((f.request_id, f.message) for f in engine.take_failures())
        if on_step is not None:
            on_step(i, tokens)
        if not engine.has_work():
            if not engine._held:
                return dict(tokens), reasons, failures
            time.sleep(0.005)   # an automaton compiles: the worker's loop polls like this
    raise AssertionError("engine did not go idle")


def _text(codec, ids) -> str:
    return codec.decode([t for t in ids if t != 2])


@pytest.mark.parametrize("temperature,seed", [(0.0, None), (1.0, 1), (1.0, 7), (1.3, 3)])
def test_every_reply_matches_its_schema_and_stops_there(demo_ckpt, codec, temperature, seed):
    params = SamplingParams(temperature=temperature, seed=seed, max_tokens=200, guided_regex=REGEX)
    tokens, reasons, failures = _run(_engine(demo_ckpt), [_input("r", PROMPT, params)])
    assert not failures and reasons["r"] == "stop"
    text = _text(codec, tokens["r"])
    assert re.fullmatch(REGEX, text), text
    doc = json.loads(text)
    assert set(doc) == {"name", "ok", "tags"} and isinstance(doc["ok"], bool)
    assert len(doc["name"]) <= 6 and set(doc["tags"]) <= {"a", "b"} and len(doc["tags"]) <= 2


def test_without_the_regex_the_same_sampling_is_no_json(demo_ckpt, codec):
    """The test above can fail: the random model left free does not write JSON."""
    params = SamplingParams(temperature=0.0, max_tokens=40)
    tokens, _, _ = _run(_engine(demo_ckpt), [_input("r", PROMPT, params)])
    with pytest.raises(ValueError):
        json.loads(_text(codec, tokens["r"]))


@pytest.mark.parametrize("cut", [1, 5, 12])
def test_a_moved_request_resumes_its_automaton(demo_ckpt, cut):
    """After a failover the new last stage gets prompt + the tokens generated so far, and
    ``guided_resume_tokens`` says how many of them to walk: it continues as if never moved."""
    params = SamplingParams(temperature=0.0, max_tokens=200, guided_regex=REGEX)
    whole, _, _ = _run(_engine(demo_ckpt), [_input("r", PROMPT, params)])
    done = whole["r"][:cut]
    moved = SamplingParams(temperature=0.0, max_tokens=200 - cut, guided_regex=REGEX,
                           guided_resume_tokens=cut)
    rest, reasons, failures = _run(_engine(demo_ckpt), [_input("m", PROMPT + tuple(done), moved)])
    assert not failures and reasons["m"] == "stop"
    assert done + rest["m"] == whole["r"]


def test_a_resumed_prefix_that_breaks_the_format_fails_only_its_request(demo_ckpt):
    bad = SamplingParams(temperature=0.0, max_tokens=20, guided_regex=REGEX, guided_resume_tokens=2)
    plain = SamplingParams(temperature=0.0, max_tokens=5)
    tokens, _, failures = _run(_engine(demo_ckpt), [_input("bad", PROMPT, bad),
                                                    _input("ok", PROMPT, plain)])
    assert "does not continue" in failures["bad"] and len(tokens["ok"]) == 5


def test_a_compiling_regex_holds_only_its_request(demo_ckpt, codec):
    """While its automaton compiles (a slow compile stood in for by busy compile threads), a guided
    request's inputs wait; a plain request beside it runs to the end; then the guided one runs."""
    engine = _engine(demo_ckpt)
    gate = threading.Event()
    for _ in range(engine.guides._pool._max_workers):   # every compile thread busy until the gate opens
        engine.guides._pool.submit(gate.wait)
    guided = SamplingParams(temperature=0.0, max_tokens=200, guided_regex=REGEX)
    plain = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    seen = {}

    def on_step(i, tokens):
        if len(tokens["p"]) == 8 and "plain_done_at" not in seen:
            seen["plain_done_at"] = i
            seen["guided_then"] = len(tokens["g"])
            assert [i.request_id for i in engine._held] == ["g"]
            gate.set()
    tokens, reasons, failures = _run(engine, [_input("g", PROMPT, guided), _input("p", PROMPT, plain)],
                                     on_step=on_step)
    assert seen["guided_then"] == 0 and reasons == {"p": "length", "g": "stop"} and not failures
    json.loads(_text(codec, tokens["g"]))


def test_a_regex_that_cannot_be_built_fails_only_its_request(demo_ckpt):
    bad = SamplingParams(max_tokens=5, guided_regex="(?=a)b")   # look-ahead: no automaton
    plain = SamplingParams(temperature=0.0, max_tokens=5)
    tokens, _, failures = _run(_engine(demo_ckpt), [_input("bad", PROMPT, bad),
                                                    _input("ok", PROMPT, plain)])
    assert "structured output" in failures["bad"] and len(tokens["ok"]) == 5


def test_the_regex_and_resume_count_cross_the_wire():
    """What the last stage needs travels in NewRequest's SamplingParams over the data plane."""
    from helix.net.wire import InputBatch, WireInput, decode, encode
    params = SamplingParams(max_tokens=9, guided_regex=REGEX, guided_resume_tokens=3)
    batch = InputBatch((WireInput(_input(7, PROMPT, params)),))
    got = decode([bytes(f) for f in encode(batch)]).inputs[0].item.new_request.sampling
    assert got == params


# outlines-core 0.2.14 over the demo vocabulary: a string with maxLength 14 compiles in ~1 s, 20 ran
# past 60 s, 10^8 grew 200 MB/s until the machine ran out of memory.
NEVER_COMPILES = guided_regex({"type": "json_schema", "json_schema": {"name": "t", "schema": {
    "type": "string", "maxLength": 10**8}}})


@pytest.mark.timeout(60)
def test_a_regex_that_never_compiles_fails_its_request_in_bounded_time_and_memory(demo_ckpt):
    """An ordinary schema whose automaton explodes fails only its request, once the compile passes
    its time limit (or memory limit); the compile is killed, not left running on a thread."""
    engine = _engine(demo_ckpt)
    engine.guides.compile_timeout_s = 3.0
    slow = SamplingParams(max_tokens=5, guided_regex=NEVER_COMPILES)
    plain = SamplingParams(temperature=0.0, max_tokens=5)
    t0 = time.monotonic()
    tokens, _, failures = _run(engine, [_input("slow", PROMPT, slow), _input("ok", PROMPT, plain)],
                               max_steps=10**6)
    assert time.monotonic() - t0 < 20
    assert "did not compile within 3 s" in failures["slow"] and len(tokens["ok"]) == 5
    # the compile threads are free again: an ordinary schema still compiles and runs
    tokens, reasons, failures = _run(engine, [_input("g", PROMPT, SamplingParams(
        temperature=0.0, max_tokens=200, guided_regex=REGEX))])
    assert reasons == {"g": "stop"} and not failures


@pytest.mark.timeout(60)
def test_a_compile_past_its_memory_limit_fails_its_request(demo_ckpt):
    engine = _engine(demo_ckpt)
    engine.guides.compile_memory_bytes = 1 * 2**30   # NEVER_COMPILES maps ~200 MB more a second
    t0 = time.monotonic()
    tokens, _, failures = _run(engine, [_input("g", PROMPT, SamplingParams(
        max_tokens=5, guided_regex=NEVER_COMPILES))], max_steps=10**6)
    assert time.monotonic() - t0 < 30
    assert "cannot be built" in failures["g"] and "limit 1 GiB" in failures["g"] and not tokens


def test_compiles_under_a_host_address_space_limit_below_the_compile_limit(demo_ckpt):
    """A host whose hard RLIMIT_AS is below COMPILE_MEMORY_BYTES: the child keeps the host's limit
    (raising it is not allowed and failed every compile)."""
    import subprocess
    import sys
    code = ("import resource, sys\n"
            "resource.setrlimit(resource.RLIMIT_AS, (6 * 2**30, 6 * 2**30))\n"
            "from worker.guided import GuideCompiler\n"
            f"g = GuideCompiler({str(demo_ckpt)!r}, [2], 512)\n"
            f"print(g.compile({REGEX!r}).result().initial_state)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    assert run.returncode == 0 and run.stdout.strip().isdigit(), run.stderr[-400:]
