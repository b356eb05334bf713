"""``helix demo``: plan, launch and serve a tiny model on this machine, end to end, and check it.

1. write (first use) a tiny random-weight LLaMA checkpoint and in-code tokenizer to a cache folder;
2. plan ``cluster_specs/local3.yaml`` with the planner (three CPU "nodes" with uneven memory);
3. start the three workers on a local Ray, the coordinator and the OpenAI HTTP API;
4. send a burst of concurrent streaming requests through the ``openai`` client (completions and chat);
5. print requests, tokens/s, TTFT p50/p99 and the pipelines used, and check every output against a
   single-process reference (the whole model in one :class:`~worker.engine.SliceEngine`).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from helix.core.errors import HelixUserError
from helix.core.plan import Plan

LOCAL3 = Path(__file__).resolve().parents[2] / "cluster_specs" / "local3.yaml"
_PROMPTS = ["Helix serves one large language model", "Each worker holds a contiguous slice",
            "every request gets its own pipeline", "Chunked prefill cuts long prompts",
            "Iteration-level scheduling lets finished requests leave", "mixed GPUs in several regions"]


@dataclass(frozen=True)
class RequestResult:
    prompt_token_ids: tuple[int, ...]
    text: str
    completion_tokens: int
    ttft_s: float
    latency_s: float


@dataclass(frozen=True)
class DemoReport:
    plan: Plan
    results: tuple[RequestResult, ...]
    wall_s: float
    pipelines: dict[tuple[str, ...], int]
    mismatches: tuple[int, ...]

    @property
    def tokens_per_s(self) -> float:
        return sum(r.completion_tokens for r in self.results) / self.wall_s


def plan_local3(spec_path: Path = LOCAL3, time_limit_s: float = 20.0) -> Plan:
    """The demo's plan of local3, the one `helix plan` gives (the planner's one verb)."""
    from helix.core.spec import load_cluster
    from planner import PlanOptions, plan
    return plan(load_cluster(spec_path), PlanOptions(time_limit_s=time_limit_s))


def _messages(i: int) -> list[dict]:
    return [{"role": "user", "content": _PROMPTS[i % len(_PROMPTS)]}]


async def _one(client, i: int, max_tokens: int) -> tuple[str, int, float, float]:
    t0 = time.perf_counter()
    ttft, text, n = None, "", 0
    kw = dict(model="tiny-llama", max_tokens=max_tokens, temperature=0, stream=True,
              stream_options={"include_usage": True})
    if i % 2:
        stream = await client.chat.completions.create(messages=_messages(i), **kw)
    else:
        stream = await client.completions.create(prompt=_PROMPTS[i % len(_PROMPTS)], **kw)
    async for ch in stream:
        if ch.choices:
            piece = (ch.choices[0].delta.content or "") if i % 2 else ch.choices[0].text
            if piece and ttft is None:
                ttft = time.perf_counter() - t0
            text += piece
        elif ch.usage is not None:
            n = ch.usage.completion_tokens
    total = time.perf_counter() - t0
    return text, n, ttft if ttft is not None else total, total


async def _burst(url: str, num_requests: int, max_tokens: int):
    import openai
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="demo", max_retries=0,
                                  timeout=120) as client:
        return await asyncio.gather(*(_one(client, i, max_tokens) for i in range(num_requests)))


def reference_outputs(ckpt: Path, prompts: list[tuple[int, ...]], max_tokens: int,
                      eos: tuple[int, ...]) -> list[list[int]]:
    """Greedy tokens of the whole model in one engine, one process (the single-process reference)."""
    from helix.core.models import ModelSpec
    from worker.engine import SliceEngine
    from worker.engine_config import EngineConfig
    from worker.local_pipeline import LocalPipeline, Prompt
    from helix.net.sampling import SamplingParams
    layers = ModelSpec.from_pretrained_dir(ckpt).num_layers
    engine = SliceEngine.from_checkpoint(ckpt, 0, layers, EngineConfig(eos_token_ids=eos))
    pipe = LocalPipeline([engine])
    got = pipe.run([Prompt(i, p, SamplingParams(temperature=0, max_tokens=max_tokens))
                    for i, p in enumerate(prompts)])
    return [got[i] for i in range(len(prompts))]


def run_demo(cache_dir: str | Path | None = None, num_requests: int = 16, max_tokens: int = 12,
             spec_path: Path = LOCAL3, log=print) -> DemoReport:
    from coordinator.textcodec import TextCodec
    from helix.commands.demo_checkpoint import ensure_tiny_checkpoint
    from helix.server.http import HttpThread
    from helix.server.stack import ServeOptions, ServeStack
    if num_requests < 1 or max_tokens < 1:
        raise HelixUserError("--requests and --max-tokens must be >= 1")
    ckpt = ensure_tiny_checkpoint(cache_dir)
    log(f"checkpoint: {ckpt}")
    plan = plan_local3(spec_path)
    log(describe_plan(plan))
    if not os.environ.get("RAY_ADDRESS"):
        # The demo's own throwaway local Ray, on loopback: without Ray's token authentication
        # (which would write ~/.ray/auth_token). `helix serve` leaves Ray's default (token) alone.
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    stack = ServeStack(plan, str(ckpt), ServeOptions(model_name="tiny-llama"), progress=log).start()
    try:
        http = HttpThread(stack.app)
        try:
            log(f"serving at {http.url}/v1 (gRPC {stack.grpc_address}); sending {num_requests} requests")
            t0 = time.perf_counter()
            raw = asyncio.run(_burst(http.url, num_requests, max_tokens))
            wall = time.perf_counter() - t0
        finally:
            http.stop()
        pipelines = dict(stack.coordinator.pipeline_counts)
    finally:
        stack.close()
    codec = TextCodec(ckpt)
    prompt_ids = [tuple(codec.encode_chat(_messages(i)) if i % 2 else codec.encode(_PROMPTS[i % len(_PROMPTS)]))
                  for i in range(num_requests)]
    results = tuple(RequestResult(p, text, n, ttft, lat) for p, (text, n, ttft, lat) in zip(prompt_ids, raw))
    ref = reference_outputs(ckpt, prompt_ids, max_tokens, codec.eos_token_ids)
    bad = tuple(i for i, (r, want) in enumerate(zip(results, ref))
                if r.text != codec.decode(want) or r.completion_tokens != len(want))
    return DemoReport(plan, results, wall, pipelines, bad)


def describe_plan(plan: Plan) -> str:
    spans = sorted((p.start, p.end, p.node) for p in plan.placements)
    overlaps = [f"{a[2]}/{b[2]} on [{b[0]}, {min(a[1], b[1])})" for i, a in enumerate(spans)
                for b in spans[i + 1:] if b[0] < a[1]]
    slices = ", ".join(f"{n} [{s}, {e})" for s, e, n in spans)
    return (f"plan ({plan.method}, max flow {plan.max_flow_tokens_per_s:,.0f} tokens/s): {slices}; "
            f"overlap: {'; '.join(overlaps) if overlaps else 'none'}")


def _percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))]


def format_report(r: DemoReport) -> str:
    ttft = [x.ttft_s for x in r.results]
    rows = [("requests", f"{len(r.results)}"),
            ("output tokens", f"{sum(x.completion_tokens for x in r.results)}"),
            ("tokens/s", f"{r.tokens_per_s:.1f}"),
            ("TTFT p50", f"{_percentile(ttft, 50) * 1000:.0f} ms"),
            ("TTFT p99", f"{_percentile(ttft, 99) * 1000:.0f} ms"),
            ("mean latency", f"{statistics.mean(x.latency_s for x in r.results) * 1000:.0f} ms")]
    rows += [(f"pipeline {' -> '.join(p)}", f"{n} requests") for p, n in sorted(r.pipelines.items())]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    if r.mismatches:
        lines.append(f"MISMATCH: requests {list(r.mismatches)} differ from the single-process reference")
    else:
        lines.append(f"all {len(r.results)} outputs match the single-process reference")
    return "\n".join(lines)
