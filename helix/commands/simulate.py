"""``helix simulate``: replay a trace through a plan (or compare every placement x scheduler)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

import typer

from helix.core.errors import HelixUserError
from helix.core.serving import DEFAULT_STEP_TOKENS


def _summary_table(results, title: str):
    """One row per run. Offline runs get the steady state (after the fill) beside the whole run."""
    from rich.table import Table
    table = Table(title=title)
    offline = any(r.mode == "offline" for r in results)
    rates = ("decode tok/s\nwhole run", "decode tok/s\nsteady") if offline else ("decode tok/s",)
    for col in ("run", *rates, "done", "unfinished", "TTFT p50/p99 s",
                "decode s/tok mean/p99", "ITL p99 s", "preempt", "mean util"):
        table.add_column(col, justify="right" if col != "run" else "left")
    for r in results:
        util = sum(r.node_utilization.values()) / max(1, len(r.node_utilization))
        steady = r.steady_decode_throughput_tokens_per_s
        table.add_row(r.label or r.scheduler, f"{r.decode_throughput_tokens_per_s:.1f}",
                      *(() if not offline else ("-" if steady is None else f"{steady:.1f}",)),
                      str(r.requests_completed), str(r.requests_unfinished),
                      f"{_f(r.ttft.p50_s)}/{_f(r.ttft.p99_s)}",
                      f"{_f(r.request_decode_latency.mean_s)}/{_f(r.request_decode_latency.p99_s)}",
                      _f(r.inter_token_latency.p99_s), str(r.preemptions), f"{util:.2f}")
    return table


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def simulate(
    cluster: Path = typer.Argument(..., help="Cluster spec YAML."),
    plan: Optional[Path] = typer.Option(None, "--plan", help="Plan YAML from `helix plan` "
                                        "(default: plan now with --method)."),
    method: str = typer.Option("milp", "--method", help="Placement method when no --plan is given."),
    time_limit: float = typer.Option(60.0, "--time-limit", help="Planner time limit, seconds."),
    scheduler: str = typer.Option("helix", "--scheduler",
                                  help="helix | swarm | random | shortest-queue"),
    mode: str = typer.Option("offline", "--mode", help="offline (saturated: a request is admitted "
                             "whenever KV allows) | online (timed arrivals)"),
    in_order: bool = typer.Option(False, "--in-order", help="Offline: replay the trace as it is, "
                                  "in its order. Default: lengths drawn at random (with --seed) "
                                  "from the whole trace, a mix that does not drift, as helix "
                                  "plan's prediction assumes (the Azure conversation trace in "
                                  "order drifts: its requests 1,000-3,000 have prompts ~20 % "
                                  "longer than its mean)."),
    load: float = typer.Option(0.75, "--load", help="Online: arrival rate in requests/s = LOAD x "
                               "the plan's predicted request rate at saturation (helix plan's "
                               "'predicted' line); a plan without a prediction: LOAD x its max "
                               "flow / the trace's mean prompt + output tokens (max flow "
                               "overstates what the cluster serves several times)."),
    rate: Optional[float] = typer.Option(None, "--rate", help="Online: arrival rate in requests/s "
                                         "(overrides --load)."),
    trace: str = typer.Option("conv", "--trace", help="conv | code | path to an Azure-format CSV."),
    poisson: bool = typer.Option(False, "--poisson", help="Online: Poisson arrivals, lengths from "
                                 "the trace."),
    num_requests: Optional[int] = typer.Option(None, "--num-requests", help="Use N requests "
                                               "(default: as many as the trace has): offline, "
                                               "drawn from the whole trace (the first N with "
                                               "--in-order); online, the first N."),
    max_prompt: int = typer.Option(2048, "--max-prompt", help="Drop requests with longer prompts."),
    max_output: int = typer.Option(1024, "--max-output", help="Drop requests with longer outputs."),
    duration: float = typer.Option(600.0, "--duration", help="Simulated seconds (0 = until done). "
                                   "Offline, the summary reads the steady state over the run's "
                                   "second half (after the fill at its start) beside the whole run."),
    chunk_tokens: Optional[int] = typer.Option(
        None, "--chunk-tokens", help="Chunked-prefill token budget per step (0 = off: whole "
        "prompts); default: the spec's serving.chunk_tokens "
        f"({DEFAULT_STEP_TOKENS} unless the spec sets it or its prompts need more), what helix serve "
        "runs."),
    high_water: Optional[float] = typer.Option(None, "--high-water", help="KV high-water mark for "
                                               "masking (default: the spec's serving.kv_high_water)."),
    link_sharing: str = typer.Option("fifo", "--link-sharing", help="fifo: a link sends one message "
                                     "at a time (one ZeroMQ connection per peer); fair: bandwidth "
                                     "split among messages in flight."),
    seed: int = typer.Option(0, "--seed", help="Random seed (offline lengths, online arrivals, "
                             "scheduler tie-breaks): the same seed gives the same run."),
    compare_all: bool = typer.Option(False, "--compare", help="Every placement method x {helix, "
                                     "swarm, random} schedulers, one table and one plot."),
    jobs: Optional[int] = typer.Option(None, "--jobs", help="With --compare: run the simulations "
                                       "in this many processes at once (default: one per CPU this "
                                       "process may use; 1 = one after another). Same rows either way."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write PNG figures to this folder."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write the numbers as JSON here."),
    event_log: Optional[Path] = typer.Option(None, "--event-log", help="Write every processed "
                                             "event (time, type, subject) to this CSV (single run)."),
    html: Optional[Path] = typer.Option(None, "--html", help="Write the run as an HTML page (single "
                                        "run): the live view of helix serve's /dashboard replayed "
                                        "over simulated time with a slider (nodes and their state, "
                                        "pipelines, links, latencies, failures)."),
    html_every: float = typer.Option(1.0, "--html-every", help="With --html: simulated seconds "
                                     "between two frames of the page (>= 0.1; at most 5,000 frames: "
                                     "with --duration 0 the period doubles as needed)."),
    replan: bool = typer.Option(False, "--replan", help="Re-plan during the run as helix serve's "
                                "trigger would (planner.trigger): at once when a node joins "
                                "(--join: it may hold no layers in the plan) or is drained for good "
                                "(--drain), and when the completed requests' mix moves the running "
                                "placement's max flow by more than --replan-drift (polled every "
                                "minute). A "
                                "re-plan is adopted only when its gain over --horizon pays for its "
                                "moves; moved nodes that cannot hold both slices drain, then load "
                                "their layers over their link; the new plan serves once all have. "
                                "Needs --scheduler helix. Off: the plan stays."),
    replan_drift: float = typer.Option(0.15, "--replan-drift", help="With --replan: the change "
                                       "(fraction) of the running placement's max flow under the "
                                       "observed mix that makes the mix's drift a re-plan."),
    horizon: float = typer.Option(600.0, "--horizon", help="With --replan: seconds over which a "
                                  "new plan must pay for its moves."),
    hysteresis: float = typer.Option(0.05, "--hysteresis", help="With --replan: a new plan must "
                                     "beat the running one by this fraction after its moves' cost."),
    replan_time_limit: float = typer.Option(5.0, "--replan-time-limit", help="With --replan: "
                                            "planner seconds (wall) per re-plan."),
    fail: list[str] = typer.Option([], "--fail", help="NODE@T or NODE@T+DOWN: the node dies T "
                                   "simulated seconds in (and comes back empty DOWN s later); its "
                                   "requests move to other pipelines as in helix serve. Repeatable."),
    detect: float = typer.Option(0.3, "--detect", min=0.0, help="Seconds until the coordinator "
                                 "declares a failed node dead (helix serve: ~0.3 s for a killed "
                                 "process, 10 s for a frozen or cut-off one)."),
    drain: list[str] = typer.Option([], "--drain", help="NODE@T: the node is drained T simulated "
                                    "seconds in (helix drain): no new requests, its requests finish "
                                    "where they are. Repeatable; the summary gives decode tok/s "
                                    "before, while draining and after."),
    drain_move: bool = typer.Option(False, "--drain-move", help="Drained nodes' requests move to "
                                    "other pipelines at once (helix drain --move)."),
    join: list[str] = typer.Option([], "--join", help="NODE@T: a node of the plan is absent until "
                                   "T simulated seconds in, then takes requests. Repeatable."),
    tasks: int = typer.Option(0, "--tasks", min=0, help="Requests name one of N fine-tuned tasks "
                              "(LoRA terms on every projection): each step pays its tasks' terms "
                              "(cost model: bytes and kernel launches per task group). 0: the base "
                              "model only."),
    task_skew: str = typer.Option("uniform", "--task-skew", help="With --tasks: how popular each "
                                  "task is: uniform, or zipf:S (task k named in proportion to k^-S)."),
    task_rank: int = typer.Option(16, "--task-rank", help="With --tasks: the LoRA rank."),
    task_replicas: Optional[int] = typer.Option(
        None, "--task-replicas", help="With --tasks: place each task on this many of the plan's "
        "pipelines at first and move tasks from busy to idle ones as helix serve does "
        "(coordinator.task_placement); default: every node holds every task."),
) -> None:
    """Simulate serving a trace on a cluster with a plan: throughput, latencies, utilization.

    The simulator drives the live system's own scheduling objects (coordinator pipeline builder,
    worker step policy) with a simulated clock and the cost model's step times.
    """
    from rich.console import Console

    from coordinator.schedulers import SCHEDULERS
    from helix.sim import run as simrun
    from helix.sim.engine import MODES, SimConfig
    from helix.core.spec import load_cluster

    if mode not in MODES:
        raise HelixUserError(f"--mode must be one of {', '.join(MODES)}, got {mode!r}")
    if scheduler not in SCHEDULERS:
        raise HelixUserError(f"--scheduler must be one of {', '.join(SCHEDULERS)}, got {scheduler!r}")
    if in_order and mode != "offline":
        raise HelixUserError("--in-order is for --mode offline (online replays the trace's own "
                             "order and times unless --poisson)")
    if link_sharing not in ("fifo", "fair"):
        raise HelixUserError(f"--link-sharing must be fifo or fair, got {link_sharing!r}")
    if jobs is not None and not compare_all:
        raise HelixUserError("--jobs sets how many --compare runs go at once; a single run uses one "
                             "process (add --compare, or leave --jobs out)")
    if jobs is not None and jobs < 1:
        raise HelixUserError(f"--jobs must be >= 1, got {jobs}")
    _check_numbers(num_requests=num_requests, duration=duration, load=load, rate=rate,
                   chunk_tokens=chunk_tokens, high_water=high_water, max_prompt=max_prompt,
                   max_output=max_output, time_limit=time_limit)
    console = Console() if Console().is_terminal else Console(width=150)
    spec = load_cluster(cluster)
    config = SimConfig(mode=mode, duration_s=duration or None, chunk_tokens=chunk_tokens,
                       kv_high_water=high_water, seed=seed, link_sharing=link_sharing,
                       record_events=event_log is not None,
                       replan=_replan_config(replan, replan_drift, horizon, hysteresis,
                                             replan_time_limit, scheduler),
                       failures=tuple(_failure(f, detect, spec) for f in fail),
                       drains=tuple(_elastic(d, "--drain", spec, drain_move) for d in drain),
                       joins=tuple(_elastic(j, "--join", spec) for j in join),
                       tasks=_task_mix(tasks, task_skew, task_rank, task_replicas))
    opts = simrun.WorkloadOptions(trace=trace, max_prompt_tokens=max_prompt,
                                  max_output_tokens=max_output, poisson=poisson,
                                  num_requests=num_requests, load=load, rate_per_s=rate,
                                  in_order=in_order)
    # Missing or unreadable data is a one-line error before any planning starts, not after it.
    from helix.sim.workload import load_azure_trace, resolve_trace
    trace_requests = len(load_azure_trace(resolve_trace(trace), max_prompt, max_output))
    if html is not None and compare_all:
        raise HelixUserError("--html shows one run, not --compare")
    if html is not None:
        _check_html_every(html_every, duration)
    if compare_all and (drain or join or replan):
        raise HelixUserError("--drain and --join run with one plan, not with --compare (so does "
                             "--replan)")
    if compare_all:
        _run_compare(console, spec, cluster, config, opts, plan, method, time_limit, plot, json_out,
                     jobs, trace_requests)
    else:
        _run_single(console, spec, cluster, config, opts, plan, method, time_limit, scheduler, plot,
                    json_out, event_log, (html, html_every))


def _check_html_every(every_s: float, duration_s: float) -> None:
    """One line when ``--html-every`` is too short, or gives more frames than a page holds."""
    from helix.sim.live_frames import MAX_FRAMES, MIN_PERIOD_S, frame_count
    if not (math.isfinite(every_s) and every_s >= MIN_PERIOD_S):
        raise HelixUserError(f"--html-every must be >= {MIN_PERIOD_S:g} seconds and finite, got "
                             f"{every_s:g}")
    if duration_s and frame_count(duration_s, every_s) > MAX_FRAMES:
        least = duration_s / (MAX_FRAMES - 1)
        raise HelixUserError(f"--html-every {every_s:g} over --duration {duration_s:g} makes "
                             f"{frame_count(duration_s, every_s)} frames; a page holds at most "
                             f"{MAX_FRAMES}: use --html-every {math.ceil(least * 100) / 100:g} or more")


def _task_mix(tasks: int, skew: str, rank: int, replicas: int | None):
    """``--tasks`` and its options as a :class:`~helix.sim.tasks.TaskMix` (None without tasks)."""
    if not tasks:
        if skew != "uniform" or replicas is not None:
            raise HelixUserError("--task-skew and --task-replicas need --tasks N")
        return None
    from helix.core.costmodel import AdapterShape
    from helix.sim.tasks import TaskMix
    return TaskMix(tasks, skew, shape=AdapterShape(rank), replicas=replicas)


def _replan_config(on: bool, drift: float, horizon: float, hysteresis: float, time_limit: float,
                   scheduler: str):
    """``--replan`` and its options as a :class:`~helix.sim.replan.ReplanConfig` (None: off)."""
    if not on:
        return None
    if scheduler != "helix":
        raise HelixUserError(f"--replan needs --scheduler helix (re-planned flows), got {scheduler!r}")
    from helix.sim.replan import ReplanConfig
    from planner.trigger import TriggerConfig
    for name, value, ok in (("--replan-drift", drift, drift >= 0), ("--horizon", horizon, horizon > 0),
                            ("--hysteresis", hysteresis, hysteresis >= 0),
                            ("--replan-time-limit", time_limit, time_limit > 0)):
        if not (ok and math.isfinite(value)):
            bound = "> 0" if name in ("--horizon", "--replan-time-limit") else ">= 0"
            raise HelixUserError(f"{name} must be {bound} and finite, got {value:g}")
    return ReplanConfig(TriggerConfig(drift=drift, horizon_s=horizon, hysteresis=hysteresis,
                                      time_limit_s=time_limit))


def _failure(text: str, detect_s: float, spec):
    """``NODE@T`` or ``NODE@T+DOWN`` as a :class:`~helix.sim.engine.NodeFailure`."""
    from helix.sim.engine import NodeFailure
    node, _, when = text.partition("@")
    at, _, rest = when.partition("+")
    try:
        at_s = float(at)
        down_s = float(rest) if rest else None
        failure = NodeFailure(node, at_s, down_s, detect_s)
    except ValueError:
        raise HelixUserError(f"--fail {text!r}: expected NODE@SECONDS or NODE@SECONDS+DOWN_SECONDS "
                             f"(times >= 0, down time > 0)") from None
    _check_node(spec, node, f"--fail {text!r}")
    return failure


def _elastic(text: str, flag: str, spec, move: bool = False):
    """``NODE@T`` as a :class:`~helix.sim.elastic.NodeDrain` (``--drain``) or ``NodeJoin``."""
    from helix.sim.elastic import NodeDrain, NodeJoin
    node, _, when = text.partition("@")
    try:
        at_s = float(when)
        event = NodeDrain(node, at_s, move) if flag == "--drain" else NodeJoin(node, at_s)
    except ValueError:
        raise HelixUserError(f"{flag} {text!r}: expected NODE@SECONDS (time >= 0)") from None
    _check_node(spec, node, f"{flag} {text!r}")
    return event


def _check_node(spec, node: str, what: str) -> None:
    names = [n.name for n in spec.nodes]
    if node not in names:
        raise HelixUserError(f"{what}: no node {node!r} in the cluster; nodes: "
                             f"{', '.join(names[:8])}{' ...' if len(names) > 8 else ''}")


def _check_events_in_plan(config, plan) -> None:
    """Failures, drains and joins name nodes that hold layers in ``plan`` (one line otherwise)."""
    placed = {p.node for p in plan.placements if p.num_layers > 0}
    joins = () if config.replan is not None else config.joins   # re-planning gives a joiner layers
    for flag, events in (("--fail", config.failures), ("--drain", config.drains), ("--join", joins)):
        for e in events:
            if e.node not in placed:
                raise HelixUserError(f"{flag}: node {e.node!r} holds no layers in plan "
                                     f"{plan.method!r}; placed nodes: {', '.join(sorted(placed))}")


def _load_plan(spec, path: Path):
    """The plan at ``path``: refused (one line) unless made for ``spec``'s model and nodes; a
    one-line warning on stderr when made for another version of the spec."""
    from helix.core.plan import Plan
    from helix.sim.build import check_plan_matches, plan_spec_warning
    the_plan = Plan.load(path)
    check_plan_matches(spec, the_plan)
    warning = plan_spec_warning(spec, the_plan)
    if warning is not None:
        typer.echo(f"warning: {warning}", err=True)
    return the_plan


def _replay(opts, mode: str) -> str | None:
    """Which offline replay ran: ``stationary`` (lengths drawn from the whole trace) or
    ``in-order``; None online."""
    if mode != "offline":
        return None
    return "in-order" if opts.in_order else "stationary"


def _print_replay(console, opts, config, num_requests: int, results) -> None:
    """Offline: which replay ran and the steady-state window of the summary's figures."""
    if config.mode != "offline":
        return
    if opts.in_order:
        console.print(f"replay: the {opts.trace} trace in its order (--in-order), "
                      f"{num_requests:,} requests; it drifts, so the mix served is not the "
                      "trace's means that helix plan's prediction assumes", highlight=False)
    else:
        console.print(f"replay: {num_requests:,} requests, lengths drawn at random from the whole "
                      f"{opts.trace} trace (--seed {config.seed}; --in-order replays the trace as "
                      "it is)", highlight=False)
    r = next((r for r in results if r.steady_from_s is not None), None)
    if r is not None:
        console.print(f"steady: decode tok/s over {r.steady_from_s:.0f}-{r.duration_s:.0f} s, the "
                      f"run's second half; whole run: over 0-{r.duration_s:.0f} s, the fill at its "
                      "start included (every request the KV holds is admitted at t = 0 and "
                      "prefilled together)", highlight=False)
    if any(r.steady_from_s is None for r in results):
        console.print("steady: '-' where a run ran out of requests before its end (its end is a "
                      "drain) or is too short for a window; more requests (--num-requests) "
                      "or a shorter --duration gives one", highlight=False)


def _print_prediction(console, the_plan, scheduler: str, result) -> None:
    """Offline with the Helix scheduler: the plan's predicted decode tokens/s beside the run's."""
    pr = the_plan.prediction
    steady = result.steady_decode_throughput_tokens_per_s
    if result.mode != "offline" or scheduler != "helix" or pr is None or not steady:
        return
    console.print(f"helix plan predicts {pr.decode_tokens_per_s:.1f} decode tok/s at saturation for "
                  f"this plan: {(pr.decode_tokens_per_s - steady) / steady * 100:+.1f} % against "
                  f"the steady state ({steady:.1f})", highlight=False)


def _run_compare(console, spec, cluster, config, opts, plan, method, time_limit, plot, json_out,
                 jobs=None, trace_requests=0):
    from helix.sim import run as simrun
    plans = {method: _load_plan(spec, plan)} if plan is not None else {}
    methods = (method, *[m for m in simrun.COMPARE_METHODS if m != method])
    rows = simrun.compare(spec, config, opts, methods=methods, time_limit_s=time_limit,
                          plans=plans, progress=lambda s: console.log(s),
                          jobs=simrun.default_jobs() if jobs is None else jobs)
    results = [r.result for r in rows]
    console.print(_summary_table(results, f"{cluster.name} {config.mode}: placement+scheduler"))
    if config.mode == "offline":   # the trace was read (and checked) once, up front
        _print_replay(console, opts, config, opts.num_requests or trace_requests, results)
    if plot is not None:
        from helix.sim.plots import plot_compare, plot_results
        kinds = {n.name: n.label for n in spec.nodes}
        paths = [plot_compare(rows, plot), *plot_results(results, plot, kinds)]
        console.print("wrote " + ", ".join(str(p) for p in paths))
    if json_out is not None:
        json_out.write_text(json.dumps([{"method": r.method, "scheduler": r.scheduler,
                                         "max_flow_tokens_per_s": r.max_flow_tokens_per_s,
                                         **r.result.to_dict(),
                                         "offline_replay": _replay(opts, config.mode)}
                                        for r in rows], indent=1))


def _run_single(console, spec, cluster, config, opts, plan, method, time_limit, scheduler, plot,
                json_out, event_log, html):
    import dataclasses

    from helix.sim import run as simrun
    the_plan = _load_plan(spec, plan) if plan is not None else \
        simrun.make_plan(spec, method, time_limit, config.seed)
    workload = simrun.make_workload(opts, config.mode, the_plan, config.seed, config.duration_s)
    config = dataclasses.replace(config, label=f"{the_plan.method}+{scheduler}")
    _check_events_in_plan(config, the_plan)
    sim = simrun.build_simulator(spec, the_plan, workload, config, scheduler)
    html_path, every_s = html
    if html_path is not None:
        from helix.sim.live_frames import FrameRecorder
        recorder = FrameRecorder(sim, spec, the_plan, period_s=every_s)
    result = sim.run()
    console.print(_summary_table([result], f"{cluster.name} {config.mode}, plan {the_plan.method} "
                                 f"(max flow {the_plan.max_flow_tokens_per_s:.0f} tokens/s)"))
    console.print(f"simulated {result.duration_s:.0f} s in {result.wall_s:.1f} s wall "
                  f"({result.sim_s_per_wall_s:.1f} sim s / wall s, {result.events} events); "
                  f"{result.requests_arrived} arrived, {result.requests_rejected} rejected"
                  + (f", {result.requests_moved} moved to other pipelines ({result.moved_prefill_tokens} "
                     f"tokens prefilled again)" if config.failures or config.drains else ""))
    _print_replay(console, opts, config, len(workload), [result])
    if not (config.failures or config.drains or config.joins or config.replan or config.tasks):
        _print_prediction(console, the_plan, scheduler, result)   # the plan's nodes, base model
    if config.tasks is not None:
        placement = sim.placement
        console.print(f"{config.tasks.num_tasks} tasks ({config.tasks.skew}, LoRA rank "
                      f"{config.tasks.shape.rank}): " + (
                          "every node holds every task" if placement is None else
                          f"placed on {len(placement.replicas)} pipelines, {placement.rounds} "
                          f"rebalancing rounds, {placement.moves} task moves"))
    for phase in result.phases:
        rate = phase["decode_tokens_per_s"]
        console.print(f"  {phase['label']} ({phase['start_s']:.0f}-{phase['end_s']:.0f} s): "
                      f"{'-' if rate is None else f'{rate:.1f}'} decode tok/s")
    for x in result.replans:
        switched = "" if x["switched_s"] is None else \
            f", switched {x['switched_s'] - x['at_s']:.1f} s later, {x['stopped_node_s']:.0f} node-s stopped"
        console.print(f"  re-plan {x['number']} at {x['at_s']:.0f} s ({x['cause']}): "
                      f"{'ADOPT' if x['adopt'] else 'KEEP'} {x['proposal']} proposal, {x['moves']} "
                      f"moves, predicted {x['current_tokens_per_s']:.0f} -> "
                      f"{x['proposed_tokens_per_s']:.0f} tok/s, gain {x['gain_tokens']:,.0f} vs cost "
                      f"{x['cost_tokens']:,.0f} tokens{switched}", highlight=False)
    if plot is not None:
        from helix.sim.plots import plot_results
        paths = plot_results([result], plot, {n.name: n.label for n in spec.nodes})
        console.print("wrote " + ", ".join(str(p) for p in paths))
    if json_out is not None:
        json_out.write_text(json.dumps({**result.to_dict(), "offline_replay": _replay(opts, config.mode)},
                                       indent=1))
    if html_path is not None:
        from planner.live_view import render_page
        html_path.write_text(render_page(recorder.frames, f"{cluster.stem}: {config.label} "
                                         f"({config.mode}), simulated"), encoding="utf-8")
        console.print(f"wrote {html_path} ({len(recorder.frames)} frames)")
    if event_log is not None:
        with event_log.open("w") as fh:
            fh.write("time_s,event,subject\n")
            fh.writelines(f"{t:.9f},{kind},{subject}\n" for t, kind, subject in sim.event_log)


def _check_numbers(*, num_requests, duration, load, rate, chunk_tokens, high_water, max_prompt,
                   max_output, time_limit) -> None:
    """One line naming the first out-of-range option and its value (NaN and infinity included:
    a NaN duration would never stop the clock)."""
    finite = math.isfinite
    checks = (
        ("--num-requests", num_requests, num_requests is None or num_requests >= 1, ">= 1"),
        ("--duration", duration, finite(duration) and duration >= 0,
         "a finite number of seconds >= 0 (0 = until every request is done)"),
        ("--load", load, finite(load) and load > 0, "> 0 and finite"),
        ("--rate", rate, rate is None or (finite(rate) and rate > 0), "> 0 requests/s and finite"),
        ("--chunk-tokens", chunk_tokens, chunk_tokens is None or chunk_tokens >= 0, ">= 0 (0 = off)"),
        ("--high-water", high_water, high_water is None or 0 < high_water <= 1, "in (0, 1]"),
        ("--max-prompt", max_prompt, max_prompt >= 1, ">= 1 token"),
        ("--max-output", max_output, max_output >= 1, ">= 1 token"),
        ("--time-limit", time_limit, finite(time_limit) and time_limit > 0, "> 0 seconds"),
    )
    for name, value, ok, bound in checks:
        if not ok:
            raise HelixUserError(f"{name} must be {bound}, got {value:g}")


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate)
