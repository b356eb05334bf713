"""LoRA tasks of one shape stacked into one batched product per projection: each row gets exactly
its own task's terms (padding adds nothing, base rows are untouched), as the per-task path gives;
tasks of other shapes or kinds, and steps with long per-task row runs, are not stacked."""

from __future__ import annotations

import torch

from worker.adapter_stack import MAX_ROWS, LoRAStack, StackCache
from worker.adapters import BiasTerm, LoRATerm, SliceAdapter, TaskRows, TermAt, add_task_terms, pack_adapter


def _lora_task(name: str, g: torch.Generator, ranks=(2, 3), inp: int = 6) -> SliceAdapter:
    """q (columns 0-4) and v (columns 6-9) of a fused linear, two layers; packed as a read packs."""
    def r(*shape):
        return torch.randn(*shape, generator=g)
    layers = {layer: {"qkv": [TermAt(0, 4, "q_proj", LoRATerm(r(ranks[0], inp), r(4, ranks[0]), 0.5)),
                              TermAt(6, 10, "v_proj", LoRATerm(r(ranks[1], inp), r(4, ranks[1]), 2.0))],
                      "o": [TermAt(0, 3, "o_proj", LoRATerm(r(ranks[0], inp), r(3, ranks[0]), 1.0))]}
              for layer in (0, 1)}
    return pack_adapter(SliceAdapter(name, "lora", layers))


def test_stacked_rows_equal_row_by_row():
    g = torch.Generator().manual_seed(0)
    adapters = [_lora_task(f"t{k}", g) for k in range(4)]
    stack = LoRAStack.build(adapters)
    assert stack is not None
    # Tasks with 1, 2, 3 and 0 rows (padding), interleaved with base rows.
    row_task = torch.tensor([1, -1, 0, 2, 1, 2, -1, 2])
    tasks = TaskRows(row_task, adapters, stack=stack)
    assert tasks.stacked is not None and tasks.stacked.pad is not None
    x, y = torch.randn(8, 6, generator=g), torch.randn(8, 10, generator=g)
    for layer, linear in ((0, "qkv"), (1, "o")):
        got = add_task_terms(y.clone(), x, tasks, layer, linear)
        want = add_task_terms(y.clone(), x, TaskRows(row_task, adapters), layer, linear)   # per task
        assert torch.allclose(got, want, atol=1e-5), linear
        for i in range(8):   # and against each row's own terms
            ref = y[i].clone()
            if row_task[i] >= 0:
                for t in adapters[row_task[i]].terms(layer, linear):
                    ref[t.start:t.end] += t.term.delta(x[i:i + 1], None)[0]
            assert torch.allclose(got[i], ref, atol=1e-5), (linear, i)
    assert add_task_terms(y.clone(), x, tasks, 2, "qkv").equal(y)   # no terms at layer 2
    keep = torch.tensor([0, 2, 3, 4, 5, 7])   # a layer's kept rows: the same stack
    sub = tasks.subset(keep)
    assert sub.stack is stack and sub.stacked is not None
    assert torch.allclose(add_task_terms(y[keep].clone(), x[keep], sub, 0, "qkv"),
                          add_task_terms(y.clone(), x, tasks, 0, "qkv")[keep], atol=1e-5)
    # Too much padding (1 row of t0, 2 of t2 among 4 tasks: 8 slots for 3 rows): per task.
    assert tasks.subset(torch.tensor([2, 3, 7])).stacked is None


def test_what_is_not_stacked():
    g = torch.Generator().manual_seed(1)
    same = [_lora_task(f"t{k}", g) for k in range(3)]
    assert LoRAStack.build([*same, _lora_task("r", g, ranks=(4, 3))]) is None   # another rank
    bias = SliceAdapter("b", "bitfit", {0: {"qkv": [TermAt(0, 10, "q_proj", BiasTerm(torch.zeros(10)))]}})
    assert LoRAStack.build([*same, bias]) is None                                # another kind
    stack = LoRAStack.build(same)
    long_run = torch.tensor([0] * (MAX_ROWS + 1) + [1, 2])   # a prompt chunk of one task
    assert TaskRows(long_run, same, stack=stack).stacked is None
    cache = StackCache()
    assert cache(same) is cache(same) is not None          # the same tasks: built once
    assert cache(same[:2]) is not cache(same) and cache(same[:1]) is None
