"""Sampling against Hugging Face's logits processors (outside oracle) and vLLM's documented rules."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (MinPLogitsWarper, RepetitionPenaltyLogitsProcessor,
                                                    TemperatureLogitsWarper, TopKLogitsWarper,
                                                    TopPLogitsWarper)

from helix.core.errors import HelixUserError
from helix.net.sampling import SamplingParams
from worker.sampling import Sampler, processed_probs

VOCAB = 50


@pytest.fixture
def logits():
    torch.manual_seed(0)
    return torch.randn(VOCAB) * 3


def _hf_probs(logits, *warpers):
    scores = logits[None].clone()
    for w in warpers:
        scores = w(None, scores)
    return torch.softmax(scores, dim=-1)[0]


@pytest.mark.parametrize("params,warpers", [
    (SamplingParams(temperature=0.7), [TemperatureLogitsWarper(0.7)]),
    (SamplingParams(temperature=1.3, top_k=7), [TemperatureLogitsWarper(1.3), TopKLogitsWarper(7)]),
    (SamplingParams(top_p=0.8), [TopPLogitsWarper(0.8)]),
    (SamplingParams(temperature=0.5, top_k=10, top_p=0.6),
     [TemperatureLogitsWarper(0.5), TopKLogitsWarper(10), TopPLogitsWarper(0.6)]),
    (SamplingParams(min_p=0.05), [MinPLogitsWarper(0.05)]),
])
def test_processed_distribution_matches_hf_warpers(logits, params, warpers):
    assert torch.allclose(processed_probs(logits, params), _hf_probs(logits, *warpers), atol=1e-6)


def test_repetition_penalty_matches_hf(logits):
    sampler = Sampler()
    st = sampler.new_state(SamplingParams(temperature=0, repetition_penalty=1.7), [3, 4, 5])
    st.output_token_ids.extend([5, 9])
    ours = sampler._penalize(logits[None].clone(), [st])[0]
    hf = RepetitionPenaltyLogitsProcessor(1.7)(torch.tensor([[3, 4, 5, 5, 9]]), logits[None].clone())[0]
    assert torch.allclose(ours, hf)


def test_presence_and_frequency_penalties_follow_vllm_formula(logits):
    sampler = Sampler()
    st = sampler.new_state(SamplingParams(presence_penalty=0.5, frequency_penalty=0.25), [7, 7])
    st.output_token_ids.extend([3, 3, 3, 8])
    ours = sampler._penalize(logits[None].clone(), [st])[0]
    expected = logits.clone()
    expected[3] -= 0.5 + 3 * 0.25
    expected[8] -= 0.5 + 0.25
    assert torch.allclose(ours, expected)     # prompt tokens (7) are not penalised


def test_greedy_is_argmax_and_seeded_draws_repeat(logits):
    sampler = Sampler(seed=123)
    rows = torch.stack([logits, logits, logits])
    states = [sampler.new_state(SamplingParams(temperature=0)),
              sampler.new_state(SamplingParams(temperature=1.0, seed=7)),
              sampler.new_state(SamplingParams(temperature=1.0, seed=7))]
    first = [t.token_id for t in sampler.sample(rows, states)]
    assert first[0] == int(logits.argmax())
    assert first[1] == first[2]               # same seed, own generator: same draw
    again = Sampler(seed=999)
    states2 = [again.new_state(SamplingParams(temperature=1.0, seed=7))]
    assert again.sample(logits[None], states2)[0].token_id == first[1]


def test_draws_follow_the_processed_distribution(logits):
    params = SamplingParams(temperature=0.8, top_k=5, seed=1)
    sampler = Sampler()
    st = sampler.new_state(params)
    counts = torch.zeros(VOCAB)
    for _ in range(3000):
        counts[sampler.sample(logits[None], [st])[0].token_id] += 1
    expected = processed_probs(logits, params)
    assert set(counts.nonzero().flatten().tolist()) <= set(expected.nonzero().flatten().tolist())
    assert torch.allclose(counts / counts.sum(), expected, atol=0.03)


def test_min_tokens_masks_eos_and_stop_tokens():
    sampler = Sampler(eos_token_ids=[2])
    logits = torch.zeros(1, 10)
    logits[0, 2], logits[0, 4], logits[0, 6] = 10.0, 9.0, 1.0
    st = sampler.new_state(SamplingParams(temperature=0, min_tokens=2, stop_token_ids=(4,)))
    assert sampler.sample(logits, [st])[0].token_id == 6
    st.output_token_ids.extend([6, 6])
    assert sampler.sample(logits, [st])[0].token_id == 2


def test_logprobs_are_raw_model_logprobs(logits):
    sampler = Sampler()
    st = sampler.new_state(SamplingParams(temperature=0, logprobs=3, repetition_penalty=2.0), [0])
    tok = sampler.sample(logits[None], [st])[0]
    raw = torch.log_softmax(logits, dim=-1)
    assert tok.logprob == pytest.approx(float(raw[tok.token_id]))
    assert [t for t, _ in tok.top_logprobs] == raw.topk(3).indices.tolist()


@pytest.mark.parametrize("kwargs", [dict(temperature=-1), dict(top_p=0), dict(max_tokens=0),
                                    dict(min_tokens=5, max_tokens=2), dict(repetition_penalty=0)])
def test_bad_params_are_user_errors(kwargs):
    with pytest.raises(HelixUserError, match="sampling params"):
        SamplingParams(**kwargs)
