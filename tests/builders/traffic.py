"""Traffic for failure tests: greedy requests submitted straight to a Coordinator, each collected
by a thread, and checks that every one ended with the reference output."""

from __future__ import annotations

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
