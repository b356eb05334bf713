"""Elastic-cluster benchmark: what joins, drains and re-plans cost, and how often the
re-plan trigger fires.

Two parts, kept apart:

- **simulated** (this file's first part; ``planner.trigger`` + ``helix simulate --replan``):
  1. geo24 (LLaMA-2 70B, the planner's placement without one node), offline: the node joins, the
     trigger re-plans (adopted: the moved nodes drain or load beside, over their links, then the
     new plan serves); then a node is drained for good and the trigger re-plans without it; with
     the default 5 % margin and with none. Decode tokens/s before / during / after each event, and
     per re-plan its verdict, moves, predicted and simulated switch time (slowest load), node-
     seconds stopped (reduced service), predicted gain and cost.
  2. the Azure conversation trace's hour replayed through the trigger's windows on geo24 and
     single24 (each request counted as completed at its arrival time; polls every minute): how
     many re-plans are considered and adopted with the default band and margin (hysteresis) and
     without either.
- **live** (``--live``, :func:`live_run`): a join and a drain on a real stack (in-process workers,
  ZeroMQ, gRPC, HTTP; the tiny model on local3 planned without cpu-2): cpu-2's worker joins under a
  steady greedy load (re-plan + drain-first apply, :mod:`helix.server.elastic`), then is drained;
  decode tokens/s before / while joining / joined / drained, failed and moved requests.

    python scripts/bench_elastic.py [--no-write] [--skip-trace] [--skip-events] [--live]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

HEADING = "## Elastic clusters: joins, drains, re-plans (`scripts/bench_elastic.py`)"
POLL_S = 60.0
JOINS = "east-a100-3"
"""The node that joins geo24 (10 Gb/s from the coordinator: its 70B layers load in ~30 s; a
remote node's take ~20 min over 100 Mb/s, more than a re-plan's 10-minute horizon)."""


# --- simulated part -------------------------------------------------------------------------------
def geo24_plan(time_limit_s: float, without: str | None = None, cluster: str = "geo24"):
    """geo24 (or ``cluster``) and the planner's placement for it (``time_limit_s`` of MILP), or for
    it without the node ``without`` (the plan runs on the whole cluster; the node may join)."""
    from helix.sim import run as simrun
    from helix.core.spec import load_cluster
    from planner.trigger import respec
    spec = load_cluster(ROOT / "cluster_specs" / f"{cluster}.yaml")
    if without is None:
        return spec, simrun.make_plan(spec, "milp", time_limit_s=time_limit_s)
    smaller = respec(spec, [n for n in spec.nodes if n.name != without], spec.workload)
    return spec, simrun.make_plan(smaller, "milp", time_limit_s=time_limit_s)


def trace_replans(spec, plan, configs: dict, trace: str = "conv") -> list[dict]:
    """The trace's hour through a :class:`~planner.trigger.ReplanTrigger` per config: re-plans
    considered, adopted, layer moves, load seconds, and the predicted cost of the moves."""
    from helix.sim.workload import load_azure_trace, resolve_trace
    from planner.trigger import ReplanTrigger
    requests = load_azure_trace(resolve_trace(trace))
    end_s = requests[-1].arrival_s
    rows = []
    for label, config in configs.items():
        trigger = ReplanTrigger(spec, plan, config)
        wall0 = time.perf_counter()
        i, now = 0, POLL_S
        while now <= end_s + POLL_S:
            while i < len(requests) and requests[i].arrival_s <= now:
                trigger.observe(requests[i].arrival_s, requests[i].prompt_tokens,
                                requests[i].output_tokens)
                i += 1
            trigger.poll(now)
            now += POLL_S
        h = trigger.history
        adopted = [r for r in h if r.adopted]
        rows.append({"label": label, "considered": len(h), "adopted": len(adopted),
                     "moves": sum(len(r.decision.moves) for r in adopted),
                     "load_s": sum(m.load_s for r in adopted for m in r.decision.moves),
                     "cost_tokens": sum(r.decision.cost_tokens for r in adopted),
                     "max_drift": max((r.drift for r in h), default=0.0),
                     "wall_s": time.perf_counter() - wall0,
                     "adopted_at": [round(r.at_s) for r in adopted]})
    return rows


def trace_table(rows: list[dict], trace: str) -> str:
    head = (f"| Azure {trace} trace, 1 h, polled every {POLL_S:.0f} s | cluster | re-plans considered | "
            f"adopted (at s) | layer moves | load s (sum) | predicted cost (tokens) | largest drift "
            f"| wall s |")
    body = [f"| {r['label']} | {r['cluster']} | {r['considered']} | {r['adopted']} ({', '.join(map(str, r['adopted_at'])) or '-'}) "
            f"| {r['moves']} | {r['load_s']:.0f} | {r['cost_tokens']:,.0f} | {r['max_drift']:.0%} | "
            f"{r['wall_s']:.0f} |" for r in rows]
    return "\n".join([head, "|" + "---|" * 9, *body])


def events_view(spec, plan, time_limit_s: float, duration_s: float = 2400.0,
                join: str = JOINS, join_s: float = 300.0, drain_s: float = 1500.0) -> str:
    """The simulated join and drain with re-plans (module docstring, part 1): ``plan`` is made
    without ``join``; offline (saturated, the conversation trace in order) for ``duration_s``:
    without events, then with the join at ``join_s`` and a drain at ``drain_s`` of the busiest
    node that is not on every pipeline, re-planning (``--replan``) with the default 5 % margin
    and with none."""
    from coordinator.pipeline import Topology
    from helix.sim import run as simrun
    from helix.sim.elastic import NodeDrain, NodeJoin
    from helix.sim.engine import SimConfig
    from helix.sim.replan import ReplanConfig
    from planner.trigger import TriggerConfig
    workload = simrun.make_workload(simrun.WorkloadOptions(in_order=True), "offline", plan, 0,
                                    duration_s)
    topo = Topology.from_plan(plan)
    busiest = sorted(topo.nodes, key=lambda n: -sum(a.flow_tokens_per_s for a in plan.arc_flows
                                                       if a.src == n))
    drained = next(n for n in busiest if topo.has_path(topo.mask_of(m for m in topo.nodes if m != n)))
    events = dict(mode="offline", duration_s=duration_s, joins=(NodeJoin(join, join_s),),
                  drains=(NodeDrain(drained, drain_s),))
    runs = {"no event, no re-plan": SimConfig(mode="offline", duration_s=duration_s)}
    for flags, hysteresis in (("", 0.05), (" --hysteresis 0", 0.0)):
        runs[f"{join} joins at {join_s:.0f} s, {drained} drained at {drain_s:.0f} s, --replan"
             f"{flags}"] = SimConfig(**events, replan=ReplanConfig(TriggerConfig(
                 time_limit_s=time_limit_s, hysteresis=hysteresis)))
    lines = []
    for label, config in runs.items():
        wall0 = time.perf_counter()
        r = simrun.build_simulator(spec, plan, workload, config).run()
        tl, b = r.throughput_timeline_tokens_per_s, r.bucket_s
        lines.append(f"**{label}** ({time.perf_counter() - wall0:.0f} s wall): decode "
                     f"{r.decode_throughput_tokens_per_s:.0f} tok/s over {duration_s:.0f} s, "
                     f"{r.requests_completed} completed, {r.requests_rejected} rejected; by minute: "
                     + " ".join(f"{sum(tl[int(a / b):int((a + 60) / b)]) * b / 60:.0f}"
                                for a in range(0, int(duration_s), 60)))
        if r.phases:
            lines.append("")
            lines.append("| phase | from s | to s | decode tok/s |")
            lines.append("|---|---|---|---|")
            for p in r.phases:
                rate = p["decode_tokens_per_s"]
                lines.append(f"| {p['label']} | {p['start_s']:.0f} | {p['end_s']:.0f} | "
                             f"{'-' if rate is None else f'{rate:.0f}'} |")
        if r.replans:
            lines.append("")
            lines.append("| re-plan | at s | cause | verdict (proposal) | moves | predicted switch s | "
                         "switched after s | node-s stopped | predicted tok/s now -> new | "
                         "gain / cost (tokens) |")
            lines.append("|" + "---|" * 10)
            for x in r.replans:
                after = "-" if x["switched_s"] is None else f"{x['switched_s'] - x['at_s']:.1f}"
                lines.append(
                    f"| {x['number']} | {x['at_s']:.0f} | {x['cause']} | "
                    f"{'ADOPT' if x['adopt'] else 'KEEP'} ({x['proposal']}) | {x['moves']} | "
                    f"{x['switch_s']:.1f} | "
                    f"{after} | {x['stopped_node_s']:.0f} | {x['current_tokens_per_s']:.0f} -> "
                    f"{x['proposed_tokens_per_s']:.0f} | {x['gain_tokens']:,.0f} / "
                    f"{x['cost_tokens']:,.0f} |")
        lines.append("")
    return "\n".join(lines).rstrip()


def default_configs(time_limit_s: float) -> dict:
    from planner.trigger import TriggerConfig
    return {"band 15 %, margin 5 %, 120 s apart (default)": TriggerConfig(time_limit_s=time_limit_s),
            "no hysteresis (band 0, margin 0, no interval)":
                TriggerConfig(time_limit_s=time_limit_s, drift=0.0, hysteresis=0.0,
                              min_interval_s=0.0)}


# --- live part ------------------------------------------------------------------------------------
LIVE_JOINS = "cpu-2"
"""The node of cluster_specs/local3.yaml that joins the live stack (planned without it), then drains."""


def live_run(ckpt: Path, before_s: float, after_s: float, rate_per_s: float, max_tokens: int) -> dict:
    """One live run: the in-process stack (tests.builders.stack: real workers, ZeroMQ, gRPC, HTTP)
    on local3 less cpu-2 under a steady greedy load (bench_drain.Load); after ``before_s`` a worker
    for cpu-2 starts and joins (helix.server.elastic: re-plan, drain-first apply); ``after_s`` after
    it serves, cpu-2 is drained over ``POST /admin/drain``; ``after_s`` more. Tokens/s per phase."""
    import httpx
    from bench_drain import Load  # scripts/ is this script's import path

    from coordinator.runtime import RuntimeConfig, WorkerHandle
    from helix.server.elastic import Elastic
    from helix.core.slices import as_placement
    from helix.core.spec import load_cluster
    from tests.builders.elastic import LOCAL3, plan_without
    from tests.builders.stack import local_stack
    from worker.server import WorkerServer
    spec = load_cluster(LOCAL3)
    runtime = RuntimeConfig(stats_interval_s=0.1, request_timeout_s=120, max_waiting_requests=10_000)
    joiner = None
    try:
        with local_stack(ckpt, runtime, plan=plan_without(spec, LIVE_JOINS)) as stack:
            coord = stack.coordinator
            elastic = Elastic(coord, spec)
            t0 = time.monotonic()
            load = Load(coord, rate_per_s, max_tokens)
            time.sleep(before_s)
            join_s = time.monotonic()
            joiner = WorkerServer(LIVE_JOINS, str(ckpt), torch_threads=1)
            elastic.join(WorkerHandle(LIVE_JOINS, joiner.control.address, joiner.data.address),
                         {"gpu": "CPU"})
            while elastic.joins[LIVE_JOINS].state in ("planning", "applying"):
                time.sleep(0.02)
            serving_s = time.monotonic()
            status = elastic.joins[LIVE_JOINS]
            routed = sum(n for nodes, n in coord.pipeline_counts.items() if LIVE_JOINS in nodes)
            time.sleep(after_s)
            drain_s = time.monotonic()
            routed_after_join = sum(n for nodes, n in coord.pipeline_counts.items()
                                    if LIVE_JOINS in nodes) - routed
            httpx.post(stack.url + "/admin/drain", json={"node": LIVE_JOINS},
                       timeout=30).raise_for_status()
            drained_s = None
            while drained_s is None and time.monotonic() - drain_s < 60:
                if coord.node_status(LIVE_JOINS).state == "drained":
                    drained_s = time.monotonic()
                time.sleep(0.02)
            time.sleep(max(0.0, drain_s + after_s - time.monotonic()))
            end_s = time.monotonic()
            load.stop()
            placed = as_placement(coord.plan.placements)
            return {"join": status.state, "join_s": serving_s - join_s,
                    "placement": ", ".join(f"{n} [{a}, {b})" for n, (a, b) in sorted(placed.items())),
                    "before": load.rate(t0 + 1.0, join_s), "joining": load.rate(join_s, serving_s),
                    "joined": load.rate(serving_s, drain_s),
                    "drain_s": None if drained_s is None else drained_s - drain_s,
                    "drained": load.rate(drained_s or drain_s, end_s),
                    "routed_after_join": routed_after_join, "requests": len(load.records),
                    "failed": load.failed(), "moved": coord.requests_moved}
    finally:   # after the stack: its pollers must not see the worker go
        if joiner is not None:
            joiner.shutdown()


def live_view(args) -> str:
    """The live part's table (one run; the tiny model on this machine's CPU)."""
    import tempfile

    from helix.commands.demo_checkpoint import write_tiny_checkpoint
    with tempfile.TemporaryDirectory() as tmp:
        write_tiny_checkpoint(Path(tmp))
        r = live_run(Path(tmp), args.live_before, args.live_after, args.live_rate, args.live_tokens)
    print(r)
    drain = "-" if r["drain_s"] is None else f"{r['drain_s']:.1f}"
    return ("Live join and drain (the tiny model on local3 less cpu-2, in-process stack, "
            f"{args.live_rate:g} req/s x {args.live_tokens} greedy tokens; cpu-2 joins as a new worker "
            f"after {args.live_before:g} s, is drained {args.live_after:g} s after it serves). Decode "
            "tokens/s per phase:\n\n"
            "| join | joined after s | before | joining | joined | drained after s | drained | "
            "requests via cpu-2 once joined | requests | failed | moved |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|\n"
            f"| {r['join']} | {r['join_s']:.1f} | {r['before']:.0f} | {r['joining']:.0f} | "
            f"{r['joined']:.0f} | {drain} | {r['drained']:.0f} | {r['routed_after_join']} | "
            f"{r['requests']} | {r['failed']} | {r['moved']} |\n\n"
            f"Placement after the join: {r['placement']}.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=5.0,
                    help="planner seconds per re-plan (and 4x that for the first plan)")
    ap.add_argument("--skip-trace", action="store_true", help="skip the trace-hour count")
    ap.add_argument("--clusters", nargs="+", default=["geo24", "single24"],
                    help="cluster_specs/ names for the trace-hour count")
    ap.add_argument("--skip-events", action="store_true", help="skip the simulated join / drain")
    ap.add_argument("--live", action="store_true", help="also run the live part")
    ap.add_argument("--no-write", action="store_true", help="do not write BENCHMARKS.md")
    ap.add_argument("--live-rate", type=float, default=8.0, help="--live: requests per second")
    ap.add_argument("--live-tokens", type=int, default=32, help="--live: greedy tokens per request")
    ap.add_argument("--live-before", type=float, default=6.0, help="--live: seconds before the join")
    ap.add_argument("--live-after", type=float, default=8.0,
                    help="--live: seconds after the join serves, and after the drain")
    args = ap.parse_args()
    load0 = os.getloadavg()[0]
    parts = {}
    if not args.skip_events:
        spec, plan = geo24_plan(4 * args.time_limit, without=JOINS)
        table = events_view(spec, plan, args.time_limit, join=JOINS)
        if table:
            print(table)
            parts["events"] = ("Simulated join and drain with re-plans (geo24, `helix simulate "
                               "--replan`):\n\n" + table)
    if not args.skip_trace:
        rows = []
        for cluster in args.clusters:
            spec, plan = geo24_plan(4 * args.time_limit, cluster=cluster)
            rows += [{**r, "cluster": cluster}
                     for r in trace_replans(spec, plan, default_configs(args.time_limit))]
        table = trace_table(rows, "conv")
        print(table)
        parts["trace"] = "The trigger on the trace's hour (`planner.trigger`):\n\n" + table
    if args.live:
        parts["live"] = live_view(args)
    if not args.no_write and parts:
        flags = " ".join(f for f, on in (("--skip-trace", args.skip_trace),
                                         ("--skip-events", args.skip_events),
                                         ("--live", args.live)) if on)
        from benchdoc import write_section  # scripts/: the import path
        cmd = f"python scripts/bench_elastic.py --time-limit {args.time_limit:g}{' ' + flags if flags else ''}"
        for part, text in parts.items():
            write_section(f"bench_elastic-{part}", text, heading=HEADING, command=cmd, load0=load0)


if __name__ == "__main__":
    main()
