"""The engine against Hugging Face transformers on the same random weights (the outside oracle)."""

from __future__ import annotations

import pytest
import torch

from tests.builders.threads import one_torch_thread
from worker.engine import SliceEngine
from worker.engine_config import EngineConfig
from worker.local_pipeline import LocalPipeline, Prompt
from helix.net.sampling import SamplingParams

#: Logits of our float32 engine vs HF float32: same math, different op order (fused projections,
#: paged attention), so differences are rounding only.
LOGPROB_ATOL = 2e-4


def _max_new(i: int) -> int:
    return 3 + (i * 5) % 11


@pytest.fixture(scope="module")
def hf_greedy(tiny_ckpt, prompts):
    """Greedy tokens of LlamaForCausalLM.generate, one request at a time (no padding effects)."""
    _, model = tiny_ckpt
    out = []
    with one_torch_thread():
        for i, ids in enumerate(prompts):
            gen = model.generate(torch.tensor([ids]), max_new_tokens=_max_new(i), do_sample=False,
                                 eos_token_id=2, pad_token_id=0)
            out.append(gen[0, len(ids):].tolist())
    return out


def _requests(prompts, logprobs=None):
    return [Prompt(f"r{i}", tuple(ids), SamplingParams(temperature=0, max_tokens=_max_new(i),
                                                       logprobs=logprobs))
            for i, ids in enumerate(prompts)]


def _chain(ckpt, **cfg):
    """Slices [0,3), [2,6), [6,8): the middle stage enters at layer 3 (layer 2 ran upstream)."""
    config = EngineConfig(eos_token_ids=(2,), **cfg)
    engines = [SliceEngine.from_checkpoint(ckpt, s, e, config) for s, e in ((0, 3), (2, 6), (6, 8))]
    return LocalPipeline(engines, enter_layers=[None, 3, None])


@pytest.mark.parametrize("cfg", [
    dict(chunked_prefill=True, max_num_batched_tokens=24),
    dict(chunked_prefill=False, max_num_batched_tokens=24),
    # 20 blocks of 8 tokens: room for a few requests at once -> preemption and recompute.
    dict(chunked_prefill=True, max_num_batched_tokens=32, num_kv_blocks=20, block_size_tokens=8),
    # The same chunked run through the PyTorch-only attention (the default here is the C kernel).
    dict(chunked_prefill=True, max_num_batched_tokens=24, attention="gather"),
    # Plain decode steps through the static buffers the CUDA graphs capture (run eagerly here).
    dict(chunked_prefill=True, max_num_batched_tokens=24, decode_graphs="eager"),
    dict(chunked_prefill=True, max_num_batched_tokens=32, num_kv_blocks=20, block_size_tokens=8,
         decode_graphs="eager"),
], ids=["chunked", "whole-prompts", "tiny-kv-preemption", "chunked-gather", "decode-graphs-eager",
        "tiny-kv-decode-graphs-eager"])
def test_three_chained_slices_match_hf_generate(tiny_ckpt, prompts, hf_greedy, cfg):
    ckpt, _ = tiny_ckpt
    pipe = _chain(ckpt, **cfg)
    got = pipe.run(_requests(prompts))
    assert [got[f"r{i}"] for i in range(16)] == hf_greedy
    if "decode_graphs" in cfg:   # the first and last stages' plain decode steps took that path
        assert pipe.engines[0].graphs.replays > 0 and pipe.engines[2].graphs.replays > 0
    if "num_kv_blocks" in cfg:
        assert any(e.policy.num_preemptions_total for e in pipe.engines), "test did not preempt"
    for e in pipe.engines:
        assert e.blocks.num_free_blocks == e.blocks.num_blocks   # everything released


def test_single_engine_whole_model_matches_hf(tiny_ckpt, prompts, hf_greedy):
    ckpt, _ = tiny_ckpt
    engine = SliceEngine.from_checkpoint(ckpt, 0, 8, EngineConfig(eos_token_ids=(2,),
                                                                   max_num_batched_tokens=40))
    got = LocalPipeline([engine]).run(_requests(prompts))
    assert [got[f"r{i}"] for i in range(16)] == hf_greedy


def test_logprobs_match_hf_logits(tiny_ckpt, prompts):
    """Raw logprobs of every generated token and the top-5 lists, against HF's forward pass."""
    ckpt, model = tiny_ckpt
    pipe = _chain(ckpt, max_num_batched_tokens=16)
    reqs = _requests(prompts[:6], logprobs=5)
    got = pipe.run(reqs)
    for r in reqs:
        full = torch.tensor([list(r.token_ids) + got[r.request_id]])
        with torch.no_grad():
            ref = torch.log_softmax(model(full).logits[0].float(), dim=-1)
        n = len(r.token_ids)
        for j, tok in enumerate(pipe.logprobs[r.request_id]):
            row = ref[n - 1 + j]
            assert tok.logprob == pytest.approx(float(row[tok.token_id]), abs=LOGPROB_ATOL)
            ref_top = row.topk(5)
            assert [t for t, _ in tok.top_logprobs] == ref_top.indices.tolist()
            assert torch.allclose(torch.tensor([v for _, v in tok.top_logprobs]), ref_top.values,
                                  atol=LOGPROB_ATOL)


def test_tied_sharded_checkpoint_matches_hf(tied_ckpt, prompts):
    ckpt, model = tied_ckpt
    assert (ckpt / "model.safetensors.index.json").is_file()
    config = EngineConfig(max_num_batched_tokens=32)
    engines = [SliceEngine.from_checkpoint(ckpt, 0, 2, config),
               SliceEngine.from_checkpoint(ckpt, 2, 4, config)]
    reqs = [Prompt(i, tuple(ids), SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
            for i, ids in enumerate(prompts[:8])]
    got = LocalPipeline(engines).run(reqs)
    for r in reqs:
        ref = model.generate(torch.tensor([r.token_ids]), max_new_tokens=6, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
        assert got[r.request_id] == ref[0, len(r.token_ids):].tolist()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_chained_slices_on_cuda_match_hf(tiny_ckpt, prompts, hf_greedy):
    ckpt, _ = tiny_ckpt
    pipe = _chain(ckpt, device="cuda", max_num_batched_tokens=24)
    got = pipe.run(_requests(prompts))
    assert [got[f"r{i}"] for i in range(16)] == hf_greedy


def test_per_request_pipelines_with_mixed_entry_layers(tiny_ckpt, prompts, hf_greedy):
    """Helix routes each request on its own path: even requests go [0,3) -> [2,6) entering at 3,
    odd ones [0,2) -> [2,6) entering at 2; both share [2,6) and [6,8), so one step of the middle
    stage mixes rows that skip layer 2 with rows that run it."""
    from dataclasses import replace

    from helix.net.io_types import NewRequest, StageInput
    ckpt, _ = tiny_ckpt
    cfg = EngineConfig(eos_token_ids=(2,), max_num_batched_tokens=40)
    a3, a2, mid, last = (SliceEngine.from_checkpoint(ckpt, s, e, cfg)
                         for s, e in ((0, 3), (0, 2), (2, 6), (6, 8)))
    first = {i: (a3 if i % 2 == 0 else a2) for i in range(16)}
    queues = {id(e): [] for e in (a3, a2, mid, last)}
    for i, req in enumerate(_requests(prompts)):
        new = NewRequest(i, len(req.token_ids), req.sampling, req.token_ids)
        queues[id(first[i])].append(StageInput(i, 0, token_ids=req.token_ids, new_request=new))
    got = {i: [] for i in range(16)}
    mixed_steps = 0
    rows_layer2 = rows_all = 0   # tokens of the middle stage that must run layer 2 / layers 3-5
    for _ in range(2000):
        for e in (a3, a2):
            inputs, queues[id(e)] = queues[id(e)], []
            for o in e.step(inputs):
                new = o.new_request and replace(o.new_request, enter_layer=3 if e is a3 else 2)
                queues[id(mid)].append(StageInput(o.request_id, o.start_position,
                                                  hidden_states=o.hidden_states, new_request=new))
        inputs, queues[id(mid)] = queues[id(mid)], []
        outs = mid.step(inputs)
        plan = mid.last_plan
        ids = {*plan.decode_ids, *(c.request_id for c in plan.prefill_chunks)}
        mixed_steps += len({i % 2 for i in ids}) == 2
        rows_all += plan.num_tokens
        rows_layer2 += sum(1 for i in plan.decode_ids if i % 2) + \
            sum(c.num_tokens for c in plan.prefill_chunks if c.request_id % 2)
        queues[id(last)].extend(StageInput(o.request_id, o.start_position, hidden_states=o.hidden_states,
                                           new_request=o.new_request and replace(o.new_request,
                                                                                 enter_layer=None))
                                for o in outs)
        inputs, queues[id(last)] = queues[id(last)], []
        for o in last.step(inputs):
            got[o.request_id].append(o.token.token_id)
            if o.finish_reason is None:
                queues[id(first[o.request_id])].append(
                    StageInput(o.request_id, o.start_position, token_ids=(o.token.token_id,)))
            else:
                first[o.request_id].release([o.request_id])
                mid.release([o.request_id])
        if not any(queues.values()) and not any(e.has_work() for e in (a3, a2, mid, last)):
            break
    assert [got[i] for i in range(16)] == hf_greedy
    assert mixed_steps > 0, "no step mixed the two entry layers"
    # Work: layer 2 ran only the rows of requests that entered at 2; every row ran layers 3-5.
    assert 0 < rows_layer2 < rows_all
    assert mid.model.rows_run == [rows_layer2, rows_all, rows_all, rows_all]


def test_length_grouped_decode_attention_matches_hf(tiny_ckpt, prompts, hf_greedy):
    """With 4-token blocks the 16 mixed-length contexts fall into several decode groups (each
    padded only to its own longest); tokens still equal HF's."""
    ckpt, _ = tiny_ckpt
    engine = SliceEngine.from_checkpoint(ckpt, 0, 8, EngineConfig(
        eos_token_ids=(2,), max_num_batched_tokens=512, block_size_tokens=4, attention="gather"))
    seen = []
    forward = engine.model.forward

    def recording(x, batch, keep=None):
        seen.append(len(batch.decode_groups))
        return forward(x, batch, keep)

    engine.model.forward = recording
    got = LocalPipeline([engine]).run(_requests(prompts))
    assert [got[f"r{i}"] for i in range(16)] == hf_greedy
    assert max(seen) > 1, "no step had more than one decode group"
