"""How the live coordinator runs (:class:`RuntimeConfig`): its queue, timeouts, health rules,
context limit, task placement and the engine options it passes to every worker."""

from __future__ import annotations

from dataclasses import dataclass, field

from coordinator.health import HealthConfig
from coordinator.task_placement import PlacementConfig
from helix.core.spec import WorkloadSpec


@dataclass(frozen=True)
class RuntimeConfig:
    """How the live coordinator runs."""

    max_waiting_requests: int | None = None
    """New requests that may wait for a pipeline; one more is refused (HTTP 503 with Retry-After).
    None: as many as the capacity still serving completes in ``max_queue_wait_s``
    (:mod:`coordinator.admission`). Requests that moved off a node (admitted before) never count."""
    min_waiting_requests: int = 64
    """With ``max_waiting_requests`` None: at least this many may wait."""
    max_queue_wait_s: float | None = None
    """With ``max_waiting_requests`` None: the wait the queue is sized for; None: 1.5 x the time a
    worker restart takes (measured as nodes come back; ``expected_restart_s`` until then)."""
    expected_restart_s: float = 10.0
    """Seconds a worker restart is assumed to take until one is measured."""
    retry_after_s: int = 1
    """Retry-After when no pipeline is left, and for a full queue of fixed size."""
    stats_interval_s: float = 0.25
    request_timeout_s: float = 60.0
    """A request with no output for this long is cancelled."""
    configure_timeout_s: float = 180.0
    health_window_s: float = 30.0
    """``healthy()`` without a probe needs a pipeline whose every stage stepped this recently."""
    health: HealthConfig = field(default_factory=HealthConfig)
    """When a silent worker becomes suspect (no new requests) and dead (its requests move)."""
    max_model_len: int | None = None
    """Most prompt + output tokens a request may have (vLLM's ``--max-model-len``), at most the
    checkpoint's ``max_position_embeddings``; None: that."""
    expected_output_tokens: float = WorkloadSpec().mean_output_tokens
    """Seed of the running mean of output lengths that requests reserve KV for (see
    :class:`~coordinator.kv_estimator.OutputLengthMean`)."""
    task_placement: PlacementConfig | None = None
    """Place fine-tuned tasks on some of the plan's pipelines and move them with the load
    (:mod:`coordinator.task_placement`); None: every worker holds every task."""
    engine: dict = field(default_factory=dict)
    """More engine options for every worker (``worker.engine_config.EngineConfig`` field names); the
    plan's serving limits (:data:`coordinator.workers.PLAN_ENGINE_OPTIONS`) are not among them."""
