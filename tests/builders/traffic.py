"""Traffic for failure and drain tests: greedy requests submitted straight to a Coordinator (or
streamed over HTTP), each collected by a thread, and checks that every one ended with the reference
output."""

from __future__ import annotations

import json
import threading
import time

from helix.net.sampling import SamplingParams

MAX_TOKENS = 24
VIA_2 = ("cpu-0", "cpu-2")
"""The branching plan's pipeline through cpu-2 (the node failure tests take away)."""


def submit_all(coord, prompts, n: int, params: SamplingParams | None = None) -> list:
    """Submit ``n`` requests (prompts round robin; greedy, :data:`MAX_TOKENS`, unless ``params``);
    a thread per request collects its events: ``[results, threads]``, each result (tokens, Done)."""
    results: list = [None] * n

    def collect(k, handle):
        tokens, done = [], None
        for ev in handle.events(timeout_s=90):
            if hasattr(ev, "token_ids"):
                tokens.extend(ev.token_ids)
            else:
                done = ev
        results[k] = (tokens, done)
    threads = []
    for k in range(n):
        handle = coord.submit(list(prompts[k % len(prompts)]),
                              params or SamplingParams(temperature=0, max_tokens=MAX_TOKENS))
        t = threading.Thread(target=collect, args=(k, handle), daemon=True)
        t.start()
        threads.append(t)
    return [results, threads]


def finish(pending, prompts, reference):
    results, threads = pending
    for t in threads:
        t.join(timeout=120)
    for k, res in enumerate(results):
        assert res is not None, f"request {k} never finished"
        tokens, done = res
        assert done.error is None, done.error
        assert tokens == reference[prompts[k % len(prompts)]], k


def until(predicate, timeout_s: float, what: str) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if predicate():
            return time.monotonic() - t0
        time.sleep(0.02)
    raise AssertionError(f"{what}: not within {timeout_s} s")


def in_flight_on(coord, node: str) -> bool:
    with coord._lock:
        return any(r.pipeline is not None and node in r.pipeline.nodes and r.num_output_tokens >= 1
                   for r in coord._live.values() if not r.done)


def stream_all(url: str, model: str, prompts: list, n: int, max_tokens: int = MAX_TOKENS,
               headers: dict | None = None) -> list:
    """``n`` concurrent streamed completions (token-id prompts, greedy); a thread each collects the
    text and the finish reason (an HTTP error or an error event: its text and ``"error"``)."""
    import httpx
    out: list = [None] * n

    def one(k):
        text, finish_reason = [], None
        body = {"model": model, "prompt": list(prompts[k % len(prompts)]), "max_tokens": max_tokens,
                "temperature": 0, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120,
                          headers=headers) as r:
            if r.status_code != 200:
                out[k] = (f"HTTP {r.status_code}: {r.read()!r}", "error")
                return
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        out[k] = (f"error event: {chunk}", "error")
                        return
                    text.append(chunk["choices"][0]["text"])
                    finish_reason = chunk["choices"][0]["finish_reason"] or finish_reason
        out[k] = ("".join(text), finish_reason)
    threads = [threading.Thread(target=one, args=(k,), daemon=True) for k in range(n)]
    for t in threads:
        t.start()
    return [out, threads]


def join_streams(streams) -> list:
    """Every stream's ``(text, finish_reason)``, once all ended."""
    out, threads = streams
    for t in threads:
        t.join(timeout=120)
    assert all(o is not None for o in out), "a stream did not finish"
    return out
