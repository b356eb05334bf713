"""Prometheus metrics of the serving API, named like vLLM's (``vllm:*`` -> ``helix:*``).

Latency histograms and token counters are fed by the coordinator's observer hooks; the request and
KV gauges are read from the coordinator when ``/metrics`` is scraped. Each app has its own registry,
so several servers (tests) can live in one process.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                      5.0, 7.5, 10.0, 20.0, 40.0, 80.0)


class ServingMetrics:
    """Implements :class:`coordinator.runtime.Observer`; renders the Prometheus text format."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttft = Histogram("helix:time_to_first_token_seconds", "Time to first token.",
                              buckets=_LATENCY_BUCKETS_S, registry=r)
        self.itl = Histogram("helix:inter_token_latency_seconds", "Time between output tokens.",
                             buckets=_LATENCY_BUCKETS_S, registry=r)
        self.e2e = Histogram("helix:e2e_request_latency_seconds", "Request latency, arrival to end.",
                             buckets=_LATENCY_BUCKETS_S, registry=r)
        self.running = Gauge("helix:num_requests_running", "Requests holding a pipeline.", registry=r)
        self.waiting = Gauge("helix:num_requests_waiting", "Requests waiting for a pipeline.", registry=r)
        self.kv_usage = Gauge("helix:kv_cache_usage_perc", "Fraction of KV blocks in use per node.",
                              ["node"], registry=r)
        self.node_state = Gauge("helix:node_state", "1 for each node's current health state "
                                "(ok, suspect, dead, draining), 0 for the others.", ["node", "state"],
                                registry=r)
        self.requests_moved = Gauge("helix:requests_moved", "Requests moved to another pipeline "
                                    "because theirs lost a node (since start).", registry=r)
        self.moved_prefill_tokens = Gauge("helix:moved_prefill_tokens", "Tokens prefilled again for "
                                          "moved requests (since start).", registry=r)
        self.prompt_tokens = Counter("helix:prompt_tokens", "Prompt tokens processed.", registry=r)
        self.generation_tokens = Counter("helix:generation_tokens", "Tokens generated.", registry=r)

    # --- coordinator observer hooks ---------------------------------------------------------------
    def first_token(self, ttft_s: float) -> None:
        self.ttft.observe(ttft_s)

    def next_token(self, itl_s: float) -> None:
        self.itl.observe(itl_s)

    def finished(self, e2e_s: float, prompt_tokens: int, completion_tokens: int) -> None:
        self.e2e.observe(e2e_s)
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(completion_tokens)

    def render(self, coordinator) -> bytes:
        """The text exposition, with gauges read from ``coordinator`` now."""
        self.running.set(coordinator.num_running)
        self.waiting.set(coordinator.num_waiting)
        states = coordinator.node_states()
        for node, frac in coordinator.kv_usage_fraction().items():
            # A node that does not answer has no known KV use: its series is dropped, not frozen.
            if states.get(node, "ok") in ("ok", "draining"):
                self.kv_usage.labels(node=node).set(frac)
            else:
                try:
                    self.kv_usage.remove(node)
                except KeyError:
                    pass
        for node, state in states.items():
            for name in ("ok", "suspect", "dead", "draining"):
                self.node_state.labels(node=node, state=name).set(1.0 if state == name else 0.0)
        self.requests_moved.set(coordinator.requests_moved)
        self.moved_prefill_tokens.set(coordinator.moved_prefill_tokens)
        return generate_latest(self.registry)
