"""The simulator's front door: pick a workload, get plans, run one simulation or a comparison.

Used by ``helix simulate`` and ``scripts/bench_sim.py``. Plans come from the planner's one verb
(``planner.plan``); this module places nothing itself.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass

from helix.core.errors import HelixUserError
from helix.core.plan import Plan
from helix.sim.build import build_simulator  # noqa: F401  (re-exported for the CLI)
from helix.sim.engine import SimConfig
from helix.sim.metrics import SimResult
from helix.sim.workload import (TraceRequest, load_azure_trace, mean_lengths, resolve_trace,
                                stationary_workload, timed_workload)
from helix.core.spec import ClusterSpec

#: Placement methods and schedulers of ``--compare`` (the paper's comparison grid).
COMPARE_METHODS = ("milp", "petals", "swarm", "separate", "uniform")
COMPARE_SCHEDULERS = ("helix", "swarm", "random")


@dataclass(frozen=True)
class WorkloadOptions:
    """Where requests come from."""

    trace: str = "conv"
    """``conv``, ``code`` (Azure 2023 traces in the shared data) or a CSV path in that format."""
    max_prompt_tokens: int = 2048
    max_output_tokens: int = 1024
    poisson: bool = False
    """Online: Poisson arrivals with lengths drawn from the trace, instead of the trace's times."""
    num_requests: int | None = None
    """Use N requests (None: as many as the trace has): offline, N drawn from the whole trace (or
    its first N with ``in_order``); online, its first N."""
    in_order: bool = False
    """Offline: replay the trace as it is, in its order, instead of lengths drawn at random from
    the whole trace (:func:`~helix.sim.workload.stationary_workload`). The trace drifts, so an
    in-order run serves another mix than the one the plan's prediction assumes."""
    load: float = 0.75
    """Online: arrival rate as a fraction of the plan's predicted request rate at saturation
    (:func:`online_rate_per_s`; plans without a prediction: of the max flow, which overstates
    what the cluster serves several times)."""
    rate_per_s: float | None = None
    """Online: explicit arrival rate (requests/s); overrides ``load``."""


def online_rate_per_s(plan: Plan, requests: tuple[TraceRequest, ...], load: float) -> float:
    """``load`` x the plan's predicted request rate at saturation (``plan.prediction``, what the
    cluster delivers inside its pipelines); for a plan without a prediction, ``load`` x max flow in
    requests/s (the flow counts prompt + output tokens of each request; it overstates what the
    cluster serves several times)."""
    if plan.prediction is not None and plan.prediction.requests_per_s > 0:
        return load * plan.prediction.requests_per_s
    mean_prompt, mean_output = mean_lengths(requests)
    if plan.max_flow_tokens_per_s <= 0:
        raise HelixUserError(f"plan {plan.method!r} has zero max flow: nothing can be served")
    return load * plan.max_flow_tokens_per_s / (mean_prompt + mean_output)


def make_workload(opts: WorkloadOptions, mode: str, plan: Plan, seed: int = 0,
                  window_s: float | None = None) -> tuple[TraceRequest, ...]:
    """The requests of one run. Offline: lengths drawn at random from the whole trace with
    ``seed`` (:func:`~helix.sim.workload.stationary_workload`), or the trace in order with
    ``opts.in_order``; online: timed at the target rate, which holds over the first ``window_s``
    simulated seconds (pass the run's duration)."""
    base = load_azure_trace(resolve_trace(opts.trace), opts.max_prompt_tokens, opts.max_output_tokens)
    # `is None`, not `or`: 0 requests (or a rate of 0) is an error, not "use the default".
    n = len(base) if opts.num_requests is None else opts.num_requests
    if n < 1:
        raise HelixUserError(f"--num-requests must be >= 1, got {n}")
    if mode == "offline":
        return base[:n] if opts.in_order else stationary_workload(base, n, seed)
    if opts.rate_per_s is None:
        if not 0 < opts.load < math.inf:
            raise HelixUserError(f"--load must be > 0 and finite, got {opts.load:g}")
        rate = online_rate_per_s(plan, base, opts.load)
    else:
        if not 0 < opts.rate_per_s < math.inf:
            raise HelixUserError(f"--rate must be > 0 requests/s and finite, got {opts.rate_per_s:g}")
        rate = opts.rate_per_s
    return timed_workload(base, n, rate, "poisson" if opts.poisson else "trace", seed, window_s)


def make_plan(spec: ClusterSpec, method: str, time_limit_s: float = 60.0, seed: int = 0) -> Plan:
    """Ask the planner's one verb (:func:`planner.plan`) for ``method``'s plan of ``spec``: the
    one ``helix plan`` gives (the highest predicted throughput, its serving limits, the step
    budget it chose for ``chunk_tokens: auto``, its flow capacities), one solver thread."""
    from planner import PlanOptions, plan
    return plan(spec, PlanOptions(method=method, time_limit_s=time_limit_s, seed=seed))


def simulate(spec: ClusterSpec, plan: Plan, workload: tuple[TraceRequest, ...], config: SimConfig,
             scheduler: str = "helix") -> SimResult:
    return build_simulator(spec, plan, workload, config, scheduler).run()


@dataclass(frozen=True)
class CompareRow:
    method: str
    scheduler: str
    max_flow_tokens_per_s: float
    result: SimResult


def default_jobs() -> int:
    """Processes ``--compare`` runs its simulations in by default: the CPUs this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:   # not on Linux
        return max(1, os.cpu_count() or 1)


def compare(spec: ClusterSpec, config: SimConfig, opts: WorkloadOptions,
            methods: Sequence[str] = COMPARE_METHODS, schedulers: Sequence[str] = COMPARE_SCHEDULERS,
            time_limit_s: float = 60.0, plans: dict[str, Plan] | None = None,
            progress: Callable[[str], None] | None = None, jobs: int = 1) -> list[CompareRow]:
    """Every method x scheduler on one workload. Online, the arrival rate comes from the first
    method's plan (Helix's by default), so every row sees the same requests.

    ``jobs`` > 1 runs the simulations in that many processes at once (each run is deterministic
    and on its own, so the rows are the same as one after another; plans are made here first).
    Rows come in grid order either way."""
    if jobs < 1:
        raise HelixUserError(f"--jobs must be >= 1, got {jobs}")
    plans = dict(plans or {})
    for m in methods:
        if m not in plans:
            if progress:
                progress(f"planning {m}")
            plans[m] = make_plan(spec, m, time_limit_s, config.seed)
    workload = make_workload(opts, config.mode, plans[methods[0]], config.seed, config.duration_s)
    grid = [(m, s, dataclasses.replace(config, label=f"{m}+{s}")) for m in methods for s in schedulers]
    results: dict[tuple[str, str], SimResult] = {}
    if jobs == 1 or len(grid) == 1:
        for m, s, cfg in grid:
            if progress:
                progress(f"simulating {m} + {s}")
            results[(m, s)] = simulate(spec, plans[m], workload, cfg, s)
    else:
        # spawn, not fork: the planner's solver may have left threads behind in this process.
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=min(jobs, len(grid)), mp_context=context) as pool:
            running = {pool.submit(simulate, spec, plans[m], workload, cfg, s): (m, s)
                       for m, s, cfg in grid}
            if progress:
                progress(f"simulating {len(grid)} runs in {min(jobs, len(grid))} processes")
            for done in as_completed(running):
                m, s = running[done]
                results[(m, s)] = done.result()
                if progress:
                    progress(f"done {m} + {s} ({len(results)}/{len(grid)})")
    return [CompareRow(m, s, plans[m].max_flow_tokens_per_s, results[(m, s)]) for m, s, _ in grid]
