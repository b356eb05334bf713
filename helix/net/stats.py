"""A worker's stats snapshot: what the control service reports and the coordinator reads."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from helix.core.slices import LayerSlice


@dataclass(frozen=True)
class WorkerStats:
    """One snapshot of a worker, as the control service reports it."""

    node: str
    configured: bool
    start: int
    end: int
    """The worker's slice: layers ``[start, end)`` (``0, 0`` until it is configured)."""
    kv_blocks_total: int
    kv_blocks_used: int
    block_size_tokens: int
    dtype: str
    """Of the slice's weights, activations and KV (the plan's ``serving.dtype``)."""
    max_batch_seqs: int
    """Most sequences one step runs (the plan's ``serving.max_batch_seqs``)."""
    num_waiting: int
    """Requests with inputs not yet computed (policy queue)."""
    num_running: int
    num_requests: int
    """Requests holding state on this worker."""
    steps_total: int
    step_time_s_avg: float
    """Exponential average of non-empty step times."""
    last_step_unix_s: float | None
    """Wall time the last non-empty step finished without error (None: never)."""
    last_error: str | None
    draining: bool
    num_preemptions_total: int = 0
    """Requests this worker's step policy preempted (KV given back, recomputed later) since start."""
    step_tokens: int = 0
    """Token budget of one step (the plan's ``serving.chunk_tokens``, or the unchunked budget)."""
    chunked_prefill: bool = True
    """Whether prompts are cut into chunks that fill the step's budget."""
    adapter_cache_hits: int = 0
    """Requests whose registered task was ready in the worker's adapter cache (since start)."""
    adapter_cache_misses: int = 0
    """Registered tasks read from disk into the cache (since start)."""
    adapter_cache_evictions: int = 0
    adapter_cache_bytes: int = 0
    """Bytes the cache holds now (packed tasks, on the worker's device)."""
    adapter_cache_budget_bytes: int = 0
    """The plan's ``serving.adapter_cache_bytes``."""
    adapter_load_s_p50: float | None = None
    """Median time to make a task ready (read, check, pack, copy to the device), over the last
    loads; None: none yet."""
    adapter_load_s_p99: float | None = None
    step_time_s_total: float = 0.0
    """Seconds spent in non-empty steps since start (its growth over a wall interval is how busy
    the worker was)."""
    bytes_sent_to: dict[str, int] = field(default_factory=dict)
    """Data-plane bytes sent to each peer (node name or ``coordinator``) since start."""

    @property
    def layers(self) -> LayerSlice:
        """The worker's slice."""
        return LayerSlice(self.node, self.start, self.end)

    @property
    def kv_blocks_free(self) -> int:
        return self.kv_blocks_total - self.kv_blocks_used

    @property
    def kv_used_token_layers(self) -> int:
        return self.kv_blocks_used * self.block_size_tokens * self.layers.num_layers

    @property
    def kv_capacity_token_layers(self) -> int:
        return self.kv_blocks_total * self.block_size_tokens * self.layers.num_layers

    def to_dict(self) -> dict:
        return {**asdict(self), "kv_blocks_free": self.kv_blocks_free}

    @classmethod
    def from_dict(cls, d: dict) -> "WorkerStats":
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})
