"""Paged KV storage for the layers of one slice.

One key tensor and one value tensor per layer of the slice, each ``[kv_heads, num_blocks * block_size,
head_dim]``: a *slot* is one position of one block (``slot = block_id * block_size + offset``). Heads come
first so that gathering a batch of contexts yields ``[kv_heads, batch, context, head_dim]`` contiguous,
which attention consumes without a transpose (measured 2-3x faster than slot-major on CPU). The
block ids come from :class:`worker.kv_blocks.KVBlockManager`; the same block id is used in every layer,
so a request that enters the slice at a later layer simply never touches the earlier layers' slots.
"""

from __future__ import annotations


import torch

from helix.core.errors import InfeasibleError


def kv_bytes_per_block(num_layers: int, block_size_tokens: int, num_kv_heads: int, head_dim: int,
                       dtype: torch.dtype) -> int:
    """Bytes one block occupies across all layers of the slice (keys and values)."""
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * block_size_tokens * num_kv_heads * head_dim * elem


def num_blocks_for_budget(kv_budget_bytes: int, num_layers: int, block_size_tokens: int,
                          num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Blocks that fit in ``kv_budget_bytes``; InfeasibleError when not even one does."""
    per_block = kv_bytes_per_block(num_layers, block_size_tokens, num_kv_heads, head_dim, dtype)
    n = kv_budget_bytes // per_block
    if n < 1:
        raise InfeasibleError(f"KV budget of {kv_budget_bytes} bytes holds no block of "
                              f"{block_size_tokens} tokens ({per_block} bytes for {num_layers} layers)")
    return int(n)


class PagedKVCache:
    """Key/value tensors of ``num_layers`` layers, addressed by slot."""

    def __init__(self, num_layers: int, num_blocks: int, block_size_tokens: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        self.block_size_tokens = block_size_tokens
        shape = (num_layers, num_kv_heads, num_blocks * block_size_tokens, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store ``k``/``v`` ([num_tokens, kv_heads, head_dim]) at ``slots`` ([num_tokens]) of ``layer``
        (index within the slice)."""
        self.keys[layer].index_copy_(1, slots, k.transpose(0, 1))
        self.values[layer].index_copy_(1, slots, v.transpose(0, 1))

    def read_blocks(self, layer: int, block_ids: torch.Tensor,
                    out: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of whole blocks: ``block_ids`` ``[*S, n]`` -> ``[kv_heads, *S, n * block_size,
        head_dim]`` each. One row of the gather is a block (``block_size * head_dim`` contiguous
        elements), measured about 2x faster on CPU than gathering the same context slot by slot.
        ``out``: contiguous key and value buffers of ``[kv_heads, block_ids.numel(), block_size *
        head_dim]`` to gather into (reused across layers instead of allocating per read)."""
        bs = self.block_size_tokens
        kv_heads, num_slots, head_dim = self.keys.shape[1:]
        flat = block_ids.reshape(-1)
        shape = (kv_heads, *block_ids.shape[:-1], block_ids.shape[-1] * bs, head_dim)
        by_block = (kv_heads, num_slots // bs, bs * head_dim)
        if out is None:
            return (self.keys[layer].view(by_block).index_select(1, flat).view(shape),
                    self.values[layer].view(by_block).index_select(1, flat).view(shape))
        torch.index_select(self.keys[layer].view(by_block), 1, flat, out=out[0])
        torch.index_select(self.values[layer].view(by_block), 1, flat, out=out[1])
        return out[0].view(shape), out[1].view(shape)
