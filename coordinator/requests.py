"""The live coordinator's request pool: what each request is, and the events its caller receives.

Events reach the caller through a :class:`RequestHandle`, from the coordinator's receiver thread:
into an ``asyncio.Queue`` (HTTP server) via ``loop.call_soon_threadsafe``, or into a thread-safe queue
(gRPC server threads, scripts). Consumers wait with a timeout; a request that produces nothing for
``timeout_s`` is cancelled, so no caller waits forever on a lost worker.

:class:`RequestLimits` is the one check of a request against the served model and pipelines, shared by
the HTTP and the gRPC API (both go through ``Coordinator.submit``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import queue
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from coordinator.pipeline import Pipeline, Topology
from coordinator.textcodec import Detokenizer
from helix.core.errors import HelixUserError
from helix.net.sampling import MAX_LOGPROBS, SampledToken, SamplingParams


@dataclass(frozen=True)
class Delta:
    """New output: token ids, their text (may be empty while text is held back) and logprobs."""

    token_ids: tuple[int, ...]
    text: str
    tokens: tuple[SampledToken, ...] = ()
    prompt_logprobs: tuple[SampledToken, ...] = ()
    """On the first delta of a request that asked for ``prompt_logprobs``: prompt tokens 1.. scored."""


@dataclass(frozen=True)
class Done:
    """The request ended: ``stop`` / ``length`` / ``abort`` / ``error``; usage counts; ``error`` (the
    message) when it failed."""

    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    error: str | None = None
    retry_after_s: int | None = None
    """Set when the request failed because no pipeline can serve now (HTTP 503 with Retry-After)."""
    user_error: bool = False
    """The request failed by its own fault (a worker refused it as bad input): HTTP 400."""
    stop_reason: str | int | None = None
    """What stopped a ``stop`` finish, as vLLM reports it: the stop string that appeared, or the
    ``stop_token_ids`` id that was sampled; None for EOS, a finished structured reply, a length
    limit, an abort or an error."""


Event = Delta | Done


class RequestTimeout(RuntimeError):
    pass


class RequestHandle:
    """The caller's side of one request: iterate its events, or cancel it."""

    def __init__(self, request_id: int, cancel: Callable[[int], None],
                 loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.request_id = request_id
        self._cancel = cancel
        self._loop = loop
        self._aq: asyncio.Queue | None = asyncio.Queue() if loop is not None else None
        self._q: queue.SimpleQueue | None = queue.SimpleQueue() if loop is None else None

    def push(self, event: Event) -> None:
        """Called by the coordinator (any thread)."""
        if self._aq is not None:
            try:
                self._loop.call_soon_threadsafe(self._aq.put_nowait, event)
            except RuntimeError:   # the caller's event loop is gone: nobody listens any more
                pass
        else:
            self._q.put(event)

    def cancel(self) -> None:
        self._cancel(self.request_id)

    def events(self, timeout_s: float = 60.0) -> Iterator[Event]:
        """Events until :class:`Done`; cancels and raises :class:`RequestTimeout` after a silence."""
        while True:
            try:
                ev = self._q.get(timeout=timeout_s)
            except queue.Empty:
                self.cancel()
                raise RequestTimeout(f"request {self.request_id}: no output for {timeout_s} s") from None
            yield ev
            if isinstance(ev, Done):
                return

    async def aevents(self, timeout_s: float = 60.0) -> AsyncIterator[Event]:
        while True:
            try:
                ev = await asyncio.wait_for(self._aq.get(), timeout_s)
            except asyncio.TimeoutError:
                self.cancel()
                raise RequestTimeout(f"request {self.request_id}: no output for {timeout_s} s") from None
            yield ev
            if isinstance(ev, Done):
                return


@dataclass
class LiveRequest:
    """Coordinator-side state of one request (touched under the coordinator's lock)."""

    request_id: int
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    detok: Detokenizer
    handle: RequestHandle
    arrival_s: float = field(default_factory=time.perf_counter)
    pipeline: Pipeline | None = None
    dispatched_s: float | None = None
    """When it first got a pipeline (``arrival_s`` to here is its queue time)."""
    first_token_s: float | None = None
    last_token_s: float | None = None
    num_output_tokens: int = 0
    done: bool = False
    output_token_ids: list[int] = field(default_factory=list)
    """Every token streamed so far: a request moved off a dead node resumes from them."""
    moves: int = 0
    """Times the request was moved to another pipeline (its pipeline lost a node)."""
    adapter: str | None = None
    """Its fine-tuned task (None = the base model)."""

    def dispatch_token_ids(self) -> tuple[int, ...]:
        """What the first stage prefills: the prompt, then the output so far (after a move)."""
        return self.prompt_token_ids + tuple(self.output_token_ids)

    def dispatch_params(self) -> SamplingParams:
        """The sampling settings for what is left to generate (after a move: fewer tokens)."""
        done = len(self.output_token_ids)
        if not done:
            return self.params
        # A guided request's automaton is rebuilt on the new last stage from the tokens it made.
        resume = self.params.guided_resume_tokens + done if self.params.guided_regex else 0
        return dataclasses.replace(self.params, max_tokens=self.params.max_tokens - done,
                                   min_tokens=max(0, self.params.min_tokens - done),
                                   guided_resume_tokens=resume,
                                   prompt_logprobs=None)   # they came with the first token


@dataclass(frozen=True)
class RequestLimits:
    """What one request may ask of the served model and its pipelines.

    Checked once, before a request is queued, for the HTTP and the gRPC API alike: a request that
    passes can be encoded, sent and run on any stage (its ids index the embedding and the logits, its
    numbers fit MessagePack; :class:`SamplingParams` already checked types and int64 ranges), and
    some pipeline can hold its KV, so it never waits for room that cannot come."""

    vocab_size: int
    max_context_tokens: int
    max_kv_tokens: int
    """Most prompt + ``max_tokens`` tokens the roomiest pipeline admits when empty."""
    max_logprobs: int = MAX_LOGPROBS
    default_max_tokens: int | None = None
    """The checkpoint's ``generation_config.json`` ``max_new_tokens``: what a request without
    ``max_tokens`` generates at most (within the context); None: to the end of the context."""

    def resolve(self, num_prompt_tokens: int, params: SamplingParams) -> SamplingParams:
        """``params`` with ``max_tokens`` set: a request without one generates to the end of the
        context, as vLLM's ``get_max_tokens`` (or to the checkpoint's ``max_new_tokens`` when
        smaller). Here the end is also where the roomiest pipeline's KV ends (``max_kv_tokens``),
        so such a request is never refused for asking too much."""
        if params.max_tokens is not None:
            return params
        room = min(self.max_context_tokens, self.max_kv_tokens) - num_prompt_tokens
        if room < 1 and num_prompt_tokens:
            raise HelixUserError(f"the prompt ({num_prompt_tokens} tokens) leaves no room to generate "
                                 f"within the model's context of {self.max_context_tokens} tokens"
                                 f"{self._kv_note()}")
        limit = max(1, room if self.default_max_tokens is None else min(room, self.default_max_tokens))
        return dataclasses.replace(params, max_tokens=limit)

    def _kv_note(self) -> str:
        if self.max_kv_tokens >= self.max_context_tokens:
            return ""
        return f" (the KV cache of the roomiest pipeline holds {self.max_kv_tokens})"

    def check(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> tuple[int, ...]:
        """The prompt as a tuple; :class:`HelixUserError` naming the first problem."""
        ids = tuple(prompt_token_ids)
        vocab = self.vocab_size
        if not ids:
            raise HelixUserError("the prompt is empty")
        bad = [t for t in ids if not (type(t) is int and 0 <= t < vocab)]
        if bad:
            raise HelixUserError(f"prompt token ids must be integers in [0, {vocab}) (the "
                                 f"vocabulary), got {bad[:5]!r}")
        bad = [t for t in params.stop_token_ids if t >= vocab]
        if bad:
            raise HelixUserError(f"stop_token_ids {bad[:5]} outside the vocabulary [0, {vocab})")
        bad = [t for t, _ in params.logit_bias if t >= vocab]
        if bad:
            raise HelixUserError(f"logit_bias token ids {bad[:5]} outside the vocabulary [0, {vocab})")
        if params.prompt_logprobs is not None and params.prompt_logprobs > self.max_logprobs:
            raise HelixUserError(f"prompt_logprobs must be in [0, {self.max_logprobs}], "
                                 f"got {params.prompt_logprobs}")
        if params.logprobs is not None and params.logprobs > self.max_logprobs:
            raise HelixUserError(f"logprobs must be in [0, {self.max_logprobs}], got {params.logprobs}")
        total = len(ids) + params.max_tokens
        if total > self.max_context_tokens:
            raise HelixUserError(f"prompt ({len(ids)} tokens) plus max_tokens ({params.max_tokens}) "
                                 f"exceeds the model's context of {self.max_context_tokens} tokens")
        if total > self.max_kv_tokens:
            raise HelixUserError(f"prompt ({len(ids)} tokens) plus max_tokens ({params.max_tokens}) "
                                 f"needs KV cache for {total} tokens, but no pipeline of this "
                                 f"deployment holds more than {self.max_kv_tokens}")
        return ids


def max_kv_tokens(topology: Topology, limits: Mapping[str, tuple[float, int]]) -> int:
    """Most prompt + ``max_tokens`` tokens one request may have so that some pipeline of
    ``topology`` over the nodes in ``limits`` admits it when empty (0: none).

    ``limits[node]`` is (KV limit in token-layers, layers the node holds). The scheduler reserves
    ``tokens * layers`` on every stage and admits only while that stays within the limit (the KV
    high-water mark, :meth:`KVEstimator.fits`), so a larger request would wait forever. The bound is
    the widest path's narrowest stage."""
    room: dict[str, int] = {}
    for node, (limit, layers) in limits.items():
        tokens = int(limit // layers)
        while (tokens + 1) * layers <= limit:   # float division may land one off
            tokens += 1
        while tokens > 0 and tokens * layers > limit:
            tokens -= 1
        room[node] = tokens
    for tokens in sorted(set(room.values()), reverse=True):
        if topology.has_path(topology.mask_of(n for n in topology.nodes if room.get(n, -1) >= tokens)):
            return tokens
    return 0


def generation_max_new_tokens(model_path: str | Path) -> int | None:
    """``max_new_tokens`` of the checkpoint's ``generation_config.json`` (vLLM's default
    ``max_tokens`` when a request sets none), or None when it has none (or no such file)."""
    path = Path(model_path) / "generation_config.json"
    try:
        value = json.loads(path.read_text()).get("max_new_tokens")
    except (OSError, ValueError, AttributeError):
        return None
    return value if type(value) is int and value >= 1 else None
