"""The live view of a cluster: the frame's pieces that do not depend on where the figures come from,
its checker, and the page that draws frames.

A *frame* (``helix.cluster/1``, :mod:`helix.core.cluster_frame`) is one JSON object: the nodes with
their layers, state, busy fraction, KV use and requests; the pipelines with their requests in flight
and decode tokens/s; the links between regions with their bytes/s against their bandwidth (one pair of nodes' link
times the pairs of nodes that use it); the
cluster's request rate and latency percentiles over the last minute; the events of the last hour.
Figures are SI (seconds, bytes/s, tokens/s); one that is not known is ``null``.

The page (:func:`render_page`, ``planner/live_view.html``, shipped as package data) is hand-written
HTML, CSS and JavaScript, nothing fetched from the network. Without frames it polls ``/v1/cluster``
of the server that serves it once a second (``helix serve``'s ``/dashboard``); given frames (a
simulated run's, ``helix simulate --html``) it embeds them and shows a time slider over them.
"""

from __future__ import annotations

import json
import math
import re
from collections import deque
from html import escape
from importlib import resources

from helix.core.cluster_frame import EVENT_KINDS, NODE_STATES, SCHEMA, WINDOW_S
from helix.core.pipelines import enumerate_pipelines
from helix.core.plan import Plan

MAX_PIPELINES = 24
"""A frame lists at most this many of the plan's pipelines (the most used first), and every one
that holds requests."""


def pipeline_id(nodes) -> str:
    """A pipeline's name in a frame: its nodes in order, joined by ``>``."""
    return ">".join(nodes)


def plan_pipelines(plan: Plan, limit: int = MAX_PIPELINES) -> list[tuple[str, ...]]:
    """The plan's pipelines (node names in order), the most used first, at most ``limit``."""
    paths = sorted(enumerate_pipelines(plan), key=lambda p: -p.share)
    return [p.nodes for p in paths[:limit]]


def quantiles(values, qs=(0.5, 0.99)) -> list[float | None]:
    """The ``qs`` quantiles (each 0..1) of ``values`` by linear interpolation, sorting them once;
    None each when empty."""
    xs = sorted(values)
    if not xs:
        return [None for _ in qs]
    out = []
    for q in qs:
        pos = q * (len(xs) - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, len(xs) - 1)
        out.append(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))
    return out


def quantile(values, q: float) -> float | None:
    """The ``q`` quantile (0..1) of ``values`` by linear interpolation; None when empty."""
    return quantiles(values, (q,))[0]


class RecentWindow:
    """Timed samples of the last ``window_s`` seconds (at most ``max_samples``): their quantiles
    and their count per second. Times are given, never read from a clock (the live server's
    :class:`~helix.server.live.RecentLatencies` passes its own, a test a stand-in's; the simulator
    keeps its samples in arrays of its own). Not thread-safe: its owner locks."""

    def __init__(self, start_s: float, window_s: float = WINDOW_S, max_samples: int = 20_000) -> None:
        """``start_s``: when counting began (a rate over a shorter time than the window is over
        that time)."""
        self.start_s = start_s
        self.window_s = window_s
        self._samples: deque[tuple[float, float]] = deque(maxlen=max_samples)

    def add(self, t_s: float, value: float = 0.0) -> None:
        self._samples.append((t_s, value))

    def _trim(self, now_s: float) -> None:
        since = now_s - self.window_s
        while self._samples and self._samples[0][0] < since:
            self._samples.popleft()

    def values(self, now_s: float) -> list[float]:
        """A copy of the window's values at ``now_s`` (quantiles of it need no lock)."""
        self._trim(now_s)
        return [v for _, v in self._samples]

    def quantiles(self, now_s: float, qs=(0.5, 0.99)) -> list[float | None]:
        return quantiles(self.values(now_s), qs)

    def rate(self, now_s: float) -> float:
        """Samples per second over the window (or since ``start_s``, when that is shorter)."""
        self._trim(now_s)
        span = min(self.window_s, now_s - self.start_s)
        return len(self._samples) / span if span > 0 else 0.0


# --- the frame's shape ----------------------------------------------------------------------------
_NUM = (int, float)
_NODE_KEYS = {"name": str, "gpu": str, "region": str, "layers": "layers", "state": NODE_STATES,
              "steps_per_s": _NUM, "busy": _NUM, "kv_used_tokens": int, "kv_capacity_tokens": int,
              "requests": int}
_PIPELINE_KEYS = {"id": str, "nodes": list, "in_flight": int, "decode_tokens_per_s": _NUM}
_LINK_KEYS = {"from_region": str, "to_region": str, "bytes_per_s": _NUM, "node_pairs": int,
              "bandwidth_bytes_per_s": _NUM}
_CLUSTER_KEYS = {"requests_per_s": _NUM, "ttft_p50_s": _NUM, "ttft_p99_s": _NUM, "tpot_p50_s": _NUM,
                 "tpot_p99_s": _NUM, "window_s": _NUM}
_EVENT_KEYS = {"time_s": _NUM, "kind": EVENT_KINDS, "detail": str}
_NULLABLE = {"layers", "steps_per_s", "busy", "kv_used_tokens", "kv_capacity_tokens", "requests",
             "decode_tokens_per_s", "bytes_per_s", "bandwidth_bytes_per_s", "requests_per_s",
             "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s"}


def _check_object(obj, keys: dict, where: str, problems: list[str]) -> None:
    if not isinstance(obj, dict):
        problems.append(f"{where}: expected an object, got {type(obj).__name__}")
        return
    for key in sorted(set(obj) - set(keys)):
        problems.append(f"{where}.{key}: unknown key")
    for key, kind in keys.items():
        if key not in obj:
            problems.append(f"{where}.{key}: missing")
            continue
        v = obj[key]
        if v is None:
            if key not in _NULLABLE:
                problems.append(f"{where}.{key}: null")
        elif kind == "layers":
            if not (isinstance(v, list) and len(v) == 2 and all(type(x) is int for x in v)
                    and 0 <= v[0] < v[1]):
                problems.append(f"{where}.{key}: {v!r} is not [start, end)")
        elif isinstance(kind, tuple) and kind and isinstance(kind[0], str):
            if v not in kind:
                problems.append(f"{where}.{key}: {v!r}; known: {', '.join(kind)}")
        elif isinstance(v, bool) or not isinstance(v, kind):
            problems.append(f"{where}.{key}: {v!r} is not {getattr(kind, '__name__', 'a number')}")


def check_frame(frame) -> list[str]:
    """What is wrong with ``frame`` (every key, its type, the states and kinds named), one line per
    problem; empty when it is a well-formed ``helix.cluster/1`` frame."""
    problems: list[str] = []
    top = {"schema": str, "time_s": _NUM, "model": str, "nodes": list, "pipelines": list,
           "links": list, "cluster": dict, "events": list}
    _check_object(frame, top, "frame", problems)
    if problems:
        return problems
    if frame["schema"] != SCHEMA:
        problems.append(f"frame.schema: {frame['schema']!r}, not {SCHEMA!r}")
    names = set()
    for i, n in enumerate(frame["nodes"]):
        _check_object(n, _NODE_KEYS, f"nodes[{i}]", problems)
        if isinstance(n, dict):
            names.add(n.get("name"))
    for i, p in enumerate(frame["pipelines"]):
        _check_object(p, _PIPELINE_KEYS, f"pipelines[{i}]", problems)
        if isinstance(p, dict) and isinstance(p.get("nodes"), list):
            unknown = [x for x in p["nodes"] if x not in names]
            if unknown:
                problems.append(f"pipelines[{i}].nodes: {unknown} are not in nodes")
    for i, link in enumerate(frame["links"]):
        _check_object(link, _LINK_KEYS, f"links[{i}]", problems)
    _check_object(frame["cluster"], _CLUSTER_KEYS, "cluster", problems)
    for i, e in enumerate(frame["events"]):
        _check_object(e, _EVENT_KEYS, f"events[{i}]", problems)
    return problems


# --- the page -------------------------------------------------------------------------------------
def _template() -> str:
    return resources.files("planner").joinpath("live_view.html").read_text(encoding="utf-8")


def _pack(frames: list[dict]) -> dict:
    """``frames`` with their events once: ``{"events": [...], "frames": [...]}``, each frame's
    ``events`` a half-open ``[from, to]`` range of the shared list where its events are a run of
    it (they are, when events come oldest first and a frame holds those of a window of time), else
    its own list. A replay's frames each repeat the hour of events before them."""
    shared: list[dict] = []
    index: dict[tuple, int] = {}
    packed = []
    for f in frames:
        ids = []
        for e in f["events"]:
            key = (e["time_s"], e["kind"], e["detail"])
            if key not in index:
                index[key] = len(shared)
                shared.append(e)
            ids.append(index[key])
        run = bool(ids) and ids == list(range(ids[0], ids[0] + len(ids)))
        packed.append({**f, "events": [ids[0], ids[0] + len(ids)] if run else f["events"]})
    return {"events": shared, "frames": packed}


def _unpack(data: dict) -> list[dict]:
    shared = data["events"]

    def events(span: list):
        if len(span) == 2 and all(isinstance(x, int) for x in span):
            return shared[span[0]:span[1]]
        return span

    return [{**f, "events": events(f["events"])} for f in data["frames"]]


_EMBEDDED = re.compile(r'<script id="helix-frames" type="application/json">(.*?)</script>', re.DOTALL)


def embedded_frames(page: str) -> list[dict]:
    """The frames a replay page (:func:`render_page`) embeds, as they were given; [] for a live
    page."""
    found = _EMBEDDED.search(page)
    return [] if found is None else _unpack(json.loads(found.group(1)))


def render_page(frames: list | None, title: str) -> str:
    """The whole HTML document. ``frames`` None: the page polls ``/v1/cluster`` of its own origin
    once a second; a list of frames (oldest first): it embeds them (in ``<script
    id="helix-frames" type="application/json">``, their events once: :func:`embedded_frames`
    reads them back) and shows a time slider over them instead."""
    data = ""
    if frames is not None:
        text = json.dumps(_pack(frames), separators=(",", ":"), allow_nan=False)
        # Inside <script>, "</script" ends the element, and "<!--" then "<script" puts the parser
        # in a state where the real "</script>" does not: no "<" at all ("\u003c" is the same JSON
        # string; "<" appears only inside strings).
        data = ('<script id="helix-frames" type="application/json">'
                + text.replace("<", "\\u003c") + "</script>")
    return _template().replace("{{TITLE}}", escape(title)).replace("{{FRAMES}}", data)
