"""A request's mutable state inside the simulator (counters only: no per-token objects)."""

from __future__ import annotations

from coordinator.pipeline import Pipeline


class SimRequest:
    """One request from arrival to finish.

    ``sent_at_s[i]`` is when the latest input for stage ``i`` left its sender (for per-hop delays;
    kept only while the scheduler uses them).
    """

    __slots__ = ("request_id", "arrival_s", "prompt_tokens", "output_tokens", "pipeline",
                 "workers", "admitted_s", "first_token_s", "last_token_s", "finish_s",
                 "generated", "received", "sent_at_s", "decode_latency_sum_s",
                 "epoch", "moves", "task")

    def __init__(self, request_id: int, arrival_s: float, prompt_tokens: int,
                 output_tokens: int, task: str | None = None) -> None:
        self.request_id = request_id
        self.arrival_s = arrival_s
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.pipeline: Pipeline | None = None
        self.workers: tuple = ()
        self.admitted_s: float | None = None
        self.first_token_s: float | None = None
        self.last_token_s = 0.0
        self.finish_s: float | None = None
        self.generated = 0
        """Tokens sampled by the last stage."""
        self.received = 0
        """Tokens that reached the coordinator (streamed to the user)."""
        self.sent_at_s: list[float] = []
        self.decode_latency_sum_s = 0.0
        self.epoch = 0
        """Which pipeline the request is on (it changes when the request moves off a dead node):
        messages of an older epoch are stale."""
        self.moves = 0
        self.task = task
        """The fine-tuned task it names (None: the base model)."""

    @property
    def done(self) -> bool:
        return self.finish_s is not None
