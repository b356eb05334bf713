"""Which attention a slice runs, and the per-step layout the paged kernels read.

Three backends compute the same causal attention over the paged KV cache of :mod:`worker.kv_cache`:

- ``triton`` (CUDA): :mod:`worker.triton_ops` kernels read keys and values through the block
  tables, and the decode layer is 9-10 kernels (fused add + RMSNorm, rotary + KV store, SiLU-mul);
  every tensor of a decode step has a fixed shape, so :mod:`worker.decode_graphs` can capture it.
- ``native`` (CPU, float32): :mod:`worker.native`'s C kernel, reading the cache in place.
- ``gather``: plain PyTorch, any device and dtype: each context is gathered into a contiguous
  buffer and attended to with SDPA (decodes grouped by context length, see
  :func:`worker.step_batch.decode_groups`). The fallback, and the oracle of the other two.

With ``triton`` and ``native``, the rows of a step that continue a request (decodes, and prompt
chunks after the first) are one :class:`PagedLayout`; a chunk that starts its request attends
only over the step's own keys with SDPA either way (no cache read at all).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import numpy as np
import torch

log = logging.getLogger("helix.attention")

BACKENDS = ("auto", "triton", "native", "gather")


@dataclass
class PagedLayout:
    """Sequences of one step whose rows attend over the paged cache (all tensors int32, on the
    model's device). Sequence ``s``: query rows ``[q_starts[s], q_starts[s] + q_lens[s])`` of the
    step at positions ``seq_lens[s] - q_lens[s] ...``, keys ``[0, seq_lens[s])`` in blocks
    ``block_tables[s]``."""

    block_tables: torch.Tensor   # [S, max_blocks]
    seq_lens: torch.Tensor       # [S]
    q_starts: torch.Tensor       # [S]
    q_lens: torch.Tensor         # [S]
    tile_seqs: torch.Tensor | None = None     # [tiles] (triton): each program's sequence
    tile_firsts: torch.Tensor | None = None   # [tiles] (triton): its first query token
    block_q: int = 1                          # (triton) query tokens a program takes

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.shape[0]


def resolve_backend(requested: str, device: torch.device, dtype: torch.dtype) -> str:
    """The backend an engine on ``device`` in ``dtype`` runs: ``requested`` unless it is ``auto``
    (``HELIX_ATTENTION`` overrides ``auto``). Auto picks ``triton`` on CUDA when Triton is
    installed, ``native`` on a CPU in float32 when the kernel builds, else ``gather``. A backend
    asked for by name that cannot run here is a ValueError."""
    if requested == "auto":
        requested = os.environ.get("HELIX_ATTENTION", "auto")
    if requested not in BACKENDS:
        raise ValueError(f"unknown attention backend {requested!r}; known: {', '.join(BACKENDS)}")
    if requested == "auto":
        if device.type == "cuda" and _triton_available(device):
            return "triton"
        if device.type == "cpu" and dtype == torch.float32 and _native_available():
            return "native"
        return "gather"
    if requested == "triton" and not _triton_available(device):
        raise ValueError(f"attention backend 'triton' needs triton and a CUDA device (or "
                         f"TRITON_INTERPRET=1); device is {device}")
    if requested == "native" and not (device.type == "cpu" and dtype == torch.float32
                                      and _native_available()):
        raise ValueError(f"attention backend 'native' needs a CPU, float32 and a C compiler; "
                         f"device {device}, dtype {dtype}")
    return requested


def _triton_available(device: torch.device) -> bool:
    try:
        from worker import triton_ops
    except ImportError:
        return False
    return triton_ops.available(device)


def _native_available() -> bool:
    from worker import native
    return native.load() is not None


def paged_layout(tables: list[tuple[int, ...]], seq_lens: list[int], q_starts: list[int],
                 q_lens: list[int], block_size: int, device: torch.device,
                 triton_tiles: bool, group: int) -> PagedLayout:
    """The layout of sequences with those block tables (host lists), built as one int32 array
    and moved to ``device`` in one copy."""
    num = len(seq_lens)
    width = max((-(-n // block_size) for n in seq_lens), default=1) or 1
    block_q, tiles = 1, None
    if triton_tiles:
        from worker.triton_ops import attention_tiles, query_tile
        block_q = query_tile(group, max(q_lens, default=1))
        tiles = attention_tiles(q_lens, block_q)
    num_tiles = len(tiles[0]) if tiles else 0
    # Every part starts 16-byte aligned (4 int32): Triton specialises pointer arguments on
    # 16-byte alignment, so unaligned parts would compile new kernel variants step by step.
    sizes = (num * width, num, num, num) + ((num_tiles, num_tiles) if tiles else ())
    starts = [0]
    for size in sizes:
        starts.append(starts[-1] + -(-size // 4) * 4)
    flat = np.zeros(starts[-1], dtype=np.int32)
    grid = flat[:num * width].reshape(num, width)
    for s, (table, n) in enumerate(zip(tables, seq_lens)):
        used = -(-n // block_size)
        grid[s, :used] = table[:used]
    for at, values in zip(starts[1:], (seq_lens, q_starts, q_lens) + (tiles or ())):
        flat[at:at + len(values)] = values
    dev = torch.from_numpy(flat).to(device)
    parts = [dev[at:at + size] for at, size in zip(starts[1:], sizes[1:])]
    return PagedLayout(dev[:num * width].view(num, width), *parts[:3],
                       tile_seqs=parts[3] if tiles else None, tile_firsts=parts[4] if tiles else None,
                       block_q=block_q)
