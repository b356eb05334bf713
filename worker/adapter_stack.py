"""Many LoRA tasks of one shape in one batched product per projection (as Punica's and S-LoRA's
batched kernels do, with plain ``torch.bmm``).

Adding each task's terms over its own rows (:func:`worker.adapters.add_task_terms`) costs a few
small products per task per projection: with 64 tasks in a decode step that is ~1,000 products a
step, and their fixed costs, not their arithmetic, dominate (on one CPU thread: a quarter of the
step beside the base model's). When every task of a step is LoRA with the same targets and ranks,
their packed ``A_cat`` / ``B`` are stacked once (``[T, in, R]``, ``[T, r, out]``) and each
projection runs ``bmm(X_t, A_t)`` then ``bmm(·, B_t)`` for all tasks at once over the rows gathered
per task (``[T, L, in]``, ``L`` the most rows a task has; shorter tasks padded, their padding
zeroed). The stack is a working copy of the step's tasks (their bytes once more, outside the
adapter cache's budget); it is rebuilt only when the step's set of tasks changes, which decode
steps of the same requests do not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from worker.adapters import PackedLoRATerm, SliceAdapter

MAX_PADDING = 2.0
"""Stack a step only if its padded rows (tasks x the most rows one has) are at most this many times
its task rows (a long prompt chunk of one task beside single decodes would pad every task to it)."""
MAX_ROWS = 4
"""Stack a step only if no task has more rows than this. Measured (one CPU thread, 64 LoRA r=8
tasks on a hidden-512 model, all seven projections of 4 layers): 1 row a task 73 -> 27 ms a step,
2 rows 83 -> 41 ms, 8 rows 110 -> 119 ms (``bmm`` over many small matrices loses to the per-task
products once each has a few rows): decode steps stack, prompt chunks do not."""


@dataclass
class LoRAStack:
    """The packed LoRA terms of ``adapters`` (same shapes), stacked per (layer, fused linear)."""

    adapters: list[SliceAdapter]
    """Kept so their identities (the step's key) stay theirs while the stack lives."""
    terms: dict[tuple[int, str], tuple[int, torch.Tensor, list[tuple[int, int, int, torch.Tensor]]]]
    """(layer, linear) -> (first column, ``A`` ``[T, in, R]``, parts: (column from the first, ranks
    ``[r0, r1)`` of ``A``, ``B`` ``[T, r, width]``))."""

    @classmethod
    def build(cls, adapters: Sequence[SliceAdapter]) -> "LoRAStack | None":
        """The stack, or None unless every task is packed LoRA of the first one's shapes."""
        sig = _signature(adapters[0])
        if sig is None or any(_signature(a) != sig for a in adapters[1:]):
            return None
        terms = {}
        for layer, linear, start, _, parts in sig:
            ts = [a.layers[layer][linear][0].term for a in adapters]
            stacked = [(col, r0, r1, torch.stack([t.parts[k][3] for t in ts]))
                       for k, (col, r0, r1, _) in enumerate(parts)]
            terms[(layer, linear)] = (start, torch.stack([t.a_t for t in ts]), stacked)
        return cls(list(adapters), terms)

    def rows(self, row_task: torch.Tensor) -> "StackedRows | None":
        """How a step's rows (``row_task``: index into :attr:`adapters`, -1 = base) go into the
        stack's batched product; None when a task has more than :data:`MAX_ROWS` rows or padding
        would cost more than :data:`MAX_PADDING`."""
        n_tasks = len(self.adapters)
        counts = torch.bincount(row_task + 1, minlength=n_tasks + 1).tolist()
        per_task, longest = counts[1:], max(counts[1:])
        if longest == 0 or longest > MAX_ROWS or n_tasks * longest > MAX_PADDING * sum(per_task):
            return None
        order = torch.argsort(row_task, stable=True).tolist()[counts[0]:]   # task rows, by task
        index: list[int] = []
        pad: list[int] = []
        at = 0
        for n in per_task:
            index.extend(order[at:at + n])
            at += n
            pad.extend(range(len(index), len(index) + longest - n))
            index.extend([0] * (longest - n))   # any row: its products are zeroed
        device = row_task.device
        return StackedRows(self, longest, torch.tensor(index, dtype=torch.long, device=device),
                           torch.tensor(pad, dtype=torch.long, device=device) if pad else None)


@dataclass
class StackedRows:
    """One step's rows laid out for a :class:`LoRAStack`: ``index`` ``[T * L]`` row of each slot."""

    stack: LoRAStack
    length: int
    index: torch.Tensor
    pad: torch.Tensor | None
    """Slots that hold no row (their products are zeroed)."""

    def add(self, y: torch.Tensor, x: torch.Tensor, layer: int, linear: str) -> None:
        """Add every task's LoRA terms of ``linear`` at ``layer`` to ``y`` over its rows."""
        entry = self.stack.terms.get((layer, linear))
        if entry is None:
            return
        start, a, parts = entry
        n_tasks, length = a.shape[0], self.length
        u = torch.bmm(x.index_select(0, self.index).view(n_tasks, length, -1), a)   # [T, L, R]
        if self.pad is not None:
            u.view(n_tasks * length, -1).index_fill_(0, self.pad, 0.0)
        for col, r0, r1, b in parts:
            d = torch.bmm(u[:, :, r0:r1], b)                                      # [T, L, width]
            first = start + col
            y[:, first:first + b.shape[2]].index_add_(0, self.index, d.view(n_tasks * length, -1))


class StackCache:
    """The last step's :class:`LoRAStack`, rebuilt when the set of tasks (in order) changes."""

    def __init__(self) -> None:
        self._key: tuple[int, ...] | None = None
        self._stack: LoRAStack | None = None

    def __call__(self, adapters: Sequence[SliceAdapter]) -> LoRAStack | None:
        if len(adapters) < 2:
            return None   # one task: its rows are a slice already
        key = tuple(id(a) for a in adapters)
        if key != self._key:
            self._stack = None   # let the old copy go first
            self._key, self._stack = key, LoRAStack.build(adapters)
        return self._stack


def _signature(adapter: SliceAdapter):
    """What must match for tasks to stack: per (layer, linear), one packed LoRA term's columns and
    shapes; None for anything else."""
    sig = []
    for layer, linears in sorted(adapter.layers.items()):
        for linear, terms in sorted(linears.items()):
            if len(terms) != 1 or not isinstance(terms[0].term, PackedLoRATerm):
                return None
            t = terms[0]
            sig.append((layer, linear, t.start, tuple(t.term.a_t.shape),
                        tuple((c, r0, r1, tuple(b.shape)) for c, r0, r1, b in t.term.parts)))
    return tuple(sig)
