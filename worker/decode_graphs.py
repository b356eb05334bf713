"""The decode step of a slice as one CUDA graph replay per batch-size bucket.

A decode step of ``n`` rows runs the slice's layers over static buffers sized for the bucket
``B >= n`` (ids or hidden states, positions, KV slots, block tables, context lengths): rows past
``n`` are padding that write their K/V into a scratch block no request owns and attend to it
alone, so they never touch real state. On CUDA each bucket's step is captured once (lazily, on
its first use, all buckets sharing one memory pool, as vLLM and nano-vllm do) and replayed: one
launch instead of ~10 per layer. Steps with prompt chunks, adapter tasks, requests entering the
slice at a later layer, or more rows than the largest bucket run eagerly.

With ``capture=False`` the same static-buffer step runs eagerly: how the tests check, on a CPU,
that the padding and the buffers give the eager path's result.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Sequence

import numpy as np
import torch

from worker.attention import PagedLayout
from worker.model import SliceModel, StepBatch

log = logging.getLogger("helix.graphs")


def buckets(max_seqs: int) -> tuple[int, ...]:
    """Batch sizes with a graph: 1, 2, 4, 8, then every 8 to 64, every 16 to 256, every 32 up to
    ``max_seqs`` (so a step pads at most ~12 % beyond 32 rows)."""
    sizes = [1, 2, 4]
    sizes += list(range(8, 65, 8)) + list(range(80, 257, 16)) + list(range(288, 1025, 32))
    top = [b for b in sizes if b < max_seqs] + [max_seqs]
    return tuple(sorted(set(top)))


class DecodeGraphs:
    """Static buffers and (on CUDA) captured graphs of ``model``'s decode step.

    ``max_positions``: positions the rotary table is built for up front (a table grown after a
    capture would move under it); a step beyond it runs eagerly. ``scratch_block``: a KV block id
    that no request is ever given (the cache holds one block more than the block manager)."""

    def __init__(self, model: SliceModel, max_seqs: int, max_positions: int, scratch_block: int,
                 capture: bool) -> None:
        assert model.backend in ("triton", "native"), "decode graphs need a paged attention backend"
        self.model = model
        self.capture = capture
        self.sizes = buckets(max_seqs)
        self.max_positions = max_positions
        self.scratch_block = scratch_block
        model.rope.ensure(max_positions)
        bs = model.kv.block_size_tokens
        self.block_size = bs
        self.max_blocks = -(-max_positions // bs)
        top, dev = self.sizes[-1], model.device
        spec = model.spec
        self.x = torch.zeros(top, spec.hidden_size, dtype=model.kv.keys.dtype, device=dev)
        self.positions = torch.zeros(top, dtype=torch.long, device=dev)
        self.slots = torch.zeros(top, dtype=torch.long, device=dev)
        self.block_tables = torch.zeros(top, self.max_blocks, dtype=torch.int32, device=dev)
        self.seq_lens = torch.ones(top, dtype=torch.int32, device=dev)
        rows = torch.arange(top, dtype=torch.int32, device=dev)
        self._rows, self._zeros = rows, torch.zeros(top, dtype=torch.int32, device=dev)
        self._ones = torch.ones(top, dtype=torch.int32, device=dev)
        self.out = torch.zeros_like(self.x)
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._pool = None
        self._captured_rope = model.rope.cos   # graphs read this table; if it moves, recapture
        self.replays = 0
        """Steps run through a graph (or, with ``capture=False``, through the static buffers)."""
        # Host staging: one int64 array for positions and slots, one int32 for tables and lengths.
        self._host64 = np.zeros((2, top), dtype=np.int64)
        self._host32 = np.zeros((top, self.max_blocks + 1), dtype=np.int32)

    def bucket(self, n: int) -> int | None:
        """The bucket of an ``n``-row step, None when above the largest."""
        k = bisect.bisect_left(self.sizes, n)
        return self.sizes[k] if k < len(self.sizes) else None

    def fits(self, n: int, max_position: int) -> bool:
        return self.bucket(n) is not None and max_position < self.max_positions

    def _batch(self, b: int) -> StepBatch:
        """The step batch over the first ``b`` rows of the static buffers."""
        paged = PagedLayout(self.block_tables[:b], self.seq_lens[:b], self._rows[:b], self._ones[:b],
                            tile_seqs=self._rows[:b], tile_firsts=self._zeros[:b], block_q=1)
        return StepBatch(positions=self.positions[:b], slots=self.slots[:b], num_decodes=b,
                         decode_groups=[], prefills=[], paged=paged,
                         max_position=self.max_positions - 1)

    def run(self, x: torch.Tensor, positions: Sequence[int], tables: Sequence[Sequence[int]]
            ) -> torch.Tensor:
        """The slice's layers over ``n`` decode rows: ``x`` ``[n, hidden]``, row ``i`` at
        ``positions[i]`` (its context is positions ``[0, positions[i]]``) with block table
        ``tables[i]``. Returns ``[n, hidden]``, a view valid until the next call."""
        n = x.shape[0]
        b = self.bucket(n)
        bs, scratch = self.block_size, self.scratch_block
        h64, h32 = self._host64, self._host32
        h32[:b].fill(scratch)
        h64[0, :b] = 0
        h64[1, :b] = scratch * bs                   # padding rows write the scratch block
        h32[:b, -1] = 1                              # and attend to its first slot only
        for i, (pos, table) in enumerate(zip(positions, tables)):
            used = pos // bs + 1
            h32[i, :used] = table[:used]
            h32[i, -1] = pos + 1
            h64[0, i] = pos
            h64[1, i] = table[pos // bs] * bs + pos % bs
        dev = self.model.device
        meta64 = torch.from_numpy(h64[:, :b]).to(dev, non_blocking=True)
        meta32 = torch.from_numpy(h32[:b]).to(dev, non_blocking=True)
        self.positions[:b].copy_(meta64[0])
        self.slots[:b].copy_(meta64[1])
        self.block_tables[:b].copy_(meta32[:, :-1])
        self.seq_lens[:b].copy_(meta32[:, -1])
        self.x[:n].copy_(x)
        if b > n:
            self.x[n:b].zero_()
        self.replays += 1
        counted = list(self.model.rows_run)
        if not self.capture:
            self.out[:b] = self.model.forward(self.x[:b], self._batch(b))
        else:
            if self.model.rope.cos is not self._captured_rope:   # an eager step grew the table
                self._graphs.clear()
                self._captured_rope = self.model.rope.cos
            graph = self._graphs.get(b)
            if graph is None:
                graph = self._graphs[b] = self._capture(b)
            graph.replay()
        self.model.rows_run = [c + n for c in counted]   # real rows only, replayed or not
        return self.out[:n]

    def capture_all(self) -> None:
        """Capture every bucket now, largest first (as nano-vllm), over an all-padding step, so no
        serving step pays a capture (eager warm-up, synchronize, empty_cache, instantiate)."""
        if not self.capture:
            return
        counted = list(self.model.rows_run)
        self.x.zero_()
        self.positions.zero_()
        self.slots.fill_(self.scratch_block * self.block_size)
        self.block_tables.fill_(self.scratch_block)
        self.seq_lens.fill_(1)
        for b in reversed(self.sizes):
            if b not in self._graphs:
                self._graphs[b] = self._capture(b)
        self.model.rows_run = counted

    def _capture(self, b: int) -> "torch.cuda.CUDAGraph":
        """Capture bucket ``b`` (its buffers hold a real or padding step: the warm-up runs it
        eagerly first, which also compiles the Triton kernels outside the capture)."""
        batch = self._batch(b)
        stream = torch.cuda.Stream(self.model.device)
        stream.wait_stream(torch.cuda.current_stream(self.model.device))
        with torch.cuda.stream(stream):
            self.out[:b] = self.model.forward(self.x[:b], batch)
        torch.cuda.current_stream(self.model.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            self.out[:b] = self.model.forward(self.x[:b], batch)
        if self._pool is None:
            self._pool = graph.pool()
        log.debug("captured the decode step for %d rows", b)
        return graph
