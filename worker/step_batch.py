"""Turn a :class:`worker.step_policy.StepPlan` into the tensors one model step needs.

Rows of the step matrix are ordered decodes first (one row each), then every prefill chunk's tokens.
When some requests enter the slice at a later layer, the layers they skip get a layout of their own
built over the rows that do run them.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

from worker.attention import paged_layout
from worker.kv_blocks import KVBlockManager
from worker.model import DecodeGroup, PrefillAttention, RowSubset, StepBatch
from worker.step_policy import StepPlan


@dataclass(frozen=True)
class RowSpan:
    """Rows ``[row_start, row_start + end - start)`` of the step hold positions ``[start, end)``."""

    request_id: Hashable
    row_start: int
    start: int
    end: int


def plan_rows(plan: StepPlan) -> list[RowSpan]:
    """Row layout of a plan: decodes first, then prefill chunks."""
    spans = [RowSpan(rid, i, pos, pos + 1)
             for i, (rid, pos) in enumerate(zip(plan.decode_ids, plan.decode_positions))]
    row = len(spans)
    for c in plan.prefill_chunks:
        spans.append(RowSpan(c.request_id, row, c.start, c.end))
        row += c.num_tokens
    return spans


@dataclass(frozen=True)
class AttentionKind:
    """What the step's attention layout is built for: the model's backend
    (:func:`worker.attention.resolve_backend`) and its query heads per KV head."""

    backend: str = "gather"
    group: int = 1


def build_step_batch(spans: Sequence[RowSpan], num_decodes: int, blocks: KVBlockManager,
                     enter_offsets: dict[Hashable, int], num_slice_layers: int,
                     device: torch.device, dtype: torch.dtype = torch.float32,
                     kind: AttentionKind = AttentionKind()) -> StepBatch:
    """Positions, KV slots, attention layout and per-layer row subsets of one step.

    ``spans[:num_decodes]`` are the decodes. ``enter_offsets[rid]`` is the slice-layer index at which
    ``rid`` starts (0 = the slice start, the default); its rows skip the layers before it. ``dtype``:
    the model's, for the decodes' additive attention masks (gather backend)."""
    batch = _layout(spans, num_decodes, blocks, device, dtype, kind)
    offset = [enter_offsets.get(s.request_id, 0) for s in spans]
    if any(offset):
        batch.layer_rows = _layer_rows(spans, num_decodes, offset, num_slice_layers, blocks, device,
                                       dtype, kind)
    return batch


def _layout(spans: Sequence[RowSpan], num_decodes: int, blocks: KVBlockManager,
            device: torch.device, dtype: torch.dtype, kind: AttentionKind) -> StepBatch:
    bs = blocks.block_size_tokens
    tables = [blocks.block_table(s.request_id) for s in spans]
    positions, slots = _positions_and_slots(spans, tables, bs, device)
    max_position = max(s.end for s in spans) - 1
    if kind.backend != "gather":
        # Rows that continue a request read the paged cache in place; a chunk that starts its
        # request attends over the step's own keys only.
        cont = [k for k, s in enumerate(spans) if s.start > 0]
        paged = paged_layout([tables[k] for k in cont], [spans[k].end for k in cont],
                             [spans[k].row_start for k in cont],
                             [spans[k].end - spans[k].start for k in cont], bs, device,
                             triton_tiles=kind.backend == "triton", group=kind.group) if cont else None
        fresh = [_prefill_layout(tables[k], spans[k], bs, device)
                 for k in range(num_decodes, len(spans)) if spans[k].start == 0]
        return StepBatch(positions=positions, slots=slots, num_decodes=num_decodes, decode_groups=[],
                         prefills=fresh, paged=paged, max_position=max_position)
    lens = [s.end for s in spans[:num_decodes]]
    groups = []
    for rows in decode_groups(lens, bs):
        dec_blocks, dec_mask = _decode_layout([tables[k] for k in rows], [lens[k] for k in rows], bs,
                                              dtype)
        in_order = rows == list(range(len(rows)))
        groups.append(DecodeGroup(rows=None if in_order else torch.tensor(rows, device=device),
                                  blocks=dec_blocks.to(device),
                                  mask=None if dec_mask is None else dec_mask.to(device)))
    prefills = [_prefill_layout(t, s, bs, device)
                for t, s in zip(tables[num_decodes:], spans[num_decodes:])]
    return StepBatch(positions=positions, slots=slots, num_decodes=num_decodes, decode_groups=groups,
                     prefills=prefills, max_position=max_position)


MAX_DECODE_GROUPS = 4
MIN_DECODE_GROUP = 4
SPLIT_RATIO = 0.75


def decode_groups(context_lens: Sequence[int], block_size: int) -> list[list[int]]:
    """Partition decodes (by index) into groups of similar context length, longest first.

    Decode attention pads every context of a group to the group's longest, and on CPU its cost is
    the bytes gathered and read, so one group over contexts of 30 and 600 tokens moves twice the
    bytes it needs. Sorted by length, a new group starts when a context needs at most
    ``SPLIT_RATIO`` of the current group's blocks and the group already has ``MIN_DECODE_GROUP``
    members (each group is one more gather and attention call per layer); at most
    ``MAX_DECODE_GROUPS``. Exact either way: padding is masked out."""
    if not context_lens:
        return []
    nblocks = [-(-n // block_size) for n in context_lens]
    order = sorted(range(len(nblocks)), key=lambda k: -nblocks[k])
    groups = [[order[0]]]
    for k in order[1:]:
        head = nblocks[groups[-1][0]]
        if (len(groups) < MAX_DECODE_GROUPS and len(groups[-1]) >= MIN_DECODE_GROUP
                and nblocks[k] <= SPLIT_RATIO * head):
            groups.append([k])
        else:
            groups[-1].append(k)
    if len(groups) == 1:
        return [sorted(groups[0])]   # one group: keep step order (no row shuffling)
    return groups


def _layer_rows(spans: Sequence[RowSpan], num_decodes: int, offset: Sequence[int], num_layers: int,
                blocks: KVBlockManager, device: torch.device, dtype: torch.dtype,
                kind: AttentionKind) -> dict[int, RowSubset | None]:
    """For each layer some rows skip: the rows that run it, with their own layout (rows renumbered
    from 0, decodes still first). Layers between two distinct entry offsets share one subset; a layer
    no row runs maps to None."""
    out: dict[int, RowSubset | None] = {}
    subset: RowSubset | None = None
    for i in range(min(max(offset), num_layers)):
        keep = [k for k, off in enumerate(offset) if off <= i]
        if subset is None or len(keep) != subset.num_spans:
            subset = _subset(spans, num_decodes, keep, blocks, device, dtype, kind) if keep else None
        out[i] = subset
    return out


def _subset(spans: Sequence[RowSpan], num_decodes: int, keep: Sequence[int], blocks: KVBlockManager,
            device: torch.device, dtype: torch.dtype, kind: AttentionKind) -> RowSubset:
    rows, sub, row = [], [], 0
    for k in keep:
        s = spans[k]
        rows.append(torch.arange(s.row_start, s.row_start + s.end - s.start))
        sub.append(RowSpan(s.request_id, row, s.start, s.end))
        row += s.end - s.start
    return RowSubset(rows=torch.cat(rows).to(device), num_spans=len(keep),
                     batch=_layout(sub, sum(1 for k in keep if k < num_decodes), blocks, device, dtype,
                                   kind))


def _positions_and_slots(spans: Sequence[RowSpan], tables: Sequence[Sequence[int]], bs: int,
                         device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Every row's position and KV slot, built in plain Python (a decode row is two integers;
    a tensor per span cost ~20 us each, milliseconds a step at a hundred decodes) and moved to
    ``device`` in one copy."""
    pos: list[int] = []
    slots: list[int] = []
    for s, table in zip(spans, tables):
        if s.end - s.start == 1:
            pos.append(s.start)
            slots.append(table[s.start // bs] * bs + s.start % bs)
        else:
            rows = range(s.start, s.end)
            pos.extend(rows)
            slots.extend(table[p // bs] * bs + p % bs for p in rows)
    n = len(pos)
    pad = [0] * (n % 2)          # both rows 16-byte aligned (Triton specialises on it)
    both = torch.tensor([pos + pad, slots + pad], dtype=torch.long).to(device)
    return both[0, :n], both[1, :n]


def _decode_layout(tables: Sequence[Sequence[int]], context_lens: Sequence[int], bs: int,
                   dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Padded ``[B, max_blocks]`` block ids of a group's contexts, and the additive mask that hides
    the padding (0 for real keys, -inf past a context; SDPA on CPU is measured 8-25 % faster with an
    additive mask than with a boolean one, same result)."""
    width = max(-(-n // bs) for n in context_lens)
    blocks = torch.tensor([list(t[:width]) + [0] * (width - len(t[:width])) for t in tables],
                          dtype=torch.long)                     # padding reads block 0, masked out
    valid = torch.arange(width * bs)[None, :] < torch.tensor(context_lens)[:, None]
    if bool(valid.all()):
        return blocks, None
    mask = torch.zeros(valid.shape, dtype=dtype).masked_fill_(~valid, float("-inf"))
    return blocks, mask[None, :, None, :]                        # [1, B, 1, width * bs]


def _prefill_layout(table: Sequence[int], s: RowSpan, bs: int, device: torch.device) -> PrefillAttention:
    n = s.end - s.start
    if not s.start:   # attends over the step's own keys: no cache read, plain causal mask
        return PrefillAttention(row_start=s.row_start, num_tokens=n, start=0, context_blocks=None,
                                causal_mask=None)
    num_blocks = -(-s.end // bs)
    # Query i (position start + i) sees keys 0 .. start + i (so never the block padding).
    keys = torch.arange(num_blocks * bs)
    mask = (keys[None, :] <= torch.arange(s.start, s.end)[:, None]).to(device)
    return PrefillAttention(row_start=s.row_start, num_tokens=n, start=s.start,
                            context_blocks=torch.tensor(table[:num_blocks], dtype=torch.long).to(device),
                            causal_mask=mask)
