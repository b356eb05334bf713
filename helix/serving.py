"""Serving limits: one name and one default for each setting that bounds what a node holds and
batches, carried from the cluster spec through ``plan.yaml`` to every consumer.

- :class:`ServingSpec` is the spec's ``serving:`` section: the cost model sizes KV pools and
  batches with it, and the simulator's workers and coordinator run with it.
- :class:`ServingLimits` is the plan's ``serving:`` section: the same settings, the dtype, and each
  placed node's KV pool (the cost model's figure for the slice the plan gives it, the one the
  simulator gives the same node). ``helix serve`` configures its workers and the live coordinator
  from it alone, so the live system batches and holds what the planner and the simulator assumed.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from helix.errors import SpecError
from helix.models import DTYPE_BYTES


#: A step's token budget when chunked prefill is off (``chunk_tokens: 0``).
UNCHUNKED_STEP_TOKENS = 2048


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class ServingSpec(_Frozen):
    """Memory and batching limits that shape node throughput and what a node can hold."""

    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    """Fraction of a node's memory (its GPUs', or ``memory`` of a CPU node) the worker may use for
    weights and KV, as in vLLM."""
    min_kv_requests: float = Field(4.0, ge=0)
    """A node must keep KV room for this many mean-size requests on every layer it holds."""
    max_batch_seqs: int = Field(256, ge=1)
    """Most sequences one worker step runs together."""
    kv_high_water: float = Field(0.9, gt=0, le=1)
    """The coordinator sends a node no new request once the KV reserved for its requests would pass
    this fraction of the node's pool (Helix section 5)."""
    block_size_tokens: int = Field(16, ge=1)
    """Positions per block of a worker's paged KV cache."""
    chunk_tokens: int = Field(256, ge=0)
    """Token budget of a worker step (decodes + prefill chunks: chunked prefill, Sarathi); 0 =
    whole prompts (Orca), a step then takes up to :data:`UNCHUNKED_STEP_TOKENS` tokens and a
    longer prompt runs alone. 256, not vLLM's 2048: in deep pipelines a long prompt step holds up
    every decode wave behind it at every stage it crosses (a convoy), so a smaller budget serves
    more. In the simulator (bench_fidelity, steady state, 600 s, BENCHMARKS.md of 2026-11-25) 512
    served 13-27 % more decode tokens/s than 2048 on single24, geo24, hetero42 and single24-30b, and
    256 more again than 512 on all four (695 / 430 / 1,481 / 661 vs 568 / 387 / 1,203 / 422), with
    every prediction figure within its target there (at 512 hetero42's throughput and geo24's
    TTFT sat at or past the edge); ``chunk_tokens: auto`` picked 256 on all four plans. ``auto``
    has the planner choose the budget by the prediction (:attr:`choose_chunk_tokens`) among those
    it is checked at (``planner.prediction.CHECKED_STEP_BUDGETS``: 256 and 512)."""
    choose_chunk_tokens: bool | None = None
    """True when the spec says ``chunk_tokens: auto``: ``helix plan`` predicts its placement at
    each budget of :data:`planner.budget.CANDIDATES` and writes the one with the most decode
    tokens/s into the plan's serving section, which the simulator and ``helix serve`` then run
    with (``chunk_tokens`` is then only the budget the placement is searched with). None: the
    spec's budget is kept."""

    @model_validator(mode="before")
    @classmethod
    def _auto_budget(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("chunk_tokens") == "auto":
            data = {**data, "chunk_tokens": cls.model_fields["chunk_tokens"].default,
                    "choose_chunk_tokens": True}
        return data
    adapter_cache_bytes: int = Field(2**30, ge=1)
    """Bytes each worker may hold of registered fine-tuned tasks made ready from disk (an LRU
    cache of packed adapters, on the worker's device: :mod:`worker.adapter_cache`), beside its
    weights and KV pool; 1 GiB holds ~13 LLaMA-2 7B LoRA r=16 tasks on all projections in float16,
    or ~400 of them on a stage of 1/32 of the layers. A task bigger than this on a worker's layers
    is refused when a request needs it."""


class ServingLimits(_Frozen):
    """What a plan's workers run with: written by ``helix plan``, read by ``helix serve``."""

    dtype: str
    """Of weights, activations and KV (the spec's ``dtype``)."""
    gpu_memory_utilization: float = Field(gt=0, le=1)
    """The fraction the KV pools below were sized with."""
    max_batch_seqs: int = Field(ge=1)
    kv_high_water: float = Field(gt=0, le=1)
    block_size_tokens: int = Field(ge=1)
    chunk_tokens: int = Field(512, ge=0)
    """Step token budget (chunked prefill); 0 = whole prompts. The default is what workers of plans
    written before this field ran with (the engine's own 512)."""
    adapter_cache_bytes: int = Field(ServingSpec().adapter_cache_bytes, ge=1)
    kv_capacity_tokens: dict[str, int]
    """Node -> tokens of KV its pool holds on every layer of its slice; the worker's pool is this
    many tokens rounded down to whole blocks."""

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, value: str) -> str:
        if value not in DTYPE_BYTES:
            raise ValueError(f"unknown dtype {value!r}; known: {', '.join(DTYPE_BYTES)}")
        return value

    @classmethod
    def of(cls, serving: ServingSpec, dtype: str,
           kv_capacity_tokens: dict[str, int]) -> "ServingLimits":
        """The spec's settings with the nodes' KV pools."""
        return cls(dtype=dtype, gpu_memory_utilization=serving.gpu_memory_utilization,
                   max_batch_seqs=serving.max_batch_seqs, kv_high_water=serving.kv_high_water,
                   block_size_tokens=serving.block_size_tokens,
                   chunk_tokens=serving.chunk_tokens,
                   adapter_cache_bytes=serving.adapter_cache_bytes,
                   kv_capacity_tokens=dict(kv_capacity_tokens))

    @property
    def step_tokens(self) -> int:
        """A worker step's token budget: the chunk budget, or the unchunked one."""
        return self.chunk_tokens or UNCHUNKED_STEP_TOKENS

    def kv_blocks(self, node: str) -> int:
        """Blocks of ``node``'s KV pool."""
        return self.kv_capacity_tokens[node] // self.block_size_tokens

    def to_dict(self) -> dict:
        return self.model_dump(mode="json")

    @classmethod
    def from_dict(cls, data: object, where: str = "plan") -> "ServingLimits":
        """Validate a plan's ``serving:`` section; SpecError with one line naming the field."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(p) for p in err["loc"])
            raise SpecError(f"{where}: serving{'.' + field if field else ''}: {err['msg']}") from None
