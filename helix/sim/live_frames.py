"""A simulated run as the live view's frames (``helix simulate --html``): what ``GET /v1/cluster``
shows of a running server (:mod:`helix.server.live`), sampled once per ``period_s`` simulated
seconds, to replay in :func:`planner.live_view.render_page`.

A :class:`FrameRecorder` is the simulator's sampler (``Simulator.sampler``): the event loop calls
it with each sample time as its clock passes that time, before the events at that time run. A frame
reads counters the simulator keeps anyway (busy seconds, steps, tokens streamed, bytes sent,
latency samples) and takes differences since the last frame, so sampling costs a pass over the
nodes, the requests holding a pipeline and the links used, per sample, and nothing per event.

The figures mean what the live server's do:

- per node: its state (``suspect`` from the moment it fails until the coordinator declares it
  ``dead``; ``draining``, also a node a re-plan stopped until its new slice is loaded;
  ``joining`` until it joins, and after, with no layers, until a re-plan gives it some), step
  rate and busy fraction since the last frame, KV used of its pool, requests resident. A node that
  does not answer (suspect, dead) has no step rate, busy fraction or KV use (null), and the
  requests the coordinator still counts on it;
- per pipeline: the plan's (:func:`planner.live_view.plan_pipelines`) and every node path a request
  holds now, with those requests and the tokens streamed to them since the last frame per second
  (a request that arrives and finishes between two frames is in no pipeline's figure);
- per pair of regions that the plan's flows cross: bytes per second sent from one to the other
  since the last frame; the pairs of nodes that the run's first plan joins across them or that sent
  across them since the last frame (``node_pairs``); and the spec's bandwidth between two nodes of
  those regions (:meth:`~helix.core.spec.ClusterSpec.region_link`). Each pair of nodes has a link
  of its own, so the bytes compare with the bandwidth times ``node_pairs``; a message counts when
  it is put on its link (a FIFO link reserves its time then), so a burst of prompts queued on a
  slow link reads high until the queue drains;
- for the cluster, over the last ``window_s``: finished requests per second, TTFT and time per
  output token (the gaps between a request's tokens) p50 and p99 of the last ``max_samples``;
- events of the last hour: failures and returns (``--fail``), drains, joins and re-plans.
"""

from __future__ import annotations

import bisect
import math
from array import array
from typing import TYPE_CHECKING

import numpy as np

from helix.core.cluster_frame import EVENTS_KEEP_S, SCHEMA, WINDOW_S
from helix.core.plan import Plan
from helix.core.spec import ClusterSpec
from planner.live_view import pipeline_id, plan_pipelines

if TYPE_CHECKING:
    from helix.sim.engine import Simulator


MAX_FRAMES = 5000
"""A replay holds at most this many frames (a page of about 10 kB each)."""
MIN_PERIOD_S = 0.1
"""``helix simulate --html-every`` takes no shorter period (a frame is a pass over the cluster)."""


def frame_count(duration_s: float, period_s: float) -> int:
    """How many frames a run of ``duration_s`` simulated seconds gives, one each ``period_s`` from
    0 on (the last at the end, when the period divides it)."""
    return math.floor(duration_s / period_s + 1e-9) + 1


class FrameRecorder:
    """Samples one simulator into ``frames`` (dicts in the ``helix.cluster/1`` shape)."""

    def __init__(self, sim: Simulator, spec: ClusterSpec, plan: Plan, period_s: float = 1.0,
                 window_s: float = WINDOW_S, max_samples: int = 20_000,
                 max_frames: int = MAX_FRAMES) -> None:
        """Attaches itself as ``sim.sampler``. ``plan``: the plan the run starts with;
        ``period_s``: simulated seconds between frames; ``window_s``: the span of the cluster
        figures; ``max_samples``: the most recent latency samples their percentiles read (as the
        live server keeps); ``max_frames``: past this many, every other frame is dropped and the
        period doubled (a run of unknown length: ``--duration 0``); a kept frame's rates stay over
        the period it was recorded with."""
        if not period_s > 0 or not window_s > 0 or max_frames < 2:
            raise ValueError(f"period_s and window_s must be > 0 and max_frames >= 2, got "
                             f"{period_s}, {window_s}, {max_frames}")
        self.sim, self.spec = sim, spec
        self.period_s, self.window_s, self.max_samples = period_s, window_s, max_samples
        self.max_frames = max_frames
        self.frames: list[dict] = []
        self._static = [(n.name, n.gpu, spec.region_of(n.name)) for n in spec.nodes]
        self._plan_paths = {pipeline_id(p): list(p) for p in plan_pipelines(plan)}
        self._paths: dict[str, list[str]] = {}   # every pipeline a request held: id -> nodes
        region = spec.region_of
        # The pairs of regions the plan's flows cross, listed from the first frame on.
        self._plan_node_pairs: dict[tuple[str, str], set[tuple[str, str]]] = {}
        for a in plan.arc_flows:
            if a.flow_tokens_per_s > 0 and region(a.src) != region(a.dst):
                self._plan_node_pairs.setdefault((region(a.src), region(a.dst)), set()).add((a.src, a.dst))
        self._region_pairs = sorted(self._plan_node_pairs)
        self._link_pair: dict[tuple[str, str], tuple[str, str] | None] = {}
        self._last_s = 0.0
        self._nodes: dict[str, tuple[float, int]] = {}   # name -> (busy_s, num_steps) at the last frame
        # request id -> (request, pipeline id, tokens received, pipeline) at the last frame
        self._streamed: dict[int, tuple] = {}
        self._link_bytes: dict[tuple[str, str], float] = {}
        # (time, TTFT samples, ITL samples, requests completed) at each frame
        self._counts: list[tuple[float, int, int, int]] = []
        sim.sampler = self

    def __call__(self, at_s: float) -> float:
        """Record the frame of ``at_s``; return the next sample time. Frame ``k`` is at ``k *
        period_s`` (a product, not a running sum: no drift over many frames)."""
        self.frames.append(self.frame(at_s))
        if len(self.frames) > self.max_frames:
            # Frames 0, 2, 4, ... are at multiples of twice the period: keep those.
            self.frames = self.frames[::2]
            self.period_s *= 2
        return len(self.frames) * self.period_s

    def frame(self, at_s: float) -> dict:
        """The frame of now (``at_s``); figures per second are since the previous frame."""
        span_s = at_s - self._last_s
        frame = {"schema": SCHEMA, "time_s": at_s, "model": self.spec.model.name,
                 "nodes": self._node_rows(at_s, span_s), "pipelines": self._pipelines(span_s),
                 "links": self._links(span_s), "cluster": self._cluster(at_s),
                 "events": self._events(at_s)}
        self._last_s = at_s
        return frame

    # --- nodes -------------------------------------------------------------------------------------
    def _node_rows(self, at_s: float, span_s: float) -> list[dict]:
        sim, rows = self.sim, []
        # Nodes that joined holding no layers yet (a re-plan will give them some), as live.
        joined = {j.node for j in sim.config.joins if j.at_s < at_s}
        for name, gpu, region in self._static:
            w = sim.workers.get(name)
            if w is None:
                if name in joined:
                    rows.append({"name": name, "gpu": gpu, "region": region, "layers": None,
                                 "state": "joining", "steps_per_s": None, "busy": None,
                                 "kv_used_tokens": None, "kv_capacity_tokens": None, "requests": 0})
                continue
            busy_s, steps = self._nodes.get(name, (0.0, 0))
            self._nodes[name] = (w.busy_s, w.num_steps)
            blocks = w.policy.blocks
            row = {"name": name, "gpu": gpu, "region": region, "layers": [w.start, w.end],
                   "state": _state(sim, w), "steps_per_s": _per_s(w.num_steps - steps, span_s),
                   # A step's time is counted when it ends: one that ends just after a frame
                   # counts towards the next, which may then read above 1.
                   "busy": min(1.0, _per_s(w.busy_s - busy_s, span_s)),
                   "kv_used_tokens": blocks.num_used_blocks * blocks.block_size_tokens,
                   "kv_capacity_tokens": w.kv_capacity_tokens, "requests": len(w.requests)}
            if w.down:   # no answer: unknown figures, the requests the coordinator counts there
                row.update(steps_per_s=None, busy=None, kv_used_tokens=None,
                           requests=sum(w in r.workers for r in sim.active.values()))
            rows.append(row)
        return rows

    # --- pipelines ---------------------------------------------------------------------------------
    def _pipelines(self, span_s: float) -> list[dict]:
        in_flight: dict[str, int] = {}
        tokens: dict[str, int] = {}
        paths: dict[str, list[str]] = dict(self._plan_paths)
        streamed = self._streamed
        for rid, req in self.sim.active.items():
            seen = streamed.get(rid)
            if seen is not None and seen[3] is req.pipeline:
                pid = seen[1]
            else:
                nodes = [s.node for s in req.pipeline.stages]
                pid = pipeline_id(nodes)
                self._paths.setdefault(pid, nodes)
                paths.setdefault(pid, nodes)
            in_flight[pid] = in_flight.get(pid, 0) + 1
            # A request that moved counts its tokens since the last frame on its new pipeline.
            tokens[pid] = tokens.get(pid, 0) + req.received - (0 if seen is None else seen[2])
            streamed[rid] = (req, pid, req.received, req.pipeline)
        active = self.sim.active
        for rid in [r for r in streamed if r not in active]:
            req, pid, before, pipeline = streamed[rid]
            if req.received > before:   # it finished (or moved and waits) since the last frame
                tokens[pid] = tokens.get(pid, 0) + req.received - before
            if req.finish_s is None:   # waiting for a pipeline again
                streamed[rid] = (req, pid, req.received, pipeline)
            else:
                del streamed[rid]
        for pid in tokens.keys() - paths.keys():   # its requests finished since the last frame
            paths[pid] = self._paths[pid]
        return [{"id": pid, "nodes": nodes, "in_flight": in_flight.get(pid, 0),
                 "decode_tokens_per_s": _per_s(tokens.get(pid, 0), span_s)}
                for pid, nodes in paths.items()]
    # --- links -------------------------------------------------------------------------------------
    def _links(self, span_s: float) -> list[dict]:
        seen, pairs = self._link_bytes, self._link_pair
        sent = dict.fromkeys(self._region_pairs, 0.0)
        node_pairs = {pair: set(nodes) for pair, nodes in self._plan_node_pairs.items()}
        for link, (_, total) in self.sim.network.link_stats().items():
            if link not in pairs:
                ra, rb = self.spec.region_of(link[0]), self.spec.region_of(link[1])
                pairs[link] = None if ra == rb else (ra, rb)
            pair = pairs[link]
            if pair is not None:
                grew = total - seen.get(link, 0.0)
                sent[pair] = sent.get(pair, 0.0) + grew
                seen[link] = total
                if grew > 0:
                    node_pairs.setdefault(pair, set()).add(link)
        out = []
        for (ra, rb), nbytes in sent.items():
            link = self.spec.region_link(ra, rb)
            out.append({"from_region": ra, "to_region": rb, "bytes_per_s": _per_s(nbytes, span_s),
                        "node_pairs": len(node_pairs.get((ra, rb), ())),
                        "bandwidth_bytes_per_s": None if link is None else link.bandwidth_bytes_per_s})
        return out

    # --- cluster and events ------------------------------------------------------------------------
    def _cluster(self, at_s: float) -> dict:
        m = self.sim.metrics
        counts = self._counts
        counts.append((at_s, len(m.ttft_s), len(m.itl_s), m.requests_completed))
        since_s, ttft_from, itl_from, completed = counts[bisect.bisect_left(
            counts, (at_s - self.window_s,))]
        span_s = at_s - since_s
        ttft = self._percentiles(m.ttft_s, ttft_from)
        tpot = self._percentiles(m.itl_s, itl_from)
        return {"requests_per_s": _per_s(m.requests_completed - completed, span_s),
                "ttft_p50_s": ttft[0], "ttft_p99_s": ttft[1], "tpot_p50_s": tpot[0], "tpot_p99_s": tpot[1],
                "window_s": self.window_s}

    def _percentiles(self, samples: array, start: int) -> tuple[float | None, float | None]:
        """p50 and p99 of the last ``max_samples`` of ``samples[start:]`` (copied: a view would
        pin the array's size)."""
        start = max(start, len(samples) - self.max_samples)
        if len(samples) <= start:
            return None, None
        p50, p99 = np.percentile(np.frombuffer(samples[start:], dtype=np.float64), [50, 99])
        return float(p50), float(p99)

    def _events(self, at_s: float) -> list[dict]:
        """What happened before ``at_s`` (its own events have not run yet) in the last hour, oldest
        first."""
        sim, out = self.sim, []
        for f in sim.config.failures:
            out.append((f.at_s, "failure", f"{f.node} went down (declared dead {f.detect_s:g} s later)"))
            if f.down_for_s is not None:
                out.append((f.at_s + f.down_for_s, "return", f"{f.node} is back, empty"))
        for t, what, _ in sim.marks:
            if what.startswith("drain ") or what.endswith(" drained"):
                out.append((t, "drain", what))
            elif what.startswith("join "):
                out.append((t, "join", what))
            elif what.startswith("switch to "):
                out.append((t, "replan", what))
        for r in sim.replans:
            out.append((r["at_s"], "replan", f"re-plan {r['number']} ({r['cause']}): "
                        f"{'adopted' if r['adopt'] else 'kept the running plan'}, {r['moves']} moves"))
        return [{"time_s": t, "kind": kind, "detail": detail} for t, kind, detail in sorted(out)
                if at_s - EVENTS_KEEP_S <= t < at_s]


def _state(sim: Simulator, w) -> str:
    if w.down:
        return "dead" if w.detected_epoch == w.epoch else "suspect"
    if w.name in sim.draining:
        return "draining"
    return "joining" if w.name in sim.absent else "serving"


def _per_s(amount: float, span_s: float) -> float:
    """``amount`` per second over ``span_s``, to three decimals (frames are embedded in a page)."""
    return round(max(0.0, amount) / span_s, 3) if span_s > 0 else 0.0
