"""A failure tied to one request fails only that request: refused inputs and a step that raises are
reported by ``take_failures`` and the engine keeps serving the others; bad sampling values are refused
where ``SamplingParams`` is built; tiny temperatures sample greedily."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest
import torch

from helix.core.errors import HelixUserError
from worker.engine import SliceEngine
from worker.engine_config import EngineConfig
from helix.net.io_types import NewRequest, StageInput
from helix.net.sampling import SamplingParams
from worker.sampling import Sampler


def _input(rid, ids, params: SamplingParams) -> StageInput:
    new = NewRequest(rid, len(ids), params, tuple(ids))
    return StageInput(rid, 0, token_ids=tuple(ids), new_request=new)


def _run(engine: SliceEngine, inputs, max_steps: int = 500):
    """Step a whole-model engine until idle: (tokens by request, failures by request)."""
    tokens, failures = defaultdict(list), {}
    pending = list(inputs)
    for _ in range(max_steps):
        for o in engine.step(pending):
            tokens[o.request_id].append(o.token.token_id)
        pending = []
        failures.update((f.request_id, f.message) for f in engine.take_failures())
        if not engine.has_work():
            return dict(tokens), failures
    raise AssertionError("engine did not go idle")


@pytest.fixture
def engine(tiny_ckpt):
    return SliceEngine.from_checkpoint(tiny_ckpt[0], 0, 8, EngineConfig(eos_token_ids=(2,)))


GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


def _solo(tiny_ckpt, prompts):
    fresh = SliceEngine.from_checkpoint(tiny_ckpt[0], 0, 8, EngineConfig(eos_token_ids=(2,)))
    return _run(fresh, [_input(f"g{i}", p, GREEDY) for i, p in enumerate(prompts)])[0]


@pytest.mark.parametrize("bad_params,bad_prompt,match", [
    (SamplingParams(temperature=0, max_tokens=8, min_tokens=1, stop_token_ids=(100000,)), None,
     r"stop_token_ids \[100000\] outside the vocabulary \[0, 320\)"),
    (SamplingParams(temperature=0, max_tokens=8, logprobs=10**6), None, "logprobs=1000000 exceeds"),
    (GREEDY, (1, 99999, 5), r"token ids \[99999\] outside the vocabulary"),
    (GREEDY, (1, -5, 5), r"token ids \[-5\] outside the vocabulary"),
], ids=["oov-stop-token", "huge-logprobs", "oov-prompt-id", "negative-prompt-id"])
def test_refused_request_fails_alone(tiny_ckpt, prompts, engine, bad_params, bad_prompt, match):
    good = prompts[:3]
    inputs = [_input(f"g{i}", p, GREEDY) for i, p in enumerate(good)]
    inputs.insert(1, _input("bad", bad_prompt or prompts[3], bad_params))
    tokens, failures = _run(engine, inputs)
    assert list(failures) == ["bad"]
    assert pytest.importorskip("re").search(match, failures["bad"]), failures["bad"]
    assert tokens == _solo(tiny_ckpt, good)
    assert engine.blocks.num_used_blocks == 0


def test_step_that_raises_fails_its_requests_and_the_engine_goes_on(tiny_ckpt, prompts, engine,
                                                                    monkeypatch):
    real = engine.model.forward
    calls = []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return real(*args, **kwargs)
    monkeypatch.setattr(engine.model, "forward", flaky)
    tokens, failures = _run(engine, [_input(f"x{i}", p, GREEDY) for i, p in enumerate(prompts[:2])])
    assert set(failures) == {"x0", "x1"} and tokens == {}
    assert "RuntimeError: boom" in failures["x0"] and engine.num_failed_steps == 1
    assert engine.blocks.num_used_blocks == 0
    # Later requests run exactly as on a fresh engine.
    assert _run(engine, [_input(f"g{i}", p, GREEDY) for i, p in enumerate(prompts[2:4])]) == \
        (_solo(tiny_ckpt, prompts[2:4]), {})


def test_input_out_of_order_fails_only_its_request(prompts, engine):
    """A lost message (position gap) on a running request."""
    engine.step([_input("a", prompts[0], GREEDY), _input("b", prompts[1], GREEDY)])
    engine.take_failures()
    engine.step([StageInput("a", 999, token_ids=(5,))])
    [failure] = engine.take_failures()
    assert failure.request_id == "a" and "position 999" in failure.message
    tokens, failures = _run(engine, [])
    assert failures == {} and len(tokens["b"]) >= 1


@pytest.mark.parametrize("kwargs,field", [
    (dict(seed=2**64), "seed"), (dict(seed=True), "seed"), (dict(seed=1.5), "seed"),
    (dict(max_tokens=True), "max_tokens"), (dict(max_tokens=2.0), "max_tokens"),
    (dict(max_tokens=2**63), "max_tokens"), (dict(top_k=-2**70), "top_k"),
    (dict(logprobs=False), "logprobs"),
    (dict(stop_token_ids=[-1]), "stop_token_ids"), (dict(stop_token_ids=[2**63]), "stop_token_ids"),
    (dict(stop_token_ids=["a"]), "stop_token_ids"), (dict(stop_token_ids=7), "stop_token_ids"),
    (dict(temperature=float("nan")), "temperature"), (dict(temperature=float("inf")), "temperature"),
    (dict(temperature="1"), "temperature"), (dict(top_p=True), "top_p"),
    (dict(ignore_eos=1), "ignore_eos"),
])
def test_sampling_params_refuse_bad_types_and_ranges(kwargs, field):
    with pytest.raises(HelixUserError, match=f"sampling params: {field}"):
        SamplingParams(**kwargs)


def test_int64_edges_are_accepted():
    p = SamplingParams(seed=-2**63, stop_token_ids=[2**63 - 1], top_k=2**63 - 1)
    assert p.stop_token_ids == (2**63 - 1,)


@pytest.mark.parametrize("temperature", [1e-45, 1e-30, 1e-8, 9.9e-6])
def test_temperature_below_epsilon_is_greedy(temperature):
    logits = torch.randn(4, 320, generator=torch.Generator().manual_seed(0)) * 20
    logits[:, 0] = -50.0   # NaN probabilities used to draw token 0
    params = SamplingParams(temperature=temperature, seed=3)
    assert params.greedy
    sampler = Sampler()
    got = [t.token_id for t in sampler.sample(logits, [sampler.new_state(params) for _ in range(4)])]
    assert got == logits.argmax(dim=-1).tolist()


def test_epsilon_temperature_still_samples():
    assert not SamplingParams(temperature=1e-5).greedy


def test_hidden_states_of_the_wrong_width_fail_only_their_request(tiny_ckpt, prompts):
    """A later stage (layers [4, 8)) given one request's hidden states of the wrong width."""
    first = SliceEngine.from_checkpoint(tiny_ckpt[0], 0, 4, EngineConfig())
    last = SliceEngine.from_checkpoint(tiny_ckpt[0], 4, 8, EngineConfig(eos_token_ids=(2,)))
    outs = first.step([_input(f"r{i}", p, GREEDY) for i, p in enumerate(prompts[:2])])
    assert len(outs) == 2
    inputs = [StageInput(o.request_id, o.start_position, hidden_states=o.hidden_states,
                         new_request=o.new_request) for o in outs]
    inputs[0] = dataclasses.replace(inputs[0], hidden_states=inputs[0].hidden_states[:, :10])
    tokens = last.step(inputs)
    [failure] = last.take_failures()
    assert failure.request_id == "r0" and "expected [num_tokens, 64]" in failure.message
    assert [t.request_id for t in tokens] == ["r1"]


def test_a_kv_pool_larger_than_the_free_device_memory_is_one_clear_line():
    from worker.engine_config import check_pool_fits
    check_pool_fits(2 * 2**30, 3 * 2**30, 1000, "cuda:0")
    with pytest.raises(HelixUserError, match=r"KV pool \(1000 blocks, 4.00 GiB\) does not fit in the "
                                             r"3.00 GiB free on cuda:0 .*gpu_memory_utilization"):
        check_pool_fits(4 * 2**30, 3 * 2**30, 1000, "cuda:0")
