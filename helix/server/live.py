"""The live view of the running cluster: ``GET /v1/cluster`` (one ``helix.cluster/1`` frame,
:mod:`planner.live_view`) and ``GET /dashboard`` (the page that polls it once a second).

A frame is read from what the coordinator already keeps: each node's status (``/admin/nodes``), its
worker's last stats (KV blocks, step counters, bytes sent to each peer), the requests on each
pipeline and the tokens each produced, and its event log (:mod:`coordinator.events`); latencies come
from :class:`RecentLatencies`, fed by the same observer hooks as ``/metrics``. Rates (steps/s, busy
fraction, decode tokens/s, bytes/s) are counter differences over the last :data:`RATE_S` seconds
of frames, so they are null in the first frame, in the first after a gap of more than
:data:`RATE_STALE_S` between frames, and for a node whose worker restarted since.
Without the cluster spec (``--cluster``) nodes have no GPU kind or region (``unknown``) and no link
between regions is known.

``/v1/cluster`` is guarded like every ``/v1`` route (``--api-key``); the page holds no data and is
open: it sends the key it is given (``/dashboard#key=...``: in the fragment, which no request
carries, so it stays out of access logs; kept in the tab's session storage, or typed when the
server answers 401).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

from fastapi import FastAPI
from fastapi.responses import HTMLResponse

from helix.core.cluster_frame import SCHEMA, WINDOW_S
from helix.core.plan import COORDINATOR
from helix.core.spec import ClusterSpec
from planner.live_view import RecentWindow, pipeline_id, plan_pipelines, quantiles, render_page

RATE_S = 2.0
"""Rates in a frame are over (at least) this many seconds of counters, when frames are that old."""
RATE_STALE_S = 3 * RATE_S
"""...and over at most this many: after a longer gap between frames (nobody polled), a rate would
be the gap's average, not the current one, so the frame after it has none."""
UNKNOWN = "unknown"
_STATE = {"ok": "serving", "drained": "draining"}   # NodeStatus states -> frame states
_ANSWERS = ("serving", "draining")                  # states whose worker's figures are current
# Joins (server.elastic.JoinStatus states) whose registered worker waits for layers: the frame lists
# the node as ``joining``. ``idle``: the re-plan kept the running placement; the node stays
# registered, unplaced, as a simulated node that joined does until a re-plan gives it layers.
_WAITING_JOINS = ("planning", "applying", "idle")


class RecentLatencies:
    """TTFT, inter-token gaps (TPOT) and finished requests of the last :data:`WINDOW_S` seconds;
    implements the coordinator's observer hooks (``ServingMetrics`` forwards them here). Each keeps
    at most :class:`~planner.live_view.RecentWindow`'s ``max_samples``: past that many tokens a
    minute, TPOT's percentiles are over the latest gaps only."""

    def __init__(self, clock=time.time) -> None:
        self._clock = clock
        now = clock()
        self.ttft, self.tpot, self.finished_requests = (RecentWindow(now) for _ in range(3))
        self._lock = threading.Lock()

    def first_token(self, ttft_s: float) -> None:
        with self._lock:
            self.ttft.add(self._clock(), ttft_s)

    def next_token(self, itl_s: float) -> None:
        with self._lock:
            self.tpot.add(self._clock(), itl_s)

    def finished(self) -> None:
        with self._lock:
            self.finished_requests.add(self._clock())

    def cluster(self, now_s: float) -> dict:
        """The frame's ``cluster`` object at ``now_s``."""
        # Copied under the lock, sorted outside it: next_token (every token streamed) takes it.
        with self._lock:
            ttft, tpot = self.ttft.values(now_s), self.tpot.values(now_s)
            rate = self.finished_requests.rate(now_s)
        ttft50, ttft99 = quantiles(ttft)
        tpot50, tpot99 = quantiles(tpot)
        return {"requests_per_s": rate, "ttft_p50_s": ttft50, "ttft_p99_s": ttft99, "tpot_p50_s": tpot50,
                "tpot_p99_s": tpot99, "window_s": WINDOW_S}


@dataclass
class _Counters:
    """What rates are computed from, read at ``time_s``."""

    time_s: float
    steps: dict[str, int] = field(default_factory=dict)
    step_s: dict[str, float] = field(default_factory=dict)
    tokens: dict[tuple[str, ...], int] = field(default_factory=dict)
    bytes_to: dict[tuple[str, str], int] = field(default_factory=dict)


def _rate(now: dict, base: dict, key, dt: float, from_zero: bool = False) -> float | None:
    """Growth per second of counter ``key``; None when unknown or it went back (a restart).
    ``from_zero``: a counter missing from ``base`` (or from both) counted nothing yet."""
    if from_zero:
        then, value = base.get(key, 0), now.get(key, 0)
    elif key not in now or key not in base:
        return None
    else:
        then, value = base[key], now[key]
    return None if value < then else (value - then) / dt


class ClusterView:
    """Builds frames of ``coordinator`` (a :class:`~coordinator.runtime.Coordinator`); safe to call
    from several threads."""

    def __init__(self, coordinator, model_name: str, latencies: RecentLatencies,
                 cluster: ClusterSpec | None = None, elastic=None, clock=time.time) -> None:
        self.coordinator = coordinator
        self.model_name = model_name
        self.latencies = latencies
        self.cluster = cluster
        self.elastic = elastic
        self._clock = clock
        self._history: deque[_Counters] = deque()
        self._lock = threading.Lock()

    # --- where nodes are --------------------------------------------------------------------------
    def _spec_node(self, name: str):
        if self.cluster is None:
            return None
        try:
            return self.cluster.node(name)
        except KeyError:
            return None

    def _region(self, vertex: str) -> str:
        if self.cluster is None:
            return UNKNOWN
        if vertex == COORDINATOR:
            return self.cluster.coordinator_region
        return self.cluster.region_of(vertex) if self._spec_node(vertex) is not None else UNKNOWN

    def _gpu(self, name: str) -> str:
        node = self._spec_node(name)
        return node.gpu if node is not None else UNKNOWN

    # --- counters and rates -----------------------------------------------------------------------
    def _counters(self, now_s: float) -> _Counters:
        c = self.coordinator
        stats = dict(c.stats)
        out = _Counters(now_s)
        for node, s in stats.items():
            out.steps[node] = s.steps_total
            out.step_s[node] = s.step_time_s_total
            for peer, n in s.bytes_sent_to.items():
                out.bytes_to[(node, peer)] = n
        for peer, n in c.data.bytes_sent_to().items():
            out.bytes_to[(COORDINATOR, peer)] = n
        out.tokens = c.pipeline_tokens()
        return out

    def _base(self, now: _Counters) -> _Counters | None:
        """The latest counters at least :data:`RATE_S` old (else the oldest), after recording
        ``now``; None when there are none before ``now``, or only ones older than
        :data:`RATE_STALE_S`."""
        with self._lock:
            self._history.append(now)
            while len(self._history) > 1 and self._history[1].time_s <= now.time_s - RATE_S:
                self._history.popleft()
            base = self._history[0]
            if now.time_s - base.time_s > RATE_STALE_S:
                self._history.popleft()
                return None
        return base if now.time_s - base.time_s > 0.05 else None

    # --- the frame --------------------------------------------------------------------------------
    def frame(self) -> dict:
        """One ``helix.cluster/1`` frame of now."""
        c = self.coordinator
        now_s = self._clock()
        now = self._counters(now_s)
        base = self._base(now)
        dt = now_s - base.time_s if base is not None else None
        nodes = self._nodes(c, now, base, dt)
        return {"schema": SCHEMA, "time_s": now_s, "model": self.model_name, "nodes": nodes,
                "pipelines": self._pipelines(c, now, base, dt), "links": self._links(c, now, base, dt),
                "cluster": self.latencies.cluster(now_s),
                "events": [e.to_dict() for e in c.events.recent()]}

    def _nodes(self, c, now: _Counters, base: _Counters | None, dt: float | None) -> list[dict]:
        stats = dict(c.stats)
        rows = []
        for st in c.nodes_status():
            state = _STATE.get(st.state, st.state)
            s = stats.get(st.node)
            answers = state in _ANSWERS and s is not None
            steps_per_s = busy = None
            if answers and base is not None:
                steps_per_s = _rate(now.steps, base.steps, st.node, dt)
                busy = _rate(now.step_s, base.step_s, st.node, dt)
                busy = None if busy is None else min(1.0, busy)
            block = s.block_size_tokens if s is not None else 0
            rows.append({"name": st.node, "gpu": self._gpu(st.node), "region": self._region(st.node),
                         "layers": [st.start, st.end], "state": state, "steps_per_s": steps_per_s,
                         "busy": busy, "kv_used_tokens": s.kv_blocks_used * block if answers else None,
                         "kv_capacity_tokens": s.kv_blocks_total * block if s is not None else None,
                         "requests": st.requests})
        placed = {r["name"] for r in rows}
        joins = list(self.elastic.joins.values()) if self.elastic is not None else []
        for j in joins:
            if j.node not in placed and j.state in _WAITING_JOINS:
                rows.append({"name": j.node, "gpu": self._gpu(j.node), "region": self._region(j.node),
                             "layers": None, "state": "joining", "steps_per_s": None, "busy": None,
                             "kv_used_tokens": None, "kv_capacity_tokens": None, "requests": 0})
        return rows

    def _pipelines(self, c, now: _Counters, base: _Counters | None, dt: float | None) -> list[dict]:
        in_flight = c.requests_by_pipeline()
        paths = list(dict.fromkeys([*plan_pipelines(c.plan), *in_flight]))
        out = []
        for nodes in paths:
            rate = None if base is None else _rate(now.tokens, base.tokens, nodes, dt, from_zero=True)
            out.append({"id": pipeline_id(nodes), "nodes": list(nodes), "in_flight": in_flight[nodes],
                        "decode_tokens_per_s": rate})
        return out

    def _links(self, c, now: _Counters, base: _Counters | None, dt: float | None) -> list[dict]:
        """Each ordered pair of regions that the plan's flows cross, with the data plane's bytes/s
        between them, the pairs of nodes (the coordinator one of them) that the plan's flows join
        across them or that sent across them since the base, and the spec's bandwidth of one
        such pair's link."""
        if self.cluster is None:
            return []
        node_pairs: dict[tuple[str, str], set[tuple[str, str]]] = {}
        for a in c.plan.arc_flows:
            if a.flow_tokens_per_s > 0:
                key = (self._region(a.src), self._region(a.dst))
                node_pairs.setdefault(key, set()).add((a.src, a.dst))
        pairs = [(ra, rb) for ra, rb in node_pairs if ra != rb and UNKNOWN not in (ra, rb)]
        sent: dict[tuple[str, str], float] = {}
        if base is not None:
            for src, peer in now.bytes_to:
                grew = _rate(now.bytes_to, base.bytes_to, (src, peer), dt, from_zero=True)
                key = (self._region(src), self._region(peer))
                if grew is not None:
                    sent[key] = sent.get(key, 0.0) + grew
                    if grew > 0:
                        node_pairs.setdefault(key, set()).add((src, peer))
        out = []
        for ra, rb in pairs:
            link = self.cluster.region_link(ra, rb)
            out.append({"from_region": ra, "to_region": rb,
                        "bytes_per_s": sent.get((ra, rb), 0.0) if base is not None else None,
                        "node_pairs": len(node_pairs[ra, rb]),
                        "bandwidth_bytes_per_s": link.bandwidth_bytes_per_s if link else None})
        return out


def add_live_routes(app: FastAPI, view: ClusterView, title: str) -> None:
    """``GET /v1/cluster`` (the frame of now) and ``GET /dashboard`` (the page titled ``title``)."""
    page = render_page(None, title)

    @app.get("/v1/cluster")
    def cluster():
        return view.frame()

    @app.get("/dashboard", response_class=HTMLResponse)
    def dashboard():
        return HTMLResponse(page, headers={"Cache-Control": "no-store"})
