"""Parameter-efficient tasks on a shared base model, batched together (PetS).

For a linear layer ``Y = X·W + b`` every kind of task adds a term computed from its own parameters:

========== ===================================== ===========================================
kind       the task's layer                      the term added to the shared ``X·W``
========== ===================================== ===========================================
lora       ``X·(W + scale·A·B)``                 ``scale·(X·A)·B``
bottleneck ``Y + σ(Y·W_down)·W_up``              ``σ(Y·W_down)·W_up`` (reads the shared ``Y``)
bitfit     ``X·W + b_task``                      ``b_task`` (LLaMA's linears have no base ``b``)
diff       ``X·(W + Δ)``, ``Δ`` sparse           ``X·Δ``
mask       ``X·(M⊙W)``, ``M`` binary             ``−X·(M̄⊙W)``, sparse over the pruned entries
========== ===================================== ===========================================

The shared product runs once over the whole step (every request's rows, whatever its task); each task's
term runs only over its own requests' rows, gathered per task (:class:`TaskRows`), and is added back in
place. Tensors use ``nn.Linear``'s ``[out, in]`` layout, like the base weights. A worker holds only the
terms of its slice's layers (:class:`SliceAdapter`).

LLaMA's q/k/v and gate/up projections are fused in :mod:`worker.model` (one matmul each); a term of
``q_proj`` adds to the q columns of the fused output, and so on (:func:`target_columns`).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from helix.models import ModelSpec

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The linear layers a task may adapt (Hugging Face module names)."""

KINDS = ("lora", "bottleneck", "bitfit", "diff", "mask")

ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "silu": F.silu, "tanh": torch.tanh}
"""The bottleneck adapter's σ."""


def target_shape(spec: ModelSpec, target: str) -> tuple[int, int]:
    """``(out, in)`` of one of :data:`TARGETS` in ``spec``."""
    h, d, inter = spec.hidden_size, spec.head_dim, spec.intermediate_size
    return {"q_proj": (spec.num_heads * d, h), "k_proj": (spec.num_kv_heads * d, h),
            "v_proj": (spec.num_kv_heads * d, h), "o_proj": (h, spec.num_heads * d),
            "gate_proj": (inter, h), "up_proj": (inter, h), "down_proj": (h, inter)}[target]


def target_columns(spec: ModelSpec, target: str) -> tuple[str, int, int]:
    """``(fused linear, first column, end column)``: where ``target``'s outputs sit in the fused
    projection of :class:`worker.model.LayerWeights` (``qkv``, ``o``, ``gate_up``, ``down``)."""
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    inter, h = spec.intermediate_size, spec.hidden_size
    return {"q_proj": ("qkv", 0, q), "k_proj": ("qkv", q, q + kv), "v_proj": ("qkv", q + kv, q + 2 * kv),
            "o_proj": ("o", 0, h), "gate_proj": ("gate_up", 0, inter),
            "up_proj": ("gate_up", inter, 2 * inter), "down_proj": ("down", 0, h)}[target]


# --- terms --------------------------------------------------------------------------------------------
@dataclass
class LoRATerm:
    """``scale·(X·Aᵀ)·Bᵀ`` (PEFT's ``lora_A.weight`` ``[r, in]``, ``lora_B.weight`` ``[out, r]``)."""

    a: torch.Tensor   # [r, in]
    b: torch.Tensor   # [out, r]
    scale: float
    reads_output = False

    def __post_init__(self) -> None:
        # Kept transposed and scaled once, so a step runs two plain matmuls.
        self._a_t = self.a.T.contiguous()                   # [in, r]
        self._b_t = (self.b * self.scale).T.contiguous()    # [r, out]

    def delta(self, x: torch.Tensor, y: torch.Tensor | None) -> torch.Tensor:
        return (x @ self._a_t) @ self._b_t

    def merged(self, w: torch.Tensor) -> torch.Tensor:
        return w + self.scale * (self.b @ self.a)


@dataclass
class BottleneckTerm:
    """``σ(Y·downᵀ)·upᵀ`` over the linear's output ``Y`` (Houlsby-style adapter, residual)."""

    down: torch.Tensor   # [r, out]
    up: torch.Tensor     # [out, r]
    activation: str = "relu"
    reads_output = True

    def delta(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return ACTIVATIONS[self.activation](y @ self.down.T) @ self.up.T


@dataclass
class BiasTerm:
    """BitFit: the task's bias (the base has none)."""

    bias: torch.Tensor   # [out]
    reads_output = False

    def delta(self, x: torch.Tensor, y: torch.Tensor | None) -> torch.Tensor:
        return self.bias.expand(x.shape[0], -1)


@dataclass
class SparseTerm:
    """``X·Sᵀ`` for a sparse ``S`` ``[out, in]``: diff pruning's ``Δ``, or a binary mask's ``−(M̄⊙W)``
    (the pruned weights, negated). Stored as CSR: the work and memory grow with the non-zeros."""

    matrix: torch.Tensor   # [out, in] sparse CSR
    reads_output = False

    def delta(self, x: torch.Tensor, y: torch.Tensor | None) -> torch.Tensor:
        if self.matrix.dtype != x.dtype:   # float16 / bfloat16 on CPU: kept in float32 (see sparse_term)
            return (self.matrix @ x.T.to(self.matrix.dtype)).T.to(x.dtype)
        return (self.matrix @ x.T).T

    @property
    def nnz(self) -> int:
        return int(self.matrix.values().numel())


Term = LoRATerm | BottleneckTerm | BiasTerm | SparseTerm


def sparse_term(indices: torch.Tensor, values: torch.Tensor, shape: tuple[int, int]) -> SparseTerm:
    """A :class:`SparseTerm` from ``[2, nnz]`` (row, column) indices and their values. On CPU the
    values are kept in float32 whatever their dtype: MKL's sparse product has no float16 / bfloat16
    kernel (torch 2.13: ``addmm_out_sparse_csr_impl_mkl`` not implemented for 'Half')."""
    if values.device.type == "cpu" and values.dtype in (torch.float16, torch.bfloat16):
        values = values.float()
    coo = torch.sparse_coo_tensor(indices, values, shape, check_invariants=True).coalesce()
    with warnings.catch_warnings():   # "sparse CSR support is in beta": matmul by CSR is all we use
        warnings.simplefilter("ignore", UserWarning)
        return SparseTerm(coo.to_sparse_csr())


def term_bytes(term: Term) -> int:
    if isinstance(term, SparseTerm):
        m = term.matrix
        parts = (m.crow_indices(), m.col_indices(), m.values())
        return sum(t.numel() * t.element_size() for t in parts)
    fields = (getattr(term, f.name) for f in dataclasses.fields(term))   # not the derived copies
    return sum(t.numel() * t.element_size() for t in fields if isinstance(t, torch.Tensor))


# --- one task on one slice ------------------------------------------------------------------------------
@dataclass
class TermAt:
    """A term and the output columns ``[start, end)`` of the fused linear it adds to."""

    start: int
    end: int
    target: str
    term: Term


@dataclass
class SliceAdapter:
    """One task's parameters for the layers of one slice."""

    name: str
    kind: str
    layers: dict[int, dict[str, list[TermAt]]]
    """Slice-layer index (0 = the slice's first layer) -> fused linear name -> its terms."""
    source: str = ""
    """Where it was loaded from (for listings)."""

    @property
    def nbytes(self) -> int:
        return sum(term_bytes(t.term) for lin in self.layers.values() for ts in lin.values() for t in ts)

    def terms(self, layer: int, linear: str) -> list[TermAt]:
        return self.layers.get(layer, {}).get(linear, [])


@dataclass
class TaskRows:
    """Which rows of a step belong to which task: ``groups`` pairs each task present with its rows
    (ascending; a ``slice`` when they are consecutive, else an index tensor). Base-model rows are in
    no group. Built once per step, and again for a row subset
    (the rows that run a layer, the kept rows of the last layer) by :meth:`subset`."""

    row_task: torch.Tensor   # [num_tokens] long: index into ``adapters``, -1 = base model
    adapters: Sequence[SliceAdapter]
    groups: list[tuple[SliceAdapter, torch.Tensor | slice]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.groups:
            self.groups = _group(self.row_task, self.adapters)

    def subset(self, rows: torch.Tensor) -> "TaskRows | None":
        """The same for rows ``rows`` of this step, renumbered ``0 .. len(rows) - 1``."""
        sub = self.row_task.index_select(0, rows)
        return TaskRows(sub, self.adapters) if bool((sub >= 0).any()) else None


def _group(row_task: torch.Tensor,
           adapters: Sequence[SliceAdapter]) -> list[tuple[SliceAdapter, torch.Tensor | slice]]:
    # One stable sort puts each task's rows together (ascending within the task); counts cut it.
    order = torch.argsort(row_task, stable=True)
    counts = torch.bincount(row_task + 1, minlength=len(adapters) + 1).tolist()
    bounds = order.tolist()
    groups, at = [], counts[0]   # counts[0]: base-model rows, sorted first
    for k, n in enumerate(counts[1:]):
        if n:
            first, last = bounds[at], bounds[at + n - 1]
            # Consecutive rows (one request's chunk, a task alone in the step) need no gather.
            rows = slice(first, first + n) if last - first + 1 == n else order[at:at + n]
            groups.append((adapters[k], rows))
        at += n
    return groups


def order_by_task(spans: Sequence, num_decodes: int, task_of) -> list:
    """The step's row spans with each task's requests next to each other: decodes sorted by task
    among the decodes (they stay first), prefill chunks among the chunks; ``row_start`` renumbered.
    A task whose rows end up consecutive adds its terms through a slice, with no gather or scatter
    (:func:`add_task_terms`). ``task_of(request_id)``: its task's name, None for the base model."""
    def key(span):
        name = task_of(span.request_id)
        return (name is not None, name or "")
    out, row = [], 0
    for part in (sorted(spans[:num_decodes], key=key), sorted(spans[num_decodes:], key=key)):
        for s in part:
            out.append(dataclasses.replace(s, row_start=row))
            row += s.end - s.start
    return out


def task_rows(row_counts: Sequence[tuple[SliceAdapter | None, int]],
              device: torch.device) -> TaskRows | None:
    """The :class:`TaskRows` of a step whose consecutive row runs ``(adapter, rows)`` are given in
    order (one run per request span); None when no row has a task (base-only steps cost nothing)."""
    index: dict[int, int] = {}
    adapters: list[SliceAdapter] = []
    ids: list[int] = []
    for adapter, n in row_counts:
        if adapter is None:
            ids.extend([-1] * n)
            continue
        k = index.get(id(adapter))
        if k is None:
            k = index[id(adapter)] = len(adapters)
            adapters.append(adapter)
        ids.extend([k] * n)
    if not adapters:
        return None
    return TaskRows(torch.tensor(ids, dtype=torch.long, device=device), adapters)


def add_task_terms(y: torch.Tensor, x: torch.Tensor, tasks: TaskRows | None, layer: int,
                   linear: str) -> torch.Tensor:
    """Add every task's terms of ``linear`` at slice layer ``layer`` to the shared output ``y``
    (``[n, out]``, in place) over its rows; ``x`` (``[n, in]``) is the linear's input."""
    if tasks is None:
        return y
    for adapter, rows in tasks.groups:
        terms = adapter.terms(layer, linear)
        if not terms:
            continue
        if isinstance(rows, slice):
            xr = x[rows]
            for t in terms:
                yv = y[rows, t.start:t.end]
                yv += t.term.delta(xr, yv)
            continue
        xr, yr = x.index_select(0, rows), None
        for t in terms:
            if t.term.reads_output and yr is None:   # the shared output, before any term adds
                yr = y.index_select(0, rows)
            delta = t.term.delta(xr, None if yr is None else yr[:, t.start:t.end])
            y[:, t.start:t.end].index_add_(0, rows, delta)
    return y
