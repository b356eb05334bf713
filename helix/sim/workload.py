"""Workloads for the simulator: the Azure LLM inference trace and synthetic Poisson arrivals.

A workload is a tuple of :class:`TraceRequest` in arrival order. The Azure trace (Patel et al.,
"Splitwise", ISCA'24) is a CSV with ``TIMESTAMP,ContextTokens,GeneratedTokens``; we keep requests
within the length filters (the Helix paper uses prompt <= 2048, output <= 1024), keep their order and
relative arrival times, and can rescale those times to a target rate.

Both Azure 2023 traces (conversation ``conv`` and code ``code``; public, CC-BY 4.0, cite Patel et al.,
"Splitwise", ISCA 2024) ship inside the package in a compact form (``helix/data/traces/*.csv.gz``:
arrival gaps in 100 ns ticks, gzip; made by ``scripts/pack_traces.py``), so a clone needs no data
folder. Any Azure-format CSV (optionally gzip-compressed) can be given as a path instead.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
import random
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from helix.core.errors import HelixUserError

TRACE_DIR = Path(__file__).resolve().parents[1] / "data" / "traces"
#: Short names of the traces shipped with the package.
TRACE_FILES = {"conv": "azure_llm_2023_conv.csv.gz", "code": "azure_llm_2023_code.csv.gz"}
_AZURE_COLUMNS = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"}
_PACKED_COLUMNS = {"ARRIVAL_GAP_100NS", "ContextTokens", "GeneratedTokens"}


@dataclass(frozen=True)
class TraceRequest:
    """One request of a workload."""

    arrival_s: float
    """Seconds after the first request of the workload."""
    prompt_tokens: int
    output_tokens: int
    task: str | None = None
    """The fine-tuned task it names (None: the base model; :mod:`helix.sim.tasks`)."""


def resolve_trace(ref: str) -> Path:
    """A trace short name (``conv``, ``code``) or a CSV path."""
    if ref in TRACE_FILES:
        path = TRACE_DIR / TRACE_FILES[ref]
        if not path.is_file():   # a broken install, not a user error: say where it should be
            raise HelixUserError(f"trace {ref!r}: the packaged file {path} is missing; reinstall helix-serve")
        return path
    path = Path(ref)
    if not path.is_file():
        raise HelixUserError(f"trace: no such file {ref!r} (or use one of: {', '.join(TRACE_FILES)})")
    return path


def load_azure_trace(path: str | Path, max_prompt_tokens: int = 2048,
                     max_output_tokens: int = 1024) -> tuple[TraceRequest, ...]:
    """Requests of an Azure-format CSV (or the packed form; either may be gzip-compressed) within
    the length filters, in arrival order, times from 0."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise HelixUserError(f"trace: no such file {str(path)!r}") from None
    except OSError as exc:
        raise HelixUserError(f"trace {str(path)!r}: {exc.strerror or exc}") from None
    try:
        text = gzip.decompress(raw).decode() if raw[:2] == b"\x1f\x8b" else raw.decode()
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise HelixUserError(f"trace {str(path)!r}: not a CSV or gzip-compressed CSV ({exc})") from None
    lines = (line for line in io.StringIO(text, newline="") if not line.startswith("#"))
    reader = csv.DictReader(lines)
    columns = set(reader.fieldnames or ())
    packed = _PACKED_COLUMNS <= columns
    if not packed and not _AZURE_COLUMNS <= columns:
        raise HelixUserError(f"trace {str(path)!r}: missing columns {sorted(_AZURE_COLUMNS - columns)}")
    rows: list[tuple[float, int, int]] = []
    ticks = 0
    for line, row in enumerate(reader, start=2):
        try:
            if packed:
                ticks += int(row["ARRIVAL_GAP_100NS"])
                t = ticks / 1e7
            else:
                t = datetime.fromisoformat(row["TIMESTAMP"].strip()).timestamp()
            p, o = int(row["ContextTokens"]), int(row["GeneratedTokens"])
        except (ValueError, AttributeError, TypeError) as exc:
            raise HelixUserError(f"trace {str(path)!r} line {line}: {exc}") from None
        if 1 <= p <= max_prompt_tokens and 1 <= o <= max_output_tokens:
            rows.append((t, p, o))
    if not rows:
        raise HelixUserError(f"trace {str(path)!r}: no request within prompt <= {max_prompt_tokens} "
                             f"and output <= {max_output_tokens}")
    rows.sort(key=lambda r: r[0])  # stable: equal timestamps keep file order
    t0 = rows[0][0]
    return tuple(TraceRequest(t - t0, p, o) for t, p, o in rows)


def mean_rate_per_s(requests: tuple[TraceRequest, ...]) -> float:
    """Average arrival rate over the workload's span (requests/s)."""
    span = requests[-1].arrival_s - requests[0].arrival_s
    return (len(requests) - 1) / span if span > 0 else math.inf


def rescale_to_rate(requests: tuple[TraceRequest, ...], rate_per_s: float,
                    window_s: float | None = None) -> tuple[TraceRequest, ...]:
    """Same order and relative gaps, time stretched so that ``rate_per_s`` holds over the first
    ``window_s`` seconds (the simulated or benchmarked window), else over the whole workload.

    A trace's rate drifts (the Azure conversation trace's first minutes run at about 70 % of its
    hourly mean), so stretching by the whole trace's mean rate gives a short window the wrong
    rate. With a window, the stretch puts the boundary between request n-1 and request n, where
    n = round(rate x window): exactly n requests arrive inside the window, a relative error of at
    most 0.5 / n. A workload too short to fill the window at that rate keeps the whole-span rate."""
    if not rate_per_s > 0:
        raise HelixUserError(f"arrival rate must be > 0, got {rate_per_s}")
    if math.isinf(rate_per_s):
        return tuple(replace(r, arrival_s=0.0) for r in requests)
    n = len(requests) if window_s is None else round(rate_per_s * window_s)
    if window_s is not None and 1 <= n < len(requests):
        boundary_s = (requests[n - 1].arrival_s + requests[n].arrival_s) / 2
        if boundary_s > 0:
            factor = window_s / boundary_s
            return tuple(replace(r, arrival_s=r.arrival_s * factor) for r in requests)
    current = mean_rate_per_s(requests)
    if math.isinf(current):
        return requests
    factor = current / rate_per_s
    return tuple(replace(r, arrival_s=r.arrival_s * factor) for r in requests)


def poisson_workload(rate_per_s: float, num_requests: int, seed: int = 0,
                     lengths: tuple[TraceRequest, ...] | None = None,
                     prompt_tokens: int = 763, output_tokens: int = 232) -> tuple[TraceRequest, ...]:
    """Poisson arrivals at ``rate_per_s``; lengths drawn from ``lengths`` (an empirical
    distribution, e.g. a trace) or fixed at ``prompt_tokens``/``output_tokens``."""
    if rate_per_s <= 0 or num_requests < 1:
        raise HelixUserError(f"poisson workload needs rate > 0 and >= 1 request, got "
                             f"{rate_per_s}, {num_requests}")
    rng = random.Random(seed)
    t = 0.0
    out = []
    for i in range(num_requests):
        if i:
            t += rng.expovariate(rate_per_s)
        if lengths:
            pick = lengths[rng.randrange(len(lengths))]
            out.append(TraceRequest(t, pick.prompt_tokens, pick.output_tokens))
        else:
            out.append(TraceRequest(t, prompt_tokens, output_tokens))
    return tuple(out)


def stationary_workload(requests: tuple[TraceRequest, ...], num_requests: int,
                        seed: int = 0) -> tuple[TraceRequest, ...]:
    """``num_requests`` requests, all at time 0, whose lengths are drawn at random (with
    replacement, seeded) from the whole of ``requests``: a mix that does not drift.

    An offline run replays this by default. The trace in its order drifts (the Azure conversation
    trace's requests 1,000-3,000 have prompts ~20 % longer than its mean), so a run that takes it
    in order serves a mix other than the trace's means, which the plan's prediction assumes. The
    draw is :func:`poisson_workload`'s: the same seed gives an online ``--poisson`` run's lengths."""
    drawn = poisson_workload(1.0, num_requests, seed=seed, lengths=requests)
    return tuple(replace(r, arrival_s=0.0) for r in drawn)


#: How requests are timed: the trace's own gaps (rescaled), Poisson, or evenly spaced.
ARRIVALS = ("trace", "poisson", "constant")


def timed_workload(requests: tuple[TraceRequest, ...], num_requests: int, rate_per_s: float,
                   arrivals: str = "trace", seed: int = 0,
                   window_s: float | None = None) -> tuple[TraceRequest, ...]:
    """``num_requests`` requests arriving at ``rate_per_s`` (infinite: all at time 0).

    ``trace``: the first ``num_requests`` of ``requests`` with their gaps rescaled so the rate holds
    over ``window_s`` (:func:`rescale_to_rate`); ``poisson``: exponential gaps, lengths drawn from
    ``requests`` (:func:`poisson_workload`); ``constant``: the first ``num_requests`` evenly spaced."""
    if arrivals not in ARRIVALS:
        raise HelixUserError(f"arrivals must be one of {', '.join(ARRIVALS)}, got {arrivals!r}")
    if not rate_per_s > 0:
        raise HelixUserError(f"arrival rate must be > 0 requests/s, got {rate_per_s:g}")
    if arrivals == "trace":
        return rescale_to_rate(requests[:num_requests], rate_per_s, window_s)
    if arrivals == "poisson" and not math.isinf(rate_per_s):
        return poisson_workload(rate_per_s, num_requests, seed=seed, lengths=requests)
    gap_s = 0.0 if math.isinf(rate_per_s) else 1.0 / rate_per_s
    return tuple(replace(r, arrival_s=i * gap_s) for i, r in enumerate(requests[:num_requests]))


def mean_lengths(requests: tuple[TraceRequest, ...]) -> tuple[float, float]:
    """Mean prompt and output tokens."""
    n = len(requests)
    return (sum(r.prompt_tokens for r in requests) / n, sum(r.output_tokens for r in requests) / n)
