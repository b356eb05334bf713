"""How one :class:`~worker.engine.SliceEngine` runs its slice (:class:`EngineConfig`), the dtype
names it accepts (:func:`torch_dtype`) and the check that the plan's KV pool fits the device
(:func:`check_pool_fits`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from helix.core.errors import HelixUserError
from helix.core.serving import ENGINE_STEP_TOKENS, ServingSpec

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a dtype name (``float32``, ``float16``, ``bfloat16``)."""
    try:
        return _DTYPES[name]
    except KeyError:
        raise HelixUserError(f"unknown dtype {name!r}; known: {', '.join(_DTYPES)}") from None


_SERVING = ServingSpec()   # the one default of each serving limit


@dataclass(frozen=True)
class EngineConfig:
    """How one engine runs its slice. A served worker gets ``dtype``, ``block_size_tokens``,
    ``num_kv_blocks`` and ``max_num_seqs`` from the plan's serving limits (the coordinator's
    ``Configure``); the defaults here are for an engine built on its own (tests, benchmarks)."""

    block_size_tokens: int = _SERVING.block_size_tokens
    num_kv_blocks: int | None = None
    """KV blocks of the pool; None = derive from ``kv_budget_bytes``."""
    kv_budget_bytes: int = 256 * 2**20
    max_num_seqs: int = _SERVING.max_batch_seqs
    max_num_batched_tokens: int = ENGINE_STEP_TOKENS
    chunked_prefill: bool = True
    dtype: str = "float32"
    device: str | None = None
    """None = CUDA when present, else CPU."""
    seed: int = 0
    """Seed of the shared sampling generator (requests with their own ``seed`` use their own)."""
    eos_token_ids: tuple[int, ...] = ()
    pack_cpu_weights: bool = True
    """Also keep float32 CPU weights packed for MKL (faster decode GEMMs, twice the weight memory);
    see :class:`worker.model.Linear`."""
    adapter_cache_bytes: int = _SERVING.adapter_cache_bytes
    """Budget of the LRU cache of registered tasks made ready from disk (the plan's
    ``serving.adapter_cache_bytes``; :mod:`worker.adapter_cache`)."""
    attention: str = "auto"
    """Attention backend: ``auto`` (Triton kernels on CUDA, the C kernel on a CPU in float32,
    else ``gather``), or ``triton`` / ``native`` / ``gather`` by name (:mod:`worker.attention`)."""
    decode_graphs: str = "auto"
    """Plain decode steps through static buffers (:mod:`worker.decode_graphs`): ``auto`` captures
    CUDA graphs on CUDA with the ``triton`` backend and is off elsewhere; ``on`` asks for graphs
    (an error where they cannot be captured); ``eager`` runs the static buffers without capture
    (how CPU tests check the graph path); ``off``."""


def check_pool_fits(pool_bytes: float, free_bytes: float, num_blocks: int, device: str) -> None:
    """HelixUserError when the KV pool the plan gives this worker is more than the device has
    free after the weights (the plan sized it from the spec's memory for the node)."""
    if pool_bytes > free_bytes:
        raise HelixUserError(f"the plan's KV pool ({num_blocks} blocks, {pool_bytes / 2**30:.2f} GiB) "
                             f"does not fit in the {free_bytes / 2**30:.2f} GiB free on {device} "
                             f"after the weights: lower serving.gpu_memory_utilization or the "
                             f"node's memory in the cluster spec, and plan again")
