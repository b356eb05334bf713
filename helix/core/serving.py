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

from helix.core.errors import SpecError
from helix.core.models import known_dtype


#: A spec's step token budget (``serving.chunk_tokens``) when it sets none or says ``auto``; why
#: 256: :attr:`ServingSpec.chunk_tokens`. A prompt-heavy workload raises it (``helix.core.spec``).
DEFAULT_STEP_TOKENS = 256

#: A worker engine's step budget when nothing configures it (an engine built on its own: tests,
#: benchmarks), and so what the workers of plans written before ``serving.chunk_tokens`` existed
#: ran with: a plan's serving section without the field reads as this. Not
#: :data:`DEFAULT_STEP_TOKENS`, which would change how such plans serve.
ENGINE_STEP_TOKENS = 512

#: A step's token budget when chunked prefill is off (``chunk_tokens: 0``).
UNCHUNKED_STEP_TOKENS = 2048

#: Step budgets at which the prediction is checked against the simulator
#: (``scripts/bench_fidelity.py``: within 15 % on throughput and 25 % on TTFT and TPOT p50 for
#: every case), and so those the planner chooses among for ``chunk_tokens: auto``
#: (``planner.budget``). Elsewhere it errs more (BENCHMARKS.md, *Plan vs simulator*): at 1,024
#: and 2,048 decode tokens/s holds within 14 % on the four cases (other pipelines' prompts count
#: as convoys along the nodes they share), but a 3-region chain's TPOT p50 is understated by 31 %
#: and 42 % (its decodes queue behind the prompts' pieces on 100 Mb/s crossings), and the
#: simulator serves 29-40 % less there than at 256 on every 70B case; at 128 decode errs by up
#: to 24 % (a step budget below a wave's decodes splits the waves); with chunking off (0) it has
#: understated the reference's 24-stage chain by up to 36 %.
CHECKED_STEP_BUDGETS = (256, 512)

#: ``serving.chunk_tokens: auto``: the planner chooses the step budget.
AUTO_STEP_BUDGET = "auto"


def sets_step_budget(serving: dict) -> bool:
    """Whether a spec's ``serving:`` mapping as written sets its step budget: ``chunk_tokens`` is
    there and not ``auto`` (a number, or a value the field refuses)."""
    return serving.get("chunk_tokens", AUTO_STEP_BUDGET) != AUTO_STEP_BUDGET


def resolve_step_budget(serving: dict, default: int = DEFAULT_STEP_TOKENS) -> dict:
    """A spec's ``serving:`` mapping as written, with its step budget resolved: ``chunk_tokens``
    unset is ``default``; ``auto`` is ``default`` too (the budget the placement is searched with)
    and sets ``choose_chunk_tokens`` (the planner chooses the budget); a set budget stays as
    written (:func:`sets_step_budget`; the field validates it)."""
    if sets_step_budget(serving):
        return serving
    chosen = {"choose_chunk_tokens": True} if "chunk_tokens" in serving else {}   # auto
    return {**serving, "chunk_tokens": default, **chosen}


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
    chunk_tokens: int = Field(DEFAULT_STEP_TOKENS, ge=0)
    """Token budget of a worker step (decodes + prefill chunks: chunked prefill, Sarathi); 0 =
    whole prompts (Orca), a step then takes up to :data:`UNCHUNKED_STEP_TOKENS` tokens and a
    longer prompt runs alone. 256, not vLLM's 2048: in deep pipelines a long prompt step holds up
    every decode wave behind it at every stage it crosses (a convoy), so a smaller budget serves
    more: in the simulator (bench_fidelity's steady state; BENCHMARKS.md, *Plan vs simulator*) 512
    serves more decode tokens/s than 2048 on single24, geo24, hetero42 and single24-30b, and 256
    more again than 512 on all four, with every prediction figure within its target at 256;
    ``chunk_tokens: auto`` picks 256 on all four plans. ``auto``
    has the planner choose the budget by the prediction (:attr:`choose_chunk_tokens`) among those
    it is checked at (:data:`CHECKED_STEP_BUDGETS`: 256 and 512)."""
    choose_chunk_tokens: bool | None = None
    """True when the spec says ``chunk_tokens: auto``: ``helix plan`` predicts its placement at
    each budget of :data:`CHECKED_STEP_BUDGETS` and writes the one with the most decode
    tokens/s into the plan's serving section, which the simulator and ``helix serve`` then run
    with (``chunk_tokens`` is then only the budget the placement is searched with). None: the
    spec's budget is kept."""

    @model_validator(mode="before")
    @classmethod
    def _step_budget(cls, data: object) -> object:
        return resolve_step_budget(data) if isinstance(data, dict) else data
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
    chunk_tokens: int = Field(ENGINE_STEP_TOKENS, ge=0)
    """Step token budget (chunked prefill); 0 = whole prompts. The default is what workers of plans
    written before this field ran with (the engine's own, :data:`ENGINE_STEP_TOKENS`)."""
    adapter_cache_bytes: int = Field(ServingSpec().adapter_cache_bytes, ge=1)
    kv_capacity_tokens: dict[str, int]
    """Node -> tokens of KV its pool holds on every layer of its slice; the worker's pool is this
    many tokens rounded down to whole blocks."""

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, value: str) -> str:
        return known_dtype(value)

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
