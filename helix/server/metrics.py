"""Prometheus metrics of the serving API, named like vLLM's (``vllm:*`` -> ``helix:*``).

Every series carries a ``model_name`` label, as vLLM's do. Latency and length histograms, token
counters and ``request_success_total{finished_reason}`` are fed by the coordinator's observer hooks;
the request, node and KV gauges, the workers' preemption counts, their adapter caches' counts and
the cluster's events by kind (its event log, :mod:`coordinator.events`) are read from the
coordinator when ``/metrics`` is scraped. Each app has its own registry, so
several servers (tests) can live in one process.
"""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from coordinator.events import KINDS as EVENT_KINDS
from helix.server.live import RecentLatencies

_LATENCY_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                      5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
# vLLM's request-length buckets (build_1_2_5_buckets), to a million tokens.
_TOKEN_BUCKETS = tuple(m * 10 ** e for e in range(7) for m in (1, 2, 5))
FINISHED_REASONS = ("stop", "length", "abort", "error")
_NODE_STATES = ("ok", "suspect", "dead", "lost", "draining", "drained")


class ServingMetrics:
    """Implements :class:`coordinator.runtime.Observer`; renders the Prometheus text format."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.recent = RecentLatencies()
        """The last minute's latencies and finished requests (the live view, helix.server.live)."""
        self.registry = CollectorRegistry()
        r, m = self.registry, ["model_name"]

        def hist(name: str, doc: str, buckets) -> Histogram:
            return Histogram(name, doc, m, buckets=buckets, registry=r).labels(model_name)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, m, registry=r).labels(model_name)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, m, registry=r).labels(model_name)

        self.ttft = hist("helix:time_to_first_token_seconds", "Time to first token.", _LATENCY_BUCKETS_S)
        self.itl = hist("helix:inter_token_latency_seconds", "Time between output tokens.",
                        _LATENCY_BUCKETS_S)
        self.e2e = hist("helix:e2e_request_latency_seconds", "Request latency, arrival to end.",
                        _LATENCY_BUCKETS_S)
        self.queue_time = hist("helix:request_queue_time_seconds", "Time a request waited for a "
                               "pipeline (to its end, if it never got one).", _LATENCY_BUCKETS_S)
        self.request_prompt_tokens = hist("helix:request_prompt_tokens", "Prompt length of finished "
                                          "requests, in tokens.", _TOKEN_BUCKETS)
        self.request_generation_tokens = hist("helix:request_generation_tokens", "Tokens generated "
                                              "per finished request.", _TOKEN_BUCKETS)
        self.running = gauge("helix:num_requests_running", "Requests holding a pipeline.")
        self.waiting = gauge("helix:num_requests_waiting", "Requests waiting for a pipeline.")
        self.requests_moved = gauge("helix:requests_moved", "Requests moved to another pipeline "
                                    "because theirs lost a node (since start).")
        self.moved_prefill_tokens = gauge("helix:moved_prefill_tokens", "Tokens prefilled again for "
                                          "moved requests (since start).")
        self.prompt_tokens = counter("helix:prompt_tokens", "Prompt tokens processed.")
        self.generation_tokens = counter("helix:generation_tokens", "Tokens generated.")
        self.preemptions = counter("helix:num_preemptions", "Requests preempted by a worker's step "
                                   "policy (KV given back, recomputed later), summed over workers.")
        self.success = Counter("helix:request_success", "Finished requests by finish reason.",
                               m + ["finished_reason"], registry=r)
        for reason in FINISHED_REASONS:   # every reason is a series from the start, as in vLLM
            self.success.labels(model_name, reason)
        self.kv_usage = Gauge("helix:kv_cache_usage_perc", "Fraction of KV blocks in use per node; "
                              "no series for a node that does not answer (suspect, dead).",
                              m + ["node"], registry=r)
        self.node_state = Gauge("helix:node_state", "1 for each node's current health state "
                                "(ok, suspect, dead, lost, draining, drained), 0 for the others.",
                                m + ["node", "state"], registry=r)
        self.node_restarts = Gauge("helix:node_restarts", "Times a new worker process registered for "
                                   "each node while serving (since start).", m + ["node"], registry=r)
        self.capacity = gauge("helix:cluster_capacity_fraction", "Share of the plan's capacity (its "
                              "max flow) that the serving nodes carry, 0..1.")
        self.waiting_limit = gauge("helix:num_requests_waiting_limit", "New requests that may wait "
                                   "for a pipeline now (sized from the restart time and the "
                                   "capacity serving).")
        self._preemptions_seen: dict[str, int] = {}
        # Counters fed from the coordinator's absolute counts grow by the difference since the last
        # scrape; concurrent scrapes read and add under this lock, or a slower one adds a negative
        # difference (an error) or counts a difference twice.
        self._delta_lock = threading.Lock()
        self.cluster_events = Counter("helix:cluster_events", "Cluster events by kind, as the "
                                      "coordinator's event log records them: "
                                      + ", ".join(EVENT_KINDS) + ".", m + ["kind"], registry=r)
        for kind in EVENT_KINDS:   # every kind is a series from the start: rate() sees the first
            self.cluster_events.labels(model_name, kind)
        self._events_seen: dict[str, int] = {}
        # Each worker's cache of fine-tuned tasks made ready from disk (worker.adapter_cache).
        self.adapter_cache = Gauge("helix:adapter_cache", "Per node: the adapter cache's hits, misses "
                                   "(tasks read from disk) and evictions since the worker started, and "
                                   "the bytes it holds now.", m + ["node", "value"], registry=r)
        self.adapter_load = Gauge("helix:adapter_load_seconds", "Per node: time to make a task ready "
                                  "(read, check, pack, copy to the device) over its last loads.",
                                  m + ["node", "quantile"], registry=r)

    # --- coordinator observer hooks ---------------------------------------------------------------
    def first_token(self, ttft_s: float) -> None:
        self.ttft.observe(ttft_s)
        self.recent.first_token(ttft_s)

    def next_token(self, itl_s: float) -> None:
        self.itl.observe(itl_s)
        self.recent.next_token(itl_s)

    def finished(self, reason: str, e2e_s: float, queue_s: float, prompt_tokens: int,
                 completion_tokens: int, started: bool) -> None:
        self.success.labels(self.model_name, reason).inc()
        self.recent.finished()
        self.queue_time.observe(queue_s)
        if not started:
            return   # no token came back: nothing was served (latency and lengths are of served ones)
        self.e2e.observe(e2e_s)
        self.request_prompt_tokens.observe(prompt_tokens)
        self.request_generation_tokens.observe(completion_tokens)
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(completion_tokens)

    def _count_preemptions(self, stats) -> None:
        """Add each worker's new preemptions since the last scrape; a worker whose count went down
        restarted, so all of its count is new. A node that stopped answering keeps its last count.
        The caller holds ``_delta_lock`` from reading ``stats`` on."""
        for node, s in stats.items():
            now, seen = s.num_preemptions_total, self._preemptions_seen.get(node, 0)
            self.preemptions.inc(now - seen if now >= seen else now)
            self._preemptions_seen[node] = now

    def _count_events(self, counts: dict[str, int]) -> None:
        """Add the event log's new events of each kind since the last scrape. The caller holds
        ``_delta_lock`` from reading ``counts`` on."""
        for kind, n in counts.items():
            self.cluster_events.labels(self.model_name, kind).inc(n - self._events_seen.get(kind, 0))
            self._events_seen[kind] = n

    def _adapter_caches(self, stats) -> None:
        m = self.model_name
        for node, s in stats.items():
            for value, v in (("hits", s.adapter_cache_hits), ("misses", s.adapter_cache_misses),
                             ("evictions", s.adapter_cache_evictions), ("bytes", s.adapter_cache_bytes)):
                self.adapter_cache.labels(m, node, value).set(v)
            for q, v in (("0.5", s.adapter_load_s_p50), ("0.99", s.adapter_load_s_p99)):
                if v is not None:
                    self.adapter_load.labels(m, node, q).set(v)

    def render(self, coordinator) -> bytes:
        """The text exposition, with gauges read from ``coordinator`` now."""
        m = self.model_name
        self.running.set(coordinator.num_running)
        self.waiting.set(coordinator.num_waiting)
        with self._delta_lock:
            self._count_preemptions(dict(coordinator.stats))
            self._count_events(coordinator.events.counts())
        states = coordinator.node_states()
        for node, frac in coordinator.kv_usage_fraction().items():
            # A node that does not answer has no known KV use: its series is dropped, not frozen.
            if states.get(node, "ok") in ("ok", "draining", "drained"):
                self.kv_usage.labels(m, node).set(frac)
            else:
                try:
                    self.kv_usage.remove(m, node)
                except KeyError:
                    pass
        for node, state in states.items():
            for name in _NODE_STATES:
                self.node_state.labels(m, node, name).set(1.0 if state == name else 0.0)
            self.node_restarts.labels(m, node).set(coordinator.restarts[node])
        self.capacity.set(coordinator.capacity_fraction)
        self.waiting_limit.set(coordinator.queue_limit())
        self._adapter_caches(dict(coordinator.stats))
        self.requests_moved.set(coordinator.requests_moved)
        self.moved_prefill_tokens.set(coordinator.moved_prefill_tokens)
        return generate_latest(self.registry)
