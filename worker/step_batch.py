"""Turn a :class:`worker.step_policy.StepPlan` into the tensors one model step needs.

Rows of the step matrix are ordered decodes first (one row each), then every prefill chunk's tokens.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

from worker.kv_blocks import KVBlockManager
from worker.model import PrefillAttention, StepBatch
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


def build_step_batch(plan: StepPlan, spans: Sequence[RowSpan], blocks: KVBlockManager,
                     enter_offsets: dict[Hashable, int], num_slice_layers: int,
                     device: torch.device) -> StepBatch:
    """Positions, KV slots, attention layout and per-layer entry masks of one step.

    ``enter_offsets[rid]`` is the slice-layer index at which ``rid`` starts (0 = the slice start)."""
    bs = blocks.block_size_tokens
    positions = torch.cat([torch.arange(s.start, s.end) for s in spans])
    tables = [blocks.block_table(s.request_id) for s in spans]
    slots = torch.cat([_slots(t, s.start, s.end, bs) for t, s in zip(tables, spans)])
    num_dec = len(plan.decode_ids)
    dec_slots, dec_mask = _decode_layout(tables[:num_dec], [s.end for s in spans[:num_dec]], bs)
    prefills = [_prefill_layout(t, s, bs, device) for t, s in zip(tables[num_dec:], spans[num_dec:])]
    entry_rows = _entry_rows(spans, enter_offsets, num_slice_layers, int(positions.numel()), device)
    return StepBatch(positions=positions.to(device), slots=slots.to(device),
                     num_decodes=num_dec,
                     decode_slots=dec_slots.to(device),
                     decode_mask=None if dec_mask is None else dec_mask.to(device),
                     prefills=prefills, entry_rows=entry_rows)


def _slots(table: Sequence[int], start: int, end: int, bs: int) -> torch.Tensor:
    pos = torch.arange(start, end)
    return torch.tensor(table, dtype=torch.long)[pos // bs] * bs + pos % bs


def _decode_layout(tables: Sequence[Sequence[int]], context_lens: Sequence[int],
                   bs: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Padded ``[B, max_context]`` slots of every decode's context, and the mask of real entries."""
    if not tables:
        return torch.zeros(0, 0, dtype=torch.long), None
    max_ctx = max(context_lens)
    width = max(len(t) for t in tables)
    table = torch.tensor([list(t) + [0] * (width - len(t)) for t in tables], dtype=torch.long)
    j = torch.arange(max_ctx)
    slots = table[:, j // bs] * bs + j % bs                      # [B, max_ctx]
    lens = torch.tensor(context_lens)
    valid = j[None, :] < lens[:, None]
    slots = torch.where(valid, slots, torch.zeros_like(slots))   # padding reads slot 0, masked out
    mask = None if bool(valid.all()) else valid[None, :, None, :]   # [1, B, 1, max_ctx]
    return slots, mask


def _prefill_layout(table: Sequence[int], s: RowSpan, bs: int, device: torch.device) -> PrefillAttention:
    n = s.end - s.start
    mask = None
    if s.start:
        # Query i (position start + i) sees keys 0 .. start + i.
        mask = (torch.arange(s.end)[None, :] <= torch.arange(s.start, s.end)[:, None]).to(device)
    return PrefillAttention(row_start=s.row_start, num_tokens=n, start=s.start,
                            context_slots=_slots(table, 0, s.end, bs).to(device), causal_mask=mask)


def _entry_rows(spans: Sequence[RowSpan], enter_offsets: dict[Hashable, int], num_layers: int,
                num_rows: int, device: torch.device) -> dict[int, torch.Tensor]:
    late = [(s, enter_offsets.get(s.request_id, 0)) for s in spans]
    if not any(off for _, off in late):
        return {}
    offsets = torch.zeros(num_rows, dtype=torch.long)
    for s, off in late:
        offsets[s.row_start:s.row_start + s.end - s.start] = off
    return {i: (offsets <= i).to(device) for i in range(num_layers) if bool((offsets > i).any())}
