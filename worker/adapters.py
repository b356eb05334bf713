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
import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from helix.core.models import ModelSpec

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

    def add_to(self, y: torch.Tensor, x: torch.Tensor) -> None:
        y.addmm_(x @ self._a_t, self._b_t)   # the add fused into the second product

    def merged(self, w: torch.Tensor) -> torch.Tensor:
        return w + self.scale * (self.b @ self.a)


@dataclass
class PackedLoRATerm:
    """The LoRA terms of one fused linear (q, k and v; gate and up) packed for a step: one
    ``X·A_cat`` with the ``A``s side by side (``[in, sum r]``), then each target's ``B`` (scale
    folded in) added into its own columns, the add fused into the product (``addmm_``). No copy of
    the raw parameters is kept. Built by :func:`pack_adapter`."""

    a_t: torch.Tensor                                  # [in, sum r]
    parts: list[tuple[int, int, int, torch.Tensor]]
    """(first column, relative to the term's ``start``; first and end rank of ``a_t``; ``B_t``
    ``[r, out]`` of one target)."""
    reads_output = False

    def delta(self, x: torch.Tensor, y: torch.Tensor | None) -> torch.Tensor:
        width = max(c + b.shape[1] for c, _, _, b in self.parts)
        out = x.new_zeros(x.shape[0], width)
        self.add_to(out, x)
        return out

    def add_to(self, y: torch.Tensor, x: torch.Tensor) -> None:
        u = x @ self.a_t                                # [n, sum r]
        for col, r0, r1, b_t in self.parts:
            y[:, col:col + b_t.shape[1]].addmm_(u[:, r0:r1], b_t)


@dataclass
class BottleneckTerm:
    """``σ(Y·downᵀ)·upᵀ`` over the linear's output ``Y`` (Houlsby-style adapter, residual)."""

    down: torch.Tensor   # [r, out]
    up: torch.Tensor     # [out, r]
    activation: str = "relu"
    reads_output = True

    def delta(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return ACTIVATIONS[self.activation](y @ self.down.T) @ self.up.T

    def add_to(self, y: torch.Tensor, x: torch.Tensor) -> None:
        y += self.delta(x, y)


@dataclass
class BiasTerm:
    """BitFit: the task's bias (the base has none)."""

    bias: torch.Tensor   # [out]
    reads_output = False

    def delta(self, x: torch.Tensor, y: torch.Tensor | None) -> torch.Tensor:
        return self.bias.expand(x.shape[0], -1)

    def add_to(self, y: torch.Tensor, x: torch.Tensor) -> None:
        y += self.bias


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

    def add_to(self, y: torch.Tensor, x: torch.Tensor) -> None:
        y += self.delta(x, y)

    @property
    def nnz(self) -> int:
        return int(self.matrix.values().numel())


Term = LoRATerm | PackedLoRATerm | BottleneckTerm | BiasTerm | SparseTerm


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
    if isinstance(term, PackedLoRATerm):
        return sum(t.numel() * t.element_size() for t in _term_tensors(term))
    fields = (getattr(term, f.name) for f in dataclasses.fields(term))   # not the derived copies
    return sum(t.numel() * t.element_size() for t in fields if isinstance(t, torch.Tensor))


def resident_bytes(tensors) -> int:
    """Bytes of memory ``tensors`` hold, each storage once (a view shares its base's; a sparse CSR
    tensor holds three)."""
    seen: dict[tuple[str, int], int] = {}
    for t in tensors:
        parts = (t.crow_indices(), t.col_indices(), t.values()) if t.layout == torch.sparse_csr else (t,)
        for p in parts:
            st = p.untyped_storage()
            seen[(str(p.device), st.data_ptr())] = st.nbytes()
    return sum(seen.values())


def _term_tensors(term: Term):
    for v in vars(term).values():   # the fields and the derived (packed) copies
        if isinstance(v, torch.Tensor):
            yield v
    if isinstance(term, PackedLoRATerm):
        yield from (b_t for *_, b_t in term.parts)


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

    @property
    def resident_bytes(self) -> int:
        """Bytes the ready-to-run terms hold in memory (packed copies included): what an
        :class:`~worker.adapter_cache.AdapterCache` charges against its budget."""
        return resident_bytes(t for lin in self.layers.values() for ts in lin.values() for at in ts
                              for t in _term_tensors(at.term))

    def terms(self, layer: int, linear: str) -> list[TermAt]:
        return self.layers.get(layer, {}).get(linear, [])


def pack_adapter(adapter: SliceAdapter) -> SliceAdapter:
    """The same task with the LoRA terms of each fused linear packed into one
    :class:`PackedLoRATerm` (other kinds are kept as they are). The raw ``A`` / ``B`` copies are
    not kept: the packed tensors are all a step reads."""
    layers = {}
    for layer, linears in adapter.layers.items():
        layers[layer] = {}
        for linear, terms in linears.items():
            if not terms or not all(isinstance(t.term, LoRATerm) for t in terms):
                layers[layer][linear] = terms
                continue
            start, end = min(t.start for t in terms), max(t.end for t in terms)
            a_t = torch.cat([t.term._a_t for t in terms], dim=1)              # [in, sum r]
            parts, r0 = [], 0
            for t in terms:
                r = t.term._a_t.shape[1]
                parts.append((t.start - start, r0, r0 + r, t.term._b_t))
                r0 += r
            target = "+".join(t.target for t in terms)
            layers[layer][linear] = [TermAt(start, end, target, PackedLoRATerm(a_t, parts))]
    return dataclasses.replace(adapter, layers=layers)


@dataclass
class TaskRows:
    """Which rows of a step belong to which task: ``groups`` pairs each task present with its rows
    (ascending; a ``slice`` when they are consecutive, else an index tensor). Base-model rows are in
    no group. Built once per step, and again for a row subset
    (the rows that run a layer, the kept rows of the last layer) by :meth:`subset`."""

    row_task: torch.Tensor   # [num_tokens] long: index into ``adapters``, -1 = base model
    adapters: Sequence[SliceAdapter]
    stack: object | None = None
    """A :class:`worker.adapter_stack.LoRAStack` of ``adapters`` (all LoRA of one shape), or None."""

    @functools.cached_property
    def groups(self) -> list[tuple[SliceAdapter, torch.Tensor | slice]]:
        """Sorted on first use only: the stack's batched product (:attr:`stacked`) needs none."""
        return _group(self.row_task, self.adapters)

    def __post_init__(self) -> None:
        self.stacked = self.stack.rows(self.row_task) if self.stack is not None else None
        """These rows in the stack's batched product (None: each task's terms on its own)."""

    def subset(self, rows: torch.Tensor) -> "TaskRows | None":
        """The same for rows ``rows`` of this step, renumbered ``0 .. len(rows) - 1``."""
        sub = self.row_task.index_select(0, rows)
        return TaskRows(sub, self.adapters, stack=self.stack) if bool((sub >= 0).any()) else None


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
              device: torch.device, stack_of=None) -> TaskRows | None:
    """The :class:`TaskRows` of a step whose consecutive row runs ``(adapter, rows)`` are given in
    order (one run per request span); None when no row has a task (base-only steps cost nothing).
    ``stack_of(adapters)``: their :class:`~worker.adapter_stack.LoRAStack` or None
    (:class:`~worker.adapter_stack.StackCache`)."""
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
    return TaskRows(torch.tensor(ids, dtype=torch.long, device=device), adapters,
                    stack=stack_of(adapters) if stack_of is not None else None)


def add_task_terms(y: torch.Tensor, x: torch.Tensor, tasks: TaskRows | None, layer: int,
                   linear: str) -> torch.Tensor:
    """Add every task's terms of ``linear`` at slice layer ``layer`` to the shared output ``y``
    (``[n, out]``, in place) over its rows; ``x`` (``[n, in]``) is the linear's input."""
    if tasks is None:
        return y
    if tasks.stacked is not None:   # every task LoRA of one shape: one batched product
        tasks.stacked.add(y, x, layer, linear)
        return y
    for adapter, rows in tasks.groups:
        terms = adapter.terms(layer, linear)
        if not terms:
            continue
        if isinstance(rows, slice):
            xr = x[rows]
            for t in terms:
                t.term.add_to(y[rows, t.start:t.end], xr)
            continue
        xr, yr = x.index_select(0, rows), None
        for t in terms:
            if t.term.reads_output and yr is None:   # the shared output, before any term adds
                yr = y.index_select(0, rows)
            delta = t.term.delta(xr, None if yr is None else yr[:, t.start:t.end])
            y[:, t.start:t.end].index_add_(0, rows, delta)
    return y
