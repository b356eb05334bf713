"""Messages into and out of a worker engine (``Engine.step(inputs) -> outputs``).

A request reaches a stage as a stream of :class:`StageInput` pieces, each covering consecutive positions
``[start_position, start_position + num_tokens)``: token ids on the first stage, hidden states
(``[num_tokens, hidden]``) on later ones. The first piece a stage sees carries the :class:`NewRequest`.
A stage answers with :class:`StageOutput`: hidden states for the next stage, or on the last stage one
sampled token (the token that will sit at ``start_position``). Metadata are plain values; tensors only
where tensors belong (hidden states).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from helix.net.sampling import SampledToken, SamplingParams


@dataclass(frozen=True)
class NewRequest:
    """What a stage must know about a request before its first input."""

    request_id: Hashable
    num_prompt_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    """Used in full by the last stage; every stage uses ``max_tokens`` to check KV capacity."""
    prompt_token_ids: tuple[int, ...] = ()
    """Needed by the last stage only for ``repetition_penalty`` (which covers the prompt)."""
    enter_layer: int | None = None
    """Model layer at which the request enters this stage's slice (None = the slice start): the previous
    stage already ran the layers before it."""
    adapter: str | None = None
    """The fine-tuned task whose adapter terms every stage adds to the base model (None = the base
    model; see :mod:`worker.adapters`)."""


@dataclass(frozen=True)
class StageInput:
    """Inputs of positions ``[start_position, start_position + num_tokens)`` of one request."""

    request_id: Hashable
    start_position: int
    token_ids: tuple[int, ...] | None = None
    """First stage: token ids."""
    hidden_states: torch.Tensor | None = None
    """Later stages: ``[num_tokens, hidden]`` from the previous stage."""
    new_request: NewRequest | None = None
    """Set on the first input of a request at this stage."""

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids) if self.token_ids is not None else int(self.hidden_states.shape[0])


@dataclass(frozen=True)
class StageOutput:
    """Hidden states of positions ``[start_position, start_position + n)`` for the next stage, or (last
    stage) the sampled token that will occupy ``start_position``."""

    request_id: Hashable
    start_position: int
    hidden_states: torch.Tensor | None = None
    token: SampledToken | None = None
    finish_reason: str | None = None
    """Last stage: ``"stop"`` (EOS or a stop token) or ``"length"`` (max_tokens); None while running."""
    new_request: NewRequest | None = None
    """Set on a request's first output so the caller can forward it to the next stage."""
    prompt_logprobs: tuple[SampledToken, ...] = ()
    """Last stage, on a request's first token when it asked for ``prompt_logprobs``: the logprob of
    each prompt token after the first (``token_id`` is the prompt's token)."""


class Engine(Protocol):
    """What a worker process drives. A vLLM-backed engine can implement the same three methods."""

    def step(self, inputs: Sequence[StageInput]) -> list[StageOutput]:
        """Take newly arrived inputs, run one iteration (possibly empty), return what it produced."""
        ...

    def release(self, request_ids: Sequence[Hashable]) -> None:
        """Forget requests (finished elsewhere, or aborted) and free their KV now."""
        ...

    def has_work(self) -> bool:
        """True while some request has inputs this stage has not processed yet."""
        ...
