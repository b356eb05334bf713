"""Prompt logprobs (vLLM's ``prompt_logprobs``, what ``echo`` with ``logprobs`` returns) and
``logit_bias`` in the engine, against transformers on the same weights: prompts cut into many
prefill chunks, over chained slices, with preemption and recompute (each position scored once)."""

from __future__ import annotations

import pytest
import torch

from helix.net.sampling import SamplingParams
from worker.engine import SliceEngine
from worker.engine_config import EngineConfig
from worker.local_pipeline import LocalPipeline, Prompt

from tests.worker.test_engine_oracle import LOGPROB_ATOL


def _chain(ckpt, **cfg):
    config = EngineConfig(eos_token_ids=(2,), **cfg)
    engines = [SliceEngine.from_checkpoint(ckpt, s, e, config) for s, e in ((0, 3), (2, 6), (6, 8))]
    return LocalPipeline(engines, enter_layers=[None, 3, None])


def _hf_logprobs(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)


@pytest.mark.parametrize("cfg", [
    dict(max_num_batched_tokens=7),
    # 24 blocks of 8 tokens for 6 requests of up to ~120 + 24 tokens: preemption and recompute.
    dict(max_num_batched_tokens=16, num_kv_blocks=24, block_size_tokens=8),
], ids=["7-token-chunks", "tiny-kv-preemption"])
def test_prompt_logprobs_equal_transformers(tiny_ckpt, prompts, cfg):
    ckpt, model = tiny_ckpt
    pipe = _chain(ckpt, **cfg)
    chosen = prompts[:6]
    asks = [None, 0, 3, 3, 1, 5]   # None: not asked (the engine scores nothing)
    got = pipe.run([Prompt(f"r{i}", tuple(ids), SamplingParams(temperature=0, max_tokens=24,
                                                                prompt_logprobs=k))
                    for i, (ids, k) in enumerate(zip(chosen, asks))])
    assert [len(got[f"r{i}"]) for i in range(6)] == [24] * 6
    if "num_kv_blocks" in cfg:
        assert any(e.policy.num_preemptions_total for e in pipe.engines), "test did not preempt"
    for i, (ids, k) in enumerate(zip(chosen, asks)):
        scored = pipe.prompt_logprobs.get(f"r{i}", ())
        if k is None:
            assert scored == ()
            continue
        want = _hf_logprobs(model, ids)
        assert [s.token_id for s in scored] == list(ids[1:])
        for pos, s in enumerate(scored):   # position pos's logits score token pos + 1
            assert s.logprob == pytest.approx(float(want[pos, ids[pos + 1]]), abs=LOGPROB_ATOL)
            vals, top = want[pos].topk(k) if k else (torch.empty(0), torch.empty(0, dtype=torch.long))
            assert [t for t, _ in s.top_logprobs] == top.tolist()
            assert [v for _, v in s.top_logprobs] == pytest.approx(vals.tolist(), abs=LOGPROB_ATOL)


def test_logit_bias_moves_greedy_choices(tiny_ckpt, prompts):
    ckpt, model = tiny_ckpt
    ids = prompts[3]
    greedy = int(_hf_logprobs(model, ids)[-1].argmax())
    pipe = _chain(ckpt)
    got = pipe.run([Prompt("ban", tuple(ids), SamplingParams(temperature=0, max_tokens=1,
                                                             logit_bias=((greedy, -100.0),))),
                    Prompt("force", tuple(ids), SamplingParams(temperature=0, max_tokens=5,
                                                               logit_bias={17: 100.0}))])
    assert got["ban"] != [greedy]
    assert got["force"] == [17] * 5
