"""Batched adapters (PetS) against references that merge each task into a copy of the base model.

Eight tasks of five kinds (LoRA from a ``peft`` checkpoint and from Helix's format, bottleneck, BitFit,
diff pruning, binary mask) and base-model requests run mixed in the same steps over three chained
slices; every request's greedy tokens and logprobs must equal those of the Hugging Face model with its
task merged in (the outside oracle), run one request at a time.
"""

from __future__ import annotations

import pytest
import torch

from helix.core.errors import USER_FAILURE, HelixUserError
from helix.net.sampling import SamplingParams
from tests.builders.adapters import merged_model, random_task, write_peft_lora, write_task
from tests.builders.threads import one_torch_thread
from worker.adapter_files import AdapterLimits, read_adapter
from worker.engine import SliceEngine
from worker.engine_config import EngineConfig
from worker.local_pipeline import LocalPipeline, Prompt

ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")

#: (task, kind, targets, options): 8 tasks of 5 kinds; "peft" is LoRA written by the peft package.
TASKS = [
    ("peft", "lora", ("q_proj", "v_proj", "down_proj"), {}),
    ("lora", "lora", ATTN + MLP, {"scale": 0.5}),
    ("bottleneck", "bottleneck", ("o_proj", "down_proj"), {"activation": "relu"}),
    ("bottleneck-qv", "bottleneck", ("q_proj", "v_proj"), {"activation": "gelu"}),
    ("bitfit", "bitfit", ATTN + MLP, {}),
    ("diff", "diff", ("k_proj", "up_proj", "o_proj"), {}),
    ("mask", "mask", ATTN + MLP, {}),
    ("mask-mlp", "mask", MLP, {}),
]
REL = 1e-4     # logprobs, relative
ABS = 2e-4     # and absolute: the base engine's own tolerance against HF (test_engine_oracle)


def _max_new(i: int) -> int:
    return 4 + i % 5


@pytest.fixture(scope="module")
def tasks(tiny_ckpt, tmp_path_factory):
    """task name -> (folder, reference HF model)."""
    ckpt, model = tiny_ckpt
    root = tmp_path_factory.mktemp("tasks")
    out = {}
    for seed, (name, kind, targets, options) in enumerate(TASKS):
        if name == "peft":
            pytest.importorskip("peft")
            out[name] = (root / name, write_peft_lora(model, root / name, targets, seed=seed))
            continue
        strength = 0.5 if kind == "mask" else 1.0
        tensors = random_task(model, kind, targets, seed, density=0.05 if kind == "diff" else 0.08,
                              strength=strength)
        write_task(root / name, kind, tensors, **options)
        out[name] = (root / name, merged_model(model, kind, tensors, **options))
    return out


def _requests(prompts):
    """Two requests per task and four of the base model, interleaved."""
    names = [t[0] for t in TASKS] * 2 + [None] * 4
    return [Prompt(f"r{i}", tuple(prompts[i % len(prompts)]),
                   SamplingParams(temperature=0, max_tokens=_max_new(i), logprobs=3, ignore_eos=True),
                   adapter=names[i]) for i in range(len(names))]


def _reference(model, prompt: Prompt):
    """Greedy tokens and per-token log_softmax rows of the task's own model, alone."""
    ids = torch.tensor([prompt.token_ids])
    with torch.no_grad(), one_torch_thread():
        gen = model.generate(ids, max_new_tokens=prompt.sampling.max_tokens, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
        logits = model(gen).logits[0].float()
    n = len(prompt.token_ids)
    return gen[0, n:].tolist(), torch.log_softmax(logits, dim=-1)[n - 1:-1]


def _chain(ckpt, tasks, **cfg):
    config = EngineConfig(eos_token_ids=(2,), **cfg)
    engines = [SliceEngine.from_checkpoint(ckpt, s, e, config) for s, e in ((0, 3), (2, 6), (6, 8))]
    for e in engines:
        for name, (folder, _) in tasks.items():
            e.adapters.load(name, folder)
    return LocalPipeline(engines, enter_layers=[None, 3, None])


@pytest.mark.parametrize("cfg", [dict(max_num_batched_tokens=48), dict(max_num_batched_tokens=512)],
                         ids=["chunked", "whole"])
def test_mixed_tasks_equal_merged_references(tiny_ckpt, prompts, tasks, cfg):
    ckpt, base = tiny_ckpt
    pipe = _chain(ckpt, tasks, **cfg)
    groups = []
    mid = pipe.engines[1]
    forward = mid.model.forward

    kinds = {slice: 0, torch.Tensor: 0}   # groups of consecutive rows / gathered rows (the engine
    # orders rows by task, so mostly the former; test_gathered_rows_equal_row_by_row covers the latter)

    def recording(x, batch, keep=None):
        groups.append(0 if batch.tasks is None else len(batch.tasks.groups))
        for _, rows in batch.tasks.groups if batch.tasks else ():
            kinds[type(rows)] += 1
        return forward(x, batch, keep)

    mid.model.forward = recording
    reqs = _requests(prompts)
    got = pipe.run(reqs)
    assert max(groups) >= 6, f"steps mixed at most {max(groups)} tasks"
    assert kinds[slice] > 0, kinds
    differs = set()
    for r in reqs:
        model = base if r.adapter is None else tasks[r.adapter][1]
        tokens, ref = _reference(model, r)
        assert got[r.request_id] == tokens, f"{r.request_id} ({r.adapter})"
        for j, tok in enumerate(pipe.logprobs[r.request_id]):
            assert tok.logprob == pytest.approx(float(ref[j, tok.token_id]), rel=REL, abs=ABS)
            top = ref[j].topk(3)
            assert [t for t, _ in tok.top_logprobs] == top.indices.tolist()
        if r.adapter is not None and tokens != _reference(base, r)[0]:
            differs.add(r.adapter)
    # Every task changes some output (else the test could not see its terms being dropped).
    assert differs == {t[0] for t in TASKS}
    for e in pipe.engines:
        assert e.blocks.num_free_blocks == e.blocks.num_blocks
        assert all(info.in_flight == 0 for info in e.adapters.list())


def test_each_slice_holds_only_its_layers(tiny_ckpt, tasks):
    ckpt, _ = tiny_ckpt
    engine = SliceEngine.from_checkpoint(ckpt, 2, 6, EngineConfig())
    whole = SliceEngine.from_checkpoint(ckpt, 0, 8, EngineConfig())
    for name, (folder, _) in tasks.items():
        part, full = engine.adapters.load(name, folder), whole.adapters.load(name, folder)
        assert set(part.layers) == set(range(4))
        assert part.nbytes * 2 == full.nbytes   # 4 of 8 layers, every layer alike


def _own_lora(tmp_path, model, shape_a=None, rank=8):
    tensors = random_task(model, "lora", ("q_proj",), 0, rank=rank)
    if shape_a is not None:
        tensors["layers.5.q_proj.lora_A"] = torch.zeros(shape_a)
    return write_task(tmp_path / "bad", "lora", tensors)


def test_mismatched_shape_names_the_tensor(tiny_ckpt, tmp_path):
    ckpt, model = tiny_ckpt
    engine = SliceEngine.from_checkpoint(ckpt, 4, 8, EngineConfig())
    folder = _own_lora(tmp_path, model, shape_a=(8, 65))
    with pytest.raises(HelixUserError, match=r"tensor 'layers\.5\.q_proj\.lora_A' has shape \[8, 65\], "
                                             r"expected \[8, 64\]"):
        engine.adapters.load("bad", folder)
    assert "bad" not in engine.adapters
    # A slice without layer 5 never reads that tensor.
    SliceEngine.from_checkpoint(ckpt, 0, 4, EngineConfig()).adapters.load("bad", folder)


def test_peft_shape_mismatch_and_rank_limit(tiny_ckpt, tasks, tmp_path):
    ckpt, model = tiny_ckpt
    from safetensors.torch import load_file, save_file
    folder, _ = tasks["peft"]
    bad = tmp_path / "peft-bad"
    bad.mkdir()
    (bad / "adapter_config.json").write_text((folder / "adapter_config.json").read_text())
    t = load_file(str(folder / "adapter_model.safetensors"))
    key = "base_model.model.model.layers.3.mlp.down_proj.lora_B.weight"
    t[key] = torch.zeros(63, 8)
    save_file(t, str(bad / "adapter_model.safetensors"))
    engine = SliceEngine.from_checkpoint(ckpt, 0, 8, EngineConfig())
    with pytest.raises(HelixUserError, match=rf"tensor '{key}' has shape \[63, 8\], expected \[64, 8\]"):
        engine.adapters.load("bad", bad)
    with pytest.raises(HelixUserError, match=r"rank 8, over the limit max_rank=4"):
        read_adapter("t", folder, engine.weights, AdapterLimits(max_rank=4))
    with pytest.raises(HelixUserError, match=r"over max_sparse_fraction=0.01"):
        read_adapter("t", tasks["diff"][0], engine.weights, AdapterLimits(max_sparse_fraction=0.01))


def test_unknown_task_fails_only_its_request(tiny_ckpt, prompts):
    ckpt, _ = tiny_ckpt
    engine = SliceEngine.from_checkpoint(ckpt, 0, 8, EngineConfig(eos_token_ids=(2,)))
    pipe = LocalPipeline([engine])
    sp = SamplingParams(temperature=0, max_tokens=3)
    pipe.submit(Prompt("a", tuple(prompts[0]), sp, adapter="nope"))
    pipe.submit(Prompt("b", tuple(prompts[1]), sp))
    while pipe.busy():
        pipe.step()
    assert [(f.request_id, f.message) for f in engine.take_failures()] == \
        [("a", USER_FAILURE + "adapter 'nope' is not loaded")]   # the client's error: HTTP 400
    assert len(pipe.tokens["b"]) == 3


def test_unload_drains_requests_in_flight(tiny_ckpt, prompts, tasks):
    ckpt, base = tiny_ckpt
    folder, ref = tasks["lora"]
    pipe = _chain(ckpt, {"lora": (folder, ref)}, max_num_batched_tokens=64)
    first = pipe.engines[0]
    req = Prompt("x", tuple(prompts[3]), SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
                 adapter="lora")
    pipe.submit(req)
    pipe.step()   # admitted on every stage
    assert [e.adapters.unload("lora") for e in pipe.engines] == [False, False, False]
    # A new request for the task is refused on the first stage; the one in flight finishes.
    pipe.submit(Prompt("y", (1, 5), SamplingParams(temperature=0, max_tokens=2), adapter="lora"))
    while pipe.busy():
        pipe.step()
    assert [(f.request_id, f.message) for f in first.take_failures()] == \
        [("y", USER_FAILURE + "adapter 'lora' is not loaded (it is being unloaded)")]
    assert pipe.tokens["x"] == _reference(ref, req)[0]
    for e in pipe.engines:
        assert e.adapters.list() == [] and "lora" not in e.adapters
    with pytest.raises(HelixUserError, match="not loaded"):
        first.adapters.unload("lora")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sparse_terms_in_half_precision_on_cpu(dtype):
    """MKL has no half-precision sparse product: the term computes in float32 and answers in the
    input's dtype (it raised NotImplementedError inside the step, failing every request of it)."""
    from worker.adapters import sparse_term
    g = torch.Generator().manual_seed(0)
    idx = torch.stack([torch.randint(0, 6, (10,), generator=g), torch.randint(0, 9, (10,), generator=g)])
    values = torch.randn(10, generator=g)
    x = torch.randn(4, 9, generator=g)
    want = sparse_term(idx, values, (6, 9)).delta(x, None)
    got = sparse_term(idx, values.to(dtype), (6, 9)).delta(x.to(dtype), None)
    assert got.dtype == dtype
    assert torch.allclose(got.float(), want, atol=0.05, rtol=0.02)


def test_gathered_rows_equal_row_by_row():
    """Tasks whose rows interleave (gathered, scattered back) and a task whose rows are consecutive
    (a slice) add exactly each row's own task's terms; base rows are untouched."""
    from worker.adapters import (BiasTerm, BottleneckTerm, LoRATerm, SliceAdapter, TaskRows, TermAt,
                                 add_task_terms, sparse_term)
    g = torch.Generator().manual_seed(0)
    n, inp, out = 11, 6, 8

    def r(*shape):
        return torch.randn(*shape, generator=g)
    lora = [TermAt(0, 4, "q_proj", LoRATerm(r(2, inp), r(4, 2), 0.5)),
            TermAt(4, 8, "k_proj", LoRATerm(r(3, inp), r(4, 3), 2.0))]
    adapters = [
        SliceAdapter("lora", "lora", {0: {"qkv": lora}}),
        SliceAdapter("bn", "bottleneck",
                     {0: {"qkv": [TermAt(2, 6, "k_proj", BottleneckTerm(r(3, 4), r(4, 3)))]}}),
        SliceAdapter("bias", "bitfit", {0: {"qkv": [TermAt(0, 8, "q_proj", BiasTerm(r(8)))]}}),
        SliceAdapter("diff", "diff", {0: {"qkv": [TermAt(0, 8, "q_proj", sparse_term(
            torch.tensor([[0, 3, 7], [1, 5, 2]]), r(3), (8, inp)))]}}),
    ]
    row_task = torch.tensor([0, 1, -1, 0, 2, 1, 3, 3, 3, -1, 0])   # tasks 2 and 3: consecutive rows
    x, y = r(n, inp), r(n, out)
    tasks = TaskRows(row_task, adapters)
    assert [type(rows) for _, rows in tasks.groups] == [torch.Tensor, torch.Tensor, slice, slice]
    got = add_task_terms(y.clone(), x, tasks, 0, "qkv")
    for i in range(n):
        want = y[i].clone()
        if row_task[i] >= 0:
            for t in adapters[row_task[i]].terms(0, "qkv"):
                want[t.start:t.end] += t.term.delta(x[i:i + 1], y[i:i + 1, t.start:t.end])[0]
        assert torch.allclose(got[i], want, atol=1e-6), i
    assert add_task_terms(y.clone(), x, tasks, 1, "qkv").equal(y)   # no terms at layer 1
