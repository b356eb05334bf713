"""KV block accounting: a free list and one block table per request (pure, no torch).

The paged KV cache of a worker is a pool of ``num_blocks`` fixed-size blocks, each holding the keys and
values of ``block_size_tokens`` consecutive positions of one request (for every layer of the slice: the
same block id indexes each layer's storage). This module only does the bookkeeping; the tensors live in
:mod:`worker.kv_cache`. The simulator uses it unchanged.

Contract:
- ``allocate(rid, num_tokens)`` grows ``rid``'s table until it covers ``num_tokens`` positions, taking
  blocks from the free list in LIFO order (deterministic); it never shrinks a table.
- ``can_allocate(rid, num_tokens)`` is true exactly when that ``allocate`` would succeed.
- ``free(rid)`` returns all of ``rid``'s blocks at once. Every block is at any time either free or in
  exactly one table (``check_invariants`` verifies it).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping


class KVCacheFullError(RuntimeError):
    """``allocate`` was called without a successful ``can_allocate``: a scheduling bug."""


def blocks_for_tokens(num_tokens: int, block_size_tokens: int) -> int:
    """Blocks needed to hold ``num_tokens`` positions (ceil division)."""
    return -(-num_tokens // block_size_tokens)


class KVBlockManager:
    """Free list plus per-request block tables over ``num_blocks`` blocks of ``block_size_tokens``."""

    def __init__(self, num_blocks: int, block_size_tokens: int) -> None:
        if num_blocks < 1 or block_size_tokens < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size_tokens >= 1, got "
                             f"{num_blocks}, {block_size_tokens}")
        self.num_blocks = num_blocks
        self.block_size_tokens = block_size_tokens
        # Reversed so that pop() hands out 0, 1, 2, ... first: easier to read in tests and dumps.
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._tables: dict[Hashable, list[int]] = {}

    # --- queries ------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def capacity_tokens(self) -> int:
        """Most positions one request could ever hold (the whole pool)."""
        return self.num_blocks * self.block_size_tokens

    @property
    def tables(self) -> Mapping[Hashable, list[int]]:
        """Each request's block ids in position order, read-only."""
        return self._tables

    def block_table(self, request_id: Hashable) -> tuple[int, ...]:
        """Block ids of ``request_id`` in position order (empty if it holds none)."""
        return tuple(self._tables.get(request_id, ()))

    def capacity_of(self, request_id: Hashable) -> int:
        """Positions ``request_id`` can hold without allocating more blocks."""
        return len(self._tables.get(request_id, ())) * self.block_size_tokens

    def blocks_needed(self, request_id: Hashable, num_tokens: int) -> int:
        """New blocks ``request_id`` needs to cover ``num_tokens`` positions."""
        have = len(self._tables.get(request_id, ()))
        return max(0, blocks_for_tokens(num_tokens, self.block_size_tokens) - have)

    def can_allocate(self, request_id: Hashable, num_tokens: int) -> bool:
        return self.blocks_needed(request_id, num_tokens) <= len(self._free)

    def request_ids(self) -> tuple[Hashable, ...]:
        return tuple(self._tables)

    # --- updates ------------------------------------------------------------------------------
    def allocate(self, request_id: Hashable, num_tokens: int) -> tuple[int, ...]:
        """Grow ``request_id``'s table to cover ``num_tokens`` positions; return the new block ids."""
        table = self._tables.get(request_id)
        need = -(-num_tokens // self.block_size_tokens) - (0 if table is None else len(table))
        if need <= 0:
            if table is None:
                self._tables[request_id] = []
            return ()
        free = self._free
        if need > len(free):
            raise KVCacheFullError(f"request {request_id!r} needs {need} blocks, {len(free)} free")
        new = free[-need:]
        new.reverse()   # the order of ``need`` pops off the end
        del free[-need:]
        if table is None:
            self._tables[request_id] = new
        else:
            table.extend(new)
        return tuple(new)

    def free(self, request_id: Hashable) -> int:
        """Return every block of ``request_id`` to the free list; number of blocks freed."""
        blocks = self._tables.pop(request_id, [])
        # Reverse so the most recently taken block is handed out next (LIFO, deterministic).
        self._free.extend(reversed(blocks))
        return len(blocks)

    def check_invariants(self) -> None:
        """Every block is free or owned by exactly one request (AssertionError otherwise)."""
        owned = [b for t in self._tables.values() for b in t]
        everything = owned + self._free
        assert len(everything) == self.num_blocks, (len(owned), len(self._free), self.num_blocks)
        assert sorted(everything) == list(range(self.num_blocks)), "a block is lost or held twice"
