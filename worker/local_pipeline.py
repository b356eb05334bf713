"""Drive a chain of engines in one process: the smallest pipeline runtime (tests, benchmarks, demos).

Stage ``k``'s outputs become stage ``k + 1``'s inputs; the last stage's tokens go back to the first
stage as the next decode input; finished requests are released on every stage. The real runtime moves
the same :mod:`helix.net.io_types` objects over ZeroMQ instead.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace

from helix.net.io_types import Engine, NewRequest, StageInput, StageOutput
from helix.net.sampling import SamplingParams


@dataclass(frozen=True)
class Prompt:
    request_id: Hashable
    token_ids: tuple[int, ...]
    sampling: SamplingParams
    adapter: str | None = None
    """The request's task (None = the base model)."""


class LocalPipeline:
    """Engines in order; ``enter_layers[k]`` is the layer requests enter stage ``k`` at (None = its
    slice start), for stages whose slice overlaps the previous one."""

    def __init__(self, engines: Sequence[Engine], enter_layers: Sequence[int | None] | None = None):
        self.engines = list(engines)
        self.enter_layers = list(enter_layers or [None] * len(self.engines))
        self._queues: list[list[StageInput]] = [[] for _ in self.engines]
        self.tokens: dict[Hashable, list[int]] = {}
        self.logprobs: dict[Hashable, list] = {}
        self.finish_reasons: dict[Hashable, str] = {}
        self.prompt_logprobs: dict[Hashable, tuple] = {}
        """What the last stage sent with a request's first token (``SamplingParams.prompt_logprobs``)."""

    def submit(self, prompt: Prompt) -> None:
        new = NewRequest(prompt.request_id, len(prompt.token_ids), prompt.sampling,
                         prompt_token_ids=prompt.token_ids, enter_layer=self.enter_layers[0],
                         adapter=prompt.adapter)
        self._queues[0].append(StageInput(prompt.request_id, 0, token_ids=prompt.token_ids,
                                          new_request=new))
        self.tokens[prompt.request_id] = []
        self.logprobs[prompt.request_id] = []

    def busy(self) -> bool:
        return any(self._queues) or any(e.has_work() for e in self.engines)

    def step(self) -> list[StageOutput]:
        """One iteration of every stage, in order; returns the last stage's outputs."""
        outs: list[StageOutput] = []
        for k, engine in enumerate(self.engines):
            inputs, self._queues[k] = self._queues[k], []
            outs = engine.step(inputs)
            if k + 1 < len(self.engines):
                self._queues[k + 1].extend(self._forward(o, k + 1) for o in outs)
        self._collect(outs)
        return outs

    def run(self, prompts: Sequence[Prompt], max_steps: int = 100_000) -> dict[Hashable, list[int]]:
        """Submit everything, step until all finished; generated token ids per request."""
        for p in prompts:
            self.submit(p)
        for _ in range(max_steps):
            if not self.busy():
                return self.tokens
            self.step()
        raise RuntimeError(f"pipeline did not finish in {max_steps} steps")

    def _forward(self, out: StageOutput, k: int) -> StageInput:
        new = out.new_request
        if new is not None:
            new = replace(new, enter_layer=self.enter_layers[k])
        return StageInput(out.request_id, out.start_position, hidden_states=out.hidden_states,
                          new_request=new)

    def _collect(self, outs: Sequence[StageOutput]) -> None:
        for o in outs:
            self.tokens[o.request_id].append(o.token.token_id)
            self.logprobs[o.request_id].append(o.token)
            if o.prompt_logprobs:
                self.prompt_logprobs[o.request_id] = o.prompt_logprobs
            if o.finish_reason is not None:
                self.finish_reasons[o.request_id] = o.finish_reason
                for e in self.engines[:-1]:
                    e.release([o.request_id])
            elif len(self.engines) > 1:
                self._queues[0].append(StageInput(o.request_id, o.start_position,
                                                  token_ids=(o.token.token_id,)))
