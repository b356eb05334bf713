"""Operations one decode step dispatches per layer: a budget the fusions must keep.

Counted with a ``TorchDispatchMode`` over one engine step of four decodes, for a slice of one layer
and of two (the difference is one layer's share; what the step does once, such as building its
batch, cancels out). Views and allocations are not kernels and are left out; a call of the C
attention kernel or of a Triton kernel counts as one (the Triton kernels run in the interpreter
here, whose own tensor bookkeeping is not counted).
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"   # before triton_ops is imported anywhere in this process

from collections import Counter  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes  # noqa: E402

from helix.core.models import resolve_model  # noqa: E402
from helix.net.io_types import NewRequest, StageInput  # noqa: E402
from helix.net.sampling import SamplingParams  # noqa: E402
from worker import native  # noqa: E402
from worker.engine import SliceEngine  # noqa: E402
from worker.engine_config import EngineConfig  # noqa: E402
from worker.profile import random_slice  # noqa: E402

#: Kernels per decode layer. CPU (C kernels): 2 RMSNorms, 4 GEMMs, rotary + KV store, attention,
#: 2 residual adds, SiLU-mul.
CPU_BUDGET = 11
#: CUDA path (Triton kernels): RMSNorm, QKV GEMM, rotary + KV store, attention, O GEMM,
#: add + RMSNorm, gate-up GEMM, SiLU-mul, down GEMM, residual add.
TRITON_BUDGET = 10

NOT_KERNELS = {"view", "_unsafe_view", "slice", "select", "transpose", "t", "reshape", "chunk", "split",
               "unbind", "expand", "unsqueeze", "squeeze", "permute", "as_strided", "alias", "detach",
               "empty", "empty_like", "new_empty", "empty_strided", "lift_fresh"}


class _Counter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in NOT_KERNELS:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


class _CountedOps:
    """A stand-in for :mod:`worker.triton_ops` on a model: each kernel call counts as one, and
    what the interpreter does inside it is not counted."""

    def __init__(self, ops, counter: _Counter) -> None:
        self._ops, self._counter = ops, counter

    def __getattr__(self, name):
        fn = getattr(self._ops, name)

        def counted(*args, **kwargs):
            self._counter.ops[f"triton.{name}"] += 1
            with _disable_current_modes():
                return fn(*args, **kwargs)
        return counted


def _step_ops(backend: str, layers: int) -> Counter[str]:
    spec = resolve_model("tiny-llama")
    engine = SliceEngine(random_slice(spec, layers, torch.float32, torch.device("cpu")),
                         EngineConfig(attention=backend, decode_graphs="off", device="cpu",
                                      max_num_batched_tokens=128))
    hidden = spec.hidden_size
    ids = list(range(4))
    engine.step([StageInput(r, 0, hidden_states=torch.randn(16, hidden),
                            new_request=NewRequest(r, 16, SamplingParams(max_tokens=8))) for r in ids])
    counter = _Counter()
    if backend == "triton":
        engine.model._ops = engine.model._fused = _CountedOps(engine.model._ops, counter)
    calls = native.calls
    decodes = [StageInput(r, 16, hidden_states=torch.randn(1, hidden)) for r in ids]
    with counter:
        engine.step(decodes)
    assert len(engine.last_plan.decode_ids) == 4 and not engine.take_failures()
    if native.calls > calls:
        counter.ops["native kernels"] += native.calls - calls
    return counter.ops


def _per_layer(backend: str) -> Counter[str]:
    return _step_ops(backend, 2) - _step_ops(backend, 1)


def test_cpu_decode_layer_kernels_within_budget():
    if native.load() is None:
        pytest.skip("no C compiler: the CPU engine runs the gather backend")
    ops = _per_layer("native")
    assert ops["native kernels"] == 3, ops   # rotary + store, attention, SiLU-mul
    assert sum(ops.values()) <= CPU_BUDGET, f"{sum(ops.values())} kernels a layer: {dict(ops)}"


def test_triton_decode_layer_kernels_within_budget():
    pytest.importorskip("triton")
    ops = _per_layer("triton")
    assert ops["triton.paged_attention"] == 1 and ops["triton.rotary_and_store"] == 1, ops
    assert sum(ops.values()) <= TRITON_BUDGET, f"{sum(ops.values())} kernels a layer: {dict(ops)}"


def test_the_count_sees_an_unfused_layer():
    """The gather path (PyTorch only) dispatches more than either budget: the counter is live."""
    ops = _per_layer("gather")
    assert ops["index_select"] == 2 and sum(ops.values()) > CPU_BUDGET, dict(ops)
