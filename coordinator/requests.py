"""The live coordinator's request pool: what each request is, and the events its caller receives.

Events reach the caller through a :class:`RequestHandle`, from the coordinator's receiver thread:
into an ``asyncio.Queue`` (HTTP server) via ``loop.call_soon_threadsafe``, or into a thread-safe queue
(gRPC server threads, scripts). Consumers wait with a timeout; a request that produces nothing for
``timeout_s`` is cancelled, so no caller waits forever on a lost worker.
"""

from __future__ import annotations

import asyncio
import queue
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field

from coordinator.pipeline import Pipeline
from coordinator.textcodec import Detokenizer
from worker.sampling import SampledToken, SamplingParams


@dataclass(frozen=True)
class Delta:
    """New output: token ids, their text (may be empty while text is held back) and logprobs."""

    token_ids: tuple[int, ...]
    text: str
    tokens: tuple[SampledToken, ...] = ()


@dataclass(frozen=True)
class Done:
    """The request ended: ``stop`` / ``length`` / ``abort``; usage counts; ``error`` when it failed."""

    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    error: str | None = None


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
    first_token_s: float | None = None
    last_token_s: float | None = None
    num_output_tokens: int = 0
    done: bool = False
