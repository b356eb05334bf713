"""What a simulation measured: throughput, latencies, utilization — collected without history.

Latency samples are kept as flat float arrays (8 bytes each: one per request for TTFT, one per
decode token for inter-token latency), the throughput timeline as one counter per time bucket;
nothing per event. :class:`SimResult` is the frozen summary written by ``--json``.
"""

from __future__ import annotations

import dataclasses
import math
from array import array
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class LatencyStats:
    """Mean and percentiles of a latency sample, seconds (all None for an empty sample)."""

    count: int
    mean_s: float | None
    p50_s: float | None
    p90_s: float | None
    p95_s: float | None
    p99_s: float | None

    @classmethod
    def of(cls, samples: array) -> "LatencyStats":
        """Summary of a flat ``array('d')`` of seconds (``helix bench`` summarizes its own samples
        with it too, so the simulator's and the live figures are computed alike)."""
        if len(samples) == 0:
            return cls(0, None, None, None, None, None)
        x = np.frombuffer(samples, dtype=np.float64)
        p50, p90, p95, p99 = np.percentile(x, [50, 90, 95, 99])
        return cls(len(x), float(x.mean()), float(p50), float(p90), float(p95), float(p99))


class MetricsCollector:
    """Counters and flat sample arrays, fed by the simulator as tokens reach the coordinator."""

    def __init__(self, bucket_s: float = 1.0) -> None:
        self.bucket_s = bucket_s
        self.ttft_s = array("d")
        """Arrival to first token at the coordinator, one per request that got one."""
        self.itl_s = array("d")
        """Gap between consecutive tokens of a request at the coordinator, one per decode token."""
        self.request_decode_s = array("d")
        """Per finished request: mean time per output token after the first."""
        self.tokens_per_bucket = array("q")
        self.tokens_generated = 0
        self.prompt_tokens_admitted = 0
        self.requests_completed = 0
        self.tokens_requested_completed = 0
        self.tokens_generated_completed = 0

    def on_token(self, now_s: float, first: bool, since_s: float) -> None:
        """A token arrived at ``now_s``; ``since_s`` is the arrival (first) or previous token time."""
        (self.ttft_s if first else self.itl_s).append(now_s - since_s)
        self.tokens_generated += 1
        b = int(now_s / self.bucket_s)
        buckets = self.tokens_per_bucket
        if b >= len(buckets):
            buckets.extend([0] * (b + 1 - len(buckets)))
        buckets[b] += 1

    def on_finish(self, output_tokens: int, received: int, first_token_s: float,
                  last_token_s: float) -> None:
        self.requests_completed += 1
        self.tokens_requested_completed += output_tokens
        self.tokens_generated_completed += received
        if received > 1:
            self.request_decode_s.append((last_token_s - first_token_s) / (received - 1))


#: An offline run's steady state is read from this fraction of its duration on. Offline, every
#: request the KV holds is admitted at t = 0 and their prompts are prefilled together: the first
#: minutes are this fill (~120 s at half rate on hetero42), not the saturated state that
#: ``helix plan``'s prediction describes. The fill has a wake too: the requests still running
#: from it are the long ones, their KV grows and fewer fit until they finish (up to the longest
#: request's stay), so a short run's second half holds some of it (single24: a ~10 % dip over
#: ~80 s of a 600 s run's second half).
STEADY_FROM = 0.5


def steady_window_start_s(duration_s: float, bucket_s: float,
                          from_fraction: float = STEADY_FROM) -> float:
    """Where the steady-state window of a run of ``duration_s`` starts: the first bucket edge at
    or after ``from_fraction`` of it."""
    return math.ceil(from_fraction * duration_s / bucket_s) * bucket_s


def steady_decode_tokens_per_s(timeline_tokens_per_s, bucket_s: float, duration_s: float,
                               from_fraction: float = STEADY_FROM) -> float | None:
    """Decode tokens/s of a run from :func:`steady_window_start_s` to its end (buckets after the
    last token are absent from the timeline: they count as zeros). None: no whole bucket there."""
    start_s = steady_window_start_s(duration_s, bucket_s, from_fraction)
    if start_s >= duration_s:
        return None
    first = round(start_s / bucket_s)
    return sum(timeline_tokens_per_s[first:]) * bucket_s / (duration_s - start_s)


@dataclass(frozen=True)
class SimResult:
    """Summary of one simulation run (``to_dict`` is what ``--json`` writes)."""

    label: str
    mode: str
    scheduler: str
    duration_s: float
    """Simulated seconds covered."""
    decode_throughput_tokens_per_s: float
    """Over the whole run (offline: the fill at its start included)."""
    steady_decode_throughput_tokens_per_s: float | None
    """Offline: over the run's steady state, from ``steady_from_s`` to its end (after the fill;
    :func:`steady_decode_tokens_per_s`), the figure ``helix plan``'s prediction describes. None
    online, for a run too short to have a whole bucket there, or for one that ran out of requests
    before its end (its end is a drain, not a steady state)."""
    steady_from_s: float | None
    """Where that window starts (None with it)."""
    requests_arrived: int
    requests_admitted: int
    requests_completed: int
    requests_unfinished: int
    requests_rejected: int
    """Requests that could never fit a pipeline's KV (refused, as the live API would)."""
    tokens_generated: int
    tokens_requested_completed: int
    tokens_generated_completed: int
    preemptions: int
    ttft: LatencyStats
    inter_token_latency: LatencyStats
    request_decode_latency: LatencyStats
    """Per request: mean seconds per output token after the first (the paper's decode latency)."""
    node_utilization: dict[str, float]
    """Busy fraction of each node's compute over the run."""
    link_utilization: dict[str, float]
    """Busy fraction of each used link (``src->dst``)."""
    throughput_timeline_tokens_per_s: tuple[float, ...]
    bucket_s: float
    wall_s: float
    events: int
    requests_moved: int = 0
    """Requests moved to another pipeline because theirs lost a node (``SimConfig.failures``)."""
    moved_prefill_tokens: int = 0
    """Tokens prefilled again for them."""
    phases: tuple[dict, ...] = ()
    """With drains or joins (``SimConfig.drains`` / ``joins``): decode throughput between the
    run's marks (a drain, a drained node empty, a join), each ``{"label", "start_s", "end_s",
    "decode_tokens_per_s"}``; empty otherwise."""
    node_requests: dict[str, int] = field(default_factory=dict)
    """Requests given a pipeline through each node (a moved request counts again)."""
    replans: tuple[dict, ...] = ()
    """With ``SimConfig.replan``: every re-plan the trigger considered
    (:meth:`planner.trigger.Replan.summary`, its number, the nodes moved, when the switch happened
    and the node-seconds stopped, :mod:`helix.sim.replan`)."""
    samples: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """Raw latency samples for plots (not written to JSON)."""

    @property
    def sim_s_per_wall_s(self) -> float:
        return self.duration_s / self.wall_s if self.wall_s > 0 else float("inf")

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "samples"}
        for key in ("ttft", "inter_token_latency", "request_decode_latency"):
            d[key] = dataclasses.asdict(d[key])
        d["throughput_timeline_tokens_per_s"] = list(self.throughput_timeline_tokens_per_s)
        d["phases"] = list(self.phases)
        d["replans"] = list(self.replans)
        d["sim_s_per_wall_s"] = self.sim_s_per_wall_s
        return d
