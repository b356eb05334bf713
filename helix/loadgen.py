"""Load generator for a running OpenAI-compatible endpoint: ``helix bench``, as ``vllm bench serve``
is for vLLM.

Requests come from a workload of :mod:`helix.sim.workload` (the Azure trace's lengths at its own
rescaled times, Poisson or evenly spaced arrivals, or fixed synthetic lengths): the requests the
simulator replays, so the simulator's figures and the live system's compare side by side. Each
request is one streamed ``POST /v1/completions`` whose prompt is ``prompt_tokens`` token ids (the
exact length, no tokenizer needed on this side) and whose output is exactly ``output_tokens`` tokens
(``max_tokens`` with ``ignore_eos``).

Measured on the client, from the moment a request is sent: time to first token (TTFT), the gap
between consecutive chunks that carry tokens (ITL; as in vLLM's benchmark it is per chunk, and a
chunk carries several tokens when the server holds text back, e.g. an incomplete UTF-8 character),
time per output token after the first (TPOT: (last token - first token) / (tokens - 1)) and
end-to-end latency. Token counts are the server's: ``stream_options.continuous_usage_stats`` (vLLM's
option, which Helix implements) puts the running completion count in every chunk; a server that sends
no usage is counted one token per chunk.

Bounded in requests (the workload's length) and in time (``duration_s``): at the deadline, requests
not yet sent are dropped and those in flight are cancelled (closing the stream frees their KV on a
Helix server) and counted as unfinished. Throughput is what arrived in the measured span divided by
it, as the simulator counts a run. Failures (an HTTP error status, an error event in the stream, a
broken connection) are counted by kind with the first message of each.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from helix.core.errors import HelixUserError
from helix.sim.metrics import LatencyStats
from helix.sim.workload import TraceRequest


@dataclass(frozen=True)
class BenchConfig:
    """Where to send the load and how."""

    base_url: str
    """The server's root, e.g. ``http://127.0.0.1:8000`` (``/v1/...`` is appended)."""
    model: str | None = None
    """Model name in the requests; None: the first one ``/v1/models`` lists."""
    duration_s: float | None = None
    """Stop after this many seconds (in-flight requests cancelled); None: when all are done."""
    max_concurrency: int | None = None
    """Requests in flight at most (later ones wait for a slot); None: unbounded."""
    vocab_size: int = 256
    """Prompt token ids are drawn uniformly from ``[0, vocab_size)``."""
    seed: int = 0
    request_timeout_s: float = 600.0
    """A request that sends nothing for this long fails (``timeout``)."""
    connect_timeout_s: float = 10.0


@dataclass
class _Record:
    """One request as it streams; kept when the request is cancelled at the deadline."""

    sent_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    itl_s: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    done: bool = False
    error: tuple[str, str] | None = None
    """(kind, message) when the request failed."""


@dataclass(frozen=True)
class BenchResult:
    """Summary of one run; latency fields share the simulator's names and :class:`LatencyStats`."""

    base_url: str
    model: str
    duration_s: float
    """Measured span: start to the last response (or to the deadline)."""
    requests_planned: int
    requests_arrived: int
    """Requests sent."""
    requests_completed: int
    requests_failed: int
    requests_unfinished: int
    """Sent but still streaming at the deadline (cancelled)."""
    tokens_generated: int
    prompt_tokens: int
    """Prompt tokens of the requests that got a first token (their prefill ran)."""
    request_throughput_per_s: float
    decode_throughput_tokens_per_s: float
    prompt_throughput_tokens_per_s: float
    ttft: LatencyStats
    inter_token_latency: LatencyStats
    request_decode_latency: LatencyStats
    """TPOT: per completed request, seconds per output token after the first."""
    e2e_latency: LatencyStats
    errors: dict[str, int]
    """Failed requests by kind (``HTTP 404``, ``stream error``, ``ConnectError`` ...)."""
    error_examples: dict[str, str]
    """The first message of each kind."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_endpoint(base_url: str, model: str | None, timeout_s: float = 10.0) -> str:
    """The model to request: ``model`` if the server lists it, else the first it lists. One-line
    :class:`HelixUserError` when the server cannot be reached or does not answer ``/v1/models``."""
    url = base_url.rstrip("/") + "/v1/models"
    try:
        resp = httpx.get(url, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise HelixUserError(f"cannot reach {base_url}: {type(exc).__name__}: {exc}") from None
    if resp.status_code != 200:
        raise HelixUserError(f"{url} answered HTTP {resp.status_code}: {_error_message(resp.text)}")
    try:
        names = [m["id"] for m in resp.json()["data"]]
    except (ValueError, KeyError, TypeError):
        raise HelixUserError(f"{url} did not answer an OpenAI model list: {resp.text[:200]!r}") from None
    if model is not None:
        return model   # an unknown name is the server's to refuse, request by request
    if not names:
        raise HelixUserError(f"{url} lists no model; pass --model")
    return names[0]


def run_bench(config: BenchConfig, workload: tuple[TraceRequest, ...],
              on_progress: Callable[[int], None] | None = None) -> BenchResult:
    """Check the endpoint, send ``workload`` at its arrival times (those at or after the deadline are
    left out) and summarize. Raises :class:`HelixUserError` when the endpoint cannot be reached."""
    model = check_endpoint(config.base_url, config.model, config.connect_timeout_s)
    if config.duration_s is not None:
        workload = tuple(r for r in workload if r.arrival_s < config.duration_s)
    records, span_s = asyncio.run(_send_all(config, model, workload, on_progress))
    return summarize(config.base_url, model, len(workload), records, span_s)


def _prompts(workload: tuple[TraceRequest, ...], vocab_size: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab_size) for _ in range(r.prompt_tokens)] for r in workload]


async def _send_all(config: BenchConfig, model: str, workload: tuple[TraceRequest, ...],
                    on_progress: Callable[[int], None] | None) -> tuple[list[_Record], float]:
    url = config.base_url.rstrip("/") + "/v1/completions"
    prompts = _prompts(workload, config.vocab_size, config.seed)
    records = [_Record() for _ in workload]
    slots = asyncio.Semaphore(config.max_concurrency) if config.max_concurrency else None
    timeout = httpx.Timeout(config.request_timeout_s, connect=config.connect_timeout_s)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    finished = 0

    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        t0 = time.perf_counter()

        def now_s() -> float:
            return time.perf_counter() - t0

        async def one(i: int) -> None:
            nonlocal finished
            body = {"model": model, "prompt": prompts[i], "max_tokens": workload[i].output_tokens,
                    "ignore_eos": True, "temperature": 0.0, "stream": True,
                    "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
            if slots is not None:
                async with slots:
                    await _request(client, url, body, records[i], now_s)
            else:
                await _request(client, url, body, records[i], now_s)
            finished += 1
            if on_progress is not None:
                on_progress(finished)

        tasks: list[asyncio.Task] = []

        async def dispatch() -> None:
            for i, r in enumerate(workload):
                delay_s = r.arrival_s - now_s()
                if delay_s > 0:
                    await asyncio.sleep(delay_s)
                tasks.append(asyncio.create_task(one(i)))
            if tasks:
                await asyncio.wait(tasks)

        runner = asyncio.create_task(dispatch())
        await asyncio.wait([runner], timeout=config.duration_s)
        span_s = now_s()   # the last response, or the deadline
        # At the deadline: nothing more is sent; requests in flight are cancelled (the closed stream
        # frees their KV on the server) and count as unfinished.
        for t in (runner, *tasks):
            t.cancel()
        await asyncio.gather(runner, *tasks, return_exceptions=True)
    return records, span_s


async def _request(client: httpx.AsyncClient, url: str, body: dict, rec: _Record,
                   now_s: Callable[[], float]) -> None:
    rec.sent_s = now_s()
    try:
        async with client.stream("POST", url, json=body) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")
                rec.error = (f"HTTP {resp.status_code}", _error_message(text))
                return
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    rec.error = ("stream error", _error_message(data))
                    return
                _on_chunk(rec, chunk, now_s())
    except httpx.HTTPError as exc:
        rec.error = (type(exc).__name__, str(exc) or type(exc).__name__)
        return
    except json.JSONDecodeError as exc:
        rec.error = ("bad stream", f"a chunk is not JSON: {exc}")
        return
    if rec.finish_reason is None:
        rec.error = ("bad stream", "the stream ended without a finish reason")
    else:
        rec.done = True


def _on_chunk(rec: _Record, chunk: dict, t_s: float) -> None:
    """Count the tokens a chunk brings (the server's running count, else one per text chunk)."""
    usage = chunk.get("usage") or {}
    choices = chunk.get("choices") or []
    choice = choices[0] if choices else {}
    if "completion_tokens" in usage:
        count = int(usage["completion_tokens"])
        rec.prompt_tokens = int(usage.get("prompt_tokens", rec.prompt_tokens))
    else:
        count = rec.output_tokens + (1 if choice.get("text") else 0)
    if count > rec.output_tokens:
        if rec.first_token_s is None:
            rec.first_token_s = t_s
        else:
            rec.itl_s.append(t_s - rec.last_token_s)
        rec.last_token_s = t_s
        rec.output_tokens = count
    if choice.get("finish_reason"):
        rec.finish_reason = choice["finish_reason"]


def _error_message(text: str) -> str:
    """The ``error.message`` of an OpenAI-style error body, else the text itself (shortened)."""
    try:
        return str(json.loads(text)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return text.strip()[:300] or "(empty body)"


def summarize(base_url: str, model: str, planned: int, records: list[_Record],
              span_s: float) -> BenchResult:
    """Counts, throughputs and latency statistics of a finished run."""
    sent = [r for r in records if r.sent_s is not None]
    ok = [r for r in sent if r.done]
    failed = [r for r in sent if r.error is not None]
    started = [r for r in sent if r.first_token_s is not None]
    ttft = array("d", (r.first_token_s - r.sent_s for r in started))
    itl = array("d", (x for r in sent for x in r.itl_s))
    tpot = array("d", ((r.last_token_s - r.first_token_s) / (r.output_tokens - 1)
                       for r in ok if r.output_tokens > 1))
    e2e = array("d", (r.last_token_s - r.sent_s for r in ok if r.last_token_s is not None))
    tokens = sum(r.output_tokens for r in sent)
    prompt = sum(r.prompt_tokens for r in started)
    kinds = Counter(r.error[0] for r in failed)
    examples: dict[str, str] = {}
    for r in failed:
        examples.setdefault(r.error[0], r.error[1])
    per_s = 1.0 / span_s if span_s > 0 else 0.0
    return BenchResult(
        base_url=base_url, model=model, duration_s=span_s, requests_planned=planned,
        requests_arrived=len(sent), requests_completed=len(ok), requests_failed=len(failed),
        requests_unfinished=len(sent) - len(ok) - len(failed), tokens_generated=tokens,
        prompt_tokens=prompt, request_throughput_per_s=len(ok) * per_s,
        decode_throughput_tokens_per_s=tokens * per_s, prompt_throughput_tokens_per_s=prompt * per_s,
        ttft=LatencyStats.of(ttft), inter_token_latency=LatencyStats.of(itl),
        request_decode_latency=LatencyStats.of(tpot), e2e_latency=LatencyStats.of(e2e),
        errors=dict(kinds), error_examples=examples)
