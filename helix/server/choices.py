"""The choices of one OpenAI reply: ``n`` sequences per prompt, each its own coordinator request.

A completion with several prompts and ``n`` asks for ``len(prompts) * n`` sequences; choice
``i * n + j`` is sequence ``j`` of prompt ``i`` (vLLM's order). Each sequence is a separate request
(its prompt prefilled once per sequence: copying the prompt's KV, not sharing its pages). With a
``seed``, sequence ``j`` draws with ``seed + j`` (vLLM's child seeds), so the reply is reproducible
and its sequences differ. ``echo`` puts the prompt before a completion's text and, with
``logprobs``, the prompt's logprobs before the output's (the first prompt token's is null, as
OpenAI and vLLM return it); ``echo`` with ``max_tokens: 0`` returns the prompt alone (one token is
generated and dropped, as vLLM does). Usage counts each prompt once and every sequence's output.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from coordinator.requests import Delta, Done, RequestHandle
from helix.net.sampling import INT64_MIN, SampledToken, SamplingParams
from helix.server.logprobs import LogprobsBuilder, joined


def child_seed(seed: int | None, index: int) -> int | None:
    """Sequence ``index``'s seed: ``seed + index``, wrapped into int64 (None stays None)."""
    if seed is None or index == 0:
        return seed
    return (seed + index - INT64_MIN) % 2**64 + INT64_MIN


def child_params(params: SamplingParams, index: int) -> SamplingParams:
    seed = child_seed(params.seed, index)
    return params if seed == params.seed else dataclasses.replace(params, seed=seed)


@dataclass
class Choice:
    """One sequence of a reply and what is built from its events."""

    index: int
    handle: RequestHandle
    prompt_index: int
    """Which prompt of the request (``index // n``)."""
    prompt_ids: Sequence[int]
    logprobs: LogprobsBuilder | None = None
    echo_text: str | None = None
    """``echo``: the prompt's text, put before the output (None: no echo)."""
    echo_only: bool = False
    """``echo`` with ``max_tokens: 0``: the generated token is dropped."""
    text: list[str] = field(default_factory=list)
    tokens: list[SampledToken] = field(default_factory=list)
    prompt_logprobs: tuple[SampledToken, ...] = ()
    done: Done | None = None
    started: bool = False
    """Whether an event arrived (the echoed prompt goes out with the first)."""

    @property
    def completion_tokens(self) -> int:
        return 0 if self.echo_only or self.done is None else self.done.completion_tokens

    def take(self, ev: Delta) -> tuple[str, list[SampledToken], bool]:
        """Record a delta; returns (text, tokens, first): what is new to the client (the output's
        text and tokens, none for ``echo_only``) and whether it is the first event."""
        first, self.started = not self.started, True
        if ev.prompt_logprobs:
            self.prompt_logprobs = ev.prompt_logprobs
        if self.echo_only:
            return "", [], first
        self.text.append(ev.text)
        self.tokens.extend(ev.tokens)
        return ev.text, list(ev.tokens), first

    def echo_logprobs(self) -> dict | None:
        """Completions-format logprobs of the echoed prompt (None: no echo or no logprobs)."""
        if self.echo_text is None or self.logprobs is None:
            return None
        return self.logprobs.prompt(self.prompt_ids, self.prompt_logprobs)

    def completion(self) -> dict:
        """The finished choice of ``/v1/completions``."""
        lp = self.echo_logprobs()
        if self.logprobs is not None:
            lp = joined(lp, self.logprobs.completion(self.tokens))
        return {"index": self.index, "text": (self.echo_text or "") + "".join(self.text),
                "logprobs": lp, "finish_reason": self.done.finish_reason,
                "stop_reason": self.done.stop_reason}

    def chat(self) -> dict:
        """The finished choice of ``/v1/chat/completions``."""
        return {"index": self.index, "message": {"role": "assistant", "content": "".join(self.text)},
                "logprobs": self.logprobs and self.logprobs.chat(self.tokens),
                "finish_reason": self.done.finish_reason, "stop_reason": self.done.stop_reason}


def usage(choices: Sequence[Choice]) -> dict:
    """Each prompt once (its ``n`` sequences share it), every sequence's output."""
    prompts = {c.prompt_index: len(c.prompt_ids) for c in choices}
    prompt, completion = sum(prompts.values()), sum(c.completion_tokens for c in choices)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


async def merged(choices: Sequence[Choice], timeout_s: float) -> AsyncIterator[tuple[Choice, object]]:
    """Every choice's events as they come, as (choice, event); the first error (a timeout, a
    failed generation) is raised after the events before it. Each choice ends with its Done."""
    queue: asyncio.Queue = asyncio.Queue()
    end = object()

    async def pump(c: Choice) -> None:
        try:
            async for ev in c.handle.aevents(timeout_s):
                queue.put_nowait((c, ev))
        except Exception as exc:
            queue.put_nowait((c, exc))
        finally:
            queue.put_nowait((c, end))

    tasks = [asyncio.create_task(pump(c)) for c in choices]
    try:
        left = len(tasks)
        while left:
            c, ev = await queue.get()
            if ev is end:
                left -= 1
            elif isinstance(ev, Exception):
                raise ev
            else:
                yield c, ev
    finally:
        for t in tasks:
            t.cancel()
