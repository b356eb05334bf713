"""``helix plan CLUSTER``: where every layer lives, the tokens/s it serves, and how far from the best.

Prints a table (or ``--json``), writes ``-o plan.yaml``, draws ``--draw plan.png``, and with
``--compare`` runs every method on the cluster and prints one table. ``--time-limit`` bounds the
whole command, from reading the spec to the printed plan (:class:`planner.deadline.Deadline`);
each phase of planning says on stderr when it starts (unless ``--quiet``), and while the MILP runs
on a terminal, a live line there shows elapsed time, incumbent, bound and gap. The summary keeps
apart what the max-flow search proved (its placement's flow, bound, gap and status) and the
placement chosen on predicted throughput (which, and why).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    app.command("plan")(plan_command)


def plan_command(
    cluster: Path = typer.Argument(..., help="Cluster spec (YAML)."),
    method: str = typer.Option("milp", "--method", "-m",
                               help="milp | milp-paper | petals | swarm | separate | uniform"),
    solver: str = typer.Option("highs", help="MILP solver: highs | gurobi (falls back to HiGHS)."),
    time_limit: float = typer.Option(
        60.0, "--time-limit", help="Seconds for the whole command: search, candidate scoring, "
        "prediction (each phase gets a share, the best found so far is kept)."),
    gap: float = typer.Option(0.01, "--gap", help="Stop when the proven gap is within this (0.01 = 1 %)."),
    threads: int = typer.Option(0, "--threads", help="Solver threads (0 = all cores)."),
    seed: int = typer.Option(0, "--seed", help="Random seed (solver and heuristics)."),
    max_depth: Optional[int] = typer.Option(None, "--max-depth",
                                            help="Most nodes a request passes (trades throughput for latency)."),
    no_partial: bool = typer.Option(False, "--no-partial-inference",
                                    help="Stages must meet exactly (no overlapping ranges)."),
    model: Optional[str] = typer.Option(None, "--model", help="Catalog name, checkpoint folder or GGUF file."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Write plan.yaml here."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
    draw: Optional[Path] = typer.Option(
        None, "--draw", help="Draw the plan: .png, .svg or .pdf (a chart), .html (interactive: hover "
        "a node for its GPU, layers, flow and KV capacity)."),
    compare: bool = typer.Option(False, "--compare", help="Run every method and compare."),
    start_from: Optional[Path] = typer.Option(
        None, "--from", help="An existing placement to evaluate and improve on: a plan.yaml, or a "
        "reference *_sol.ini layout (node i = the cluster's i-th node). With a plan.yaml this is "
        "also a re-plan dry run: nodes that left are dropped, and the proposed moves (layers each "
        "node loads, seconds over its link) are weighed against the gain over --horizon."),
    horizon: float = typer.Option(600.0, "--horizon",
                                  help="With --from: seconds over which moving layers must pay off."),
    hysteresis: float = typer.Option(
        0.05, "--hysteresis", help="With --from: a new placement must beat the running one by this "
        "fraction after paying for its moves (0.05 = 5 %), so near-equal plans never alternate."),
    quiet: bool = typer.Option(False, "--quiet", "-q",
                               help="No progress lines on stderr (which phase runs)."),
) -> None:
    """Place the model's layers on the cluster by max flow (MILP with a proven bound), keeping the
    placement predicted to serve users the most (a capped-KV re-solve, Swarm's placement and
    one-copy chains of one-kind stages that keep the most KV are candidates)."""
    started_s = time.perf_counter()   # the time limit counts from here
    from rich.console import Console

    import planner
    from helix.core.errors import HelixUserError
    from helix.core.models import resolve_model
    from helix.core.spec import load_cluster
    from planner import METHODS, PlanOptions, predicted
    from planner.build import build_problem
    from planner.deadline import Deadline

    logging.basicConfig(level=logging.WARNING, format="warning: %(message)s")
    # Bad options fail now, in one line, not after a minute of solving.
    options = PlanOptions(method=method, solver=solver, time_limit_s=time_limit, gap=gap,
                          threads=threads or (os.cpu_count() or 1), seed=seed, max_depth=max_depth,
                          partial_inference=not no_partial)
    _check_output_path(output, "-o")
    _check_output_path(draw, "--draw", suffix=(".png", ".svg", ".pdf", ".html"))
    spec = load_cluster(cluster)
    chosen = resolve_model(model, base_dir=cluster.parent) if model else None
    options = options.replace(model=chosen)
    problem = build_problem(spec, chosen)
    console = Console(stderr=as_json)
    # Progress goes to stderr, so --json's stdout stays the plan alone.
    err = Console(stderr=True)
    deadline = Deadline(started_s, time_limit, None if quiet else _phase_line(err, time_limit))
    if horizon <= 0 or hysteresis < 0:
        raise HelixUserError(f"--horizon must be > 0 and --hysteresis >= 0, got {horizon:g} and "
                             f"{hysteresis:g}")
    dropped: tuple[str, ...] = ()
    if start_from is not None:
        start, dropped = _evaluate_start(console, problem, start_from, method, compare,
                                         partial=options.partial)
        options = options.replace(start=start)
    if compare:
        # Every method's search and choice (planner.predicted), side by side.
        plans = [_run(err, options.replace(method=m),
                      lambda o: predicted.choose(spec, o, problem=problem)) for m in METHODS]
        if as_json:
            print(json.dumps([p.to_dict() if p else None for p in plans], indent=1))
        else:
            # Ten columns: wider than 80 characters rather than cut.
            Console(width=max(console.width, 110)).print(_compare_table(problem, METHODS, plans))
        return
    # The planner's one verb: search, prediction, choice, serving limits, step budget, flow
    # capacities (helix serve re-solves the flow with them when nodes die).
    plan = _run(err, options, lambda o: planner.plan(spec, o, problem=problem, deadline=deadline),
                must=True)
    decision = None
    if start_from is not None and start_from.suffix.lower() != ".ini":
        from planner import replan
        from planner.planning import ready
        running = ready(spec, predicted.evaluate(spec, options.start, model=chosen, problem=problem,
                                                 partial_inference=options.partial,
                                                 source="running"), problem, chosen)
        decision = replan.decide(spec, problem, running, plan, horizon_s=horizon,
                                 hysteresis=hysteresis, dropped_nodes=dropped)
        plan = dataclasses.replace(plan, extras={**plan.extras, "replan": decision.to_dict()})
    to_write = plan
    if decision is not None and not decision.adopt:
        # KEEP: -o gets the placement to keep running (the proposal stays in --json / the table).
        to_write = dataclasses.replace(running, extras={**running.extras,
                                                        "replan": decision.to_dict()})
    if output is not None:
        to_write.save(output)
    if draw is not None:
        from planner.draw import draw_plan
        draw_plan(plan, problem, draw)
    if as_json:
        print(json.dumps(plan.to_dict(), indent=1))
    else:
        console.print(_placement_table(problem, plan))
        console.print(_summary(plan), soft_wrap=True)
        console.print(_serving_line(plan))
        if decision is not None:
            _print_replan(console, decision)
        if output is not None:
            kept = to_write is not plan
            console.print(f"wrote {output}" + (" (the running placement: the verdict is KEEP)"
                                               if kept else ""))


def _evaluate_start(console, problem, path: Path, method: str, compare: bool, partial: bool):
    """The placement in ``path`` on the cluster as it is (nodes that left dropped, and named), and
    those nodes; prints its max flow."""
    from planner import METHODS, max_flow
    from planner.layout import load_running
    placement, dropped = load_running(path, problem)
    if dropped:
        one = len(dropped) == 1
        console.print(f"{path}: {', '.join(dropped)} {'is' if one else 'are'} no longer in the "
                      f"cluster: {'its' if one else 'their'} layers are dropped", soft_wrap=True,
                      highlight=False)
    flow = max_flow(problem, placement, partial).value_tokens_per_s
    console.print(f"{path}: {len(placement)} nodes hold layers; max flow {flow:,.1f} tokens/s "
                  f"on this cluster", soft_wrap=True, highlight=False)
    if not compare and method in METHODS and not method.startswith("milp"):
        console.print(f"({method} is a baseline heuristic: it does not start from this placement)",
                      soft_wrap=True, highlight=False)
    return placement, dropped


def _print_replan(console, d) -> None:
    """The re-plan dry run: the moves the proposal needs and whether it pays for them."""
    from rich.table import Table
    from helix.core.units import format_size

    def rng(r):
        return "-" if r is None else f"[{r[0]}, {r[1]})"
    if d.moves:
        t = Table(title=f"re-plan: {len(d.moves)} node{'s' if len(d.moves) != 1 else ''} change "
                  f"their layers (switch after {d.switch_s:.1f} s)")
        for col in ("node", "now", "proposed", "loads", "seconds", "meanwhile"):
            t.add_column(col, justify="right" if col in ("loads", "seconds") else "left")
        for m in d.moves:
            t.add_row(m.node, rng(m.old), rng(m.new), format_size(m.load_bytes), f"{m.load_s:.1f}",
                      "joins" if m.old is None else "serves its old layers" if m.beside
                      else "stops serving")
        console.print(t)
    verdict = "ADOPT" if d.adopt else "KEEP the running placement"
    console.print(f"re-plan    running {d.current_tokens_per_s:,.1f} -> proposed "
                  f"{d.proposed_tokens_per_s:,.1f} tokens/s (predicted): {verdict}: {d.reason}",
                  soft_wrap=True, highlight=False)


def _check_output_path(path: Optional[Path], option: str,
                       suffix: Optional[tuple[str, ...]] = None) -> None:
    """Raise :class:`HelixUserError` unless ``path`` can be written (its folder exists)."""
    from helix.core.errors import HelixUserError
    if path is None:
        return
    if suffix is not None and path.suffix.lower() not in suffix:
        raise HelixUserError(f"{option} {path}: the file name must end in {' or '.join(suffix)}")
    if path.is_dir():
        raise HelixUserError(f"{option} {path}: is a folder; give a file name")
    parent = path.parent
    if not parent.is_dir():
        raise HelixUserError(f"{option} {path}: folder {parent} does not exist")


def _phase_line(err, time_limit_s: float):
    """The progress line each phase of planning prints as it starts (stderr)."""
    def line(phase: str, elapsed_s: float) -> None:
        err.print(f"plan {elapsed_s:6.1f} s of {time_limit_s:g}  {phase}", soft_wrap=True,
                  highlight=False)
    return line


def _run(console, options, make, must=False):
    """``make(options)``, with the live progress line on ``console`` (stderr) when it is a
    terminal; an infeasible method is a yellow line and None unless ``must``."""
    from helix.core.errors import InfeasibleError
    progress = _progress(console, options.method) if console.is_terminal else None
    try:
        if progress is None:
            return make(options)
        with progress as p:
            return make(options.replace(progress=p.update))
    except InfeasibleError as exc:
        if must:
            raise
        console.print(f"[yellow]{options.method}: {exc}[/yellow]")
        return None


class _progress:
    """A transient status line: elapsed, incumbent, bound, gap."""

    def __init__(self, console, method: str):
        self.console, self.method, self.status = console, method, None

    def __enter__(self):
        self.status = self.console.status(f"{self.method}: starting")
        self.status.__enter__()
        return self

    def __exit__(self, *exc):
        self.status.__exit__(*exc)

    def update(self, elapsed_s: float, incumbent: float, bound: float) -> None:
        gap = (bound - incumbent) / incumbent * 100 if incumbent and incumbent > 0 else float("inf")
        self.status.update(f"{self.method}: {elapsed_s:6.1f} s  incumbent {incumbent:,.1f}  "
                           f"bound {bound:,.1f} tokens/s  gap {gap:.2f} %")


def _placement_table(problem, plan):
    from rich.table import Table
    flows = {}
    for a in plan.arc_flows:
        if a.dst != "coordinator":
            flows[a.dst] = flows.get(a.dst, 0.0) + a.flow_tokens_per_s
    t = Table(title=f"{plan.model} on {len(problem.nodes)} nodes ({plan.method})")
    for col in ("node", "gpu", "region", "layers", "k", "tokens/s", "use"):
        t.add_column(col, justify="right" if col in ("k", "tokens/s", "use") else "left")
    for p in plan.placements:
        n = problem.node(p.node)
        f = flows.get(p.node, 0.0)
        cap = n.throughput(p.num_layers)
        t.add_row(p.node, n.gpu, n.region or "-", f"[{p.start}, {p.end})", str(p.num_layers),
                  f"{f:,.1f}", f"{f / cap:.0%}" if cap else "-")
    found = _search(plan)
    for name in () if found is None else found.unused_nodes:
        n = problem.node(name)
        t.add_row(name, n.gpu, n.region or "-", "unused", "0", "0", "-")
    return t


def _serving_line(plan) -> str:
    """What `helix serve` will run the workers with (the plan's serving section)."""
    s = plan.serving
    pools = sorted(s.kv_capacity_tokens.values())
    return (f"serving    {s.dtype}, {s.max_batch_seqs} seqs/step, KV {pools[0]:,}-{pools[-1]:,} "
            f"tokens a node, high-water {s.kv_high_water:g}")


def _result(plan):
    """What the max-flow search proved about its own placement: (max flow, bound, gap, status,
    found by), from ``extras['max_flow_result']`` (the plan's own fields in a plan without it)."""
    r, found = _choice(plan).max_flow_result, _search(plan)
    if r is not None:
        return (r["max_flow_tokens_per_s"], r["bound_tokens_per_s"], r["gap"], r["status"],
                r["found_by"])
    return (plan.max_flow_tokens_per_s, plan.upper_bound_tokens_per_s, plan.gap,
            "heuristic" if found is None else found.status,
            None if found is None else found.found_by)


def _fmt_gap(plan) -> str:
    """The max-flow placement's gap (a candidate chosen over it has less max flow by design)."""
    gap = _result(plan)[2]
    return "-" if gap is None else f"{gap * 100:.2f} %"


def _search(plan):
    """What the search found and proved (:class:`planner.SearchReport`; None: not searched)."""
    from planner import SearchReport
    return SearchReport.of(plan)


def _choice(plan):
    """What the outer loop chose (:class:`planner.report.ChoiceReport`)."""
    from planner.report import ChoiceReport
    return ChoiceReport.of(plan)


def _bound_label(plan) -> str:
    """How far the bound reaches: every placement, or only those --max-depth allows."""
    found = _search(plan)
    scope = None if found is None else found.bound_scope
    label = "proven" if scope is None else f"proven only for {scope}"
    return label if found is None else f"{label}; {found.bound_source.replace('_', ' ')} bound"


def _prediction_lines(plan) -> list[str]:
    """What users get (planner.prediction), beside the max flow of the inner model."""
    pr = plan.prediction
    if pr is None:
        return []
    routing = _choice(plan).routing
    ttft = "-" if pr.ttft_p50_s is None else f"{pr.ttft_p50_s:.2f} s"
    tpot = "-" if pr.tpot_p50_s is None else f"{pr.tpot_p50_s * 1e3:.0f} ms"
    return [f"predicted  {pr.prompt_decode_tokens_per_s:,.1f} tokens/s prompt + decode, "
            f"{pr.decode_tokens_per_s:,.1f} decode tokens/s at saturation "
            f"({pr.requests_in_flight:.0f} requests in flight, {pr.pipelines} "
            f"pipeline{'' if pr.pipelines == 1 else 's'}"
            + (f"; routing: {routing}" if routing else "") + ")",
            f"           at {pr.online_load:.0%} of that (Poisson): TTFT p50 {ttft}, "
            f"time per output token p50 {tpot}"]


def _summary(plan) -> str:
    """Two parts: what the max-flow search proved about its placement (max flow, bound, gap,
    status), then the placement chosen on predicted throughput (which, why, what users get)."""
    found, choice = _search(plan), _choice(plan)
    depth_max, depth_mean, latency_s = (None, None, 0) if found is None else \
        (found.depth_max, found.depth_mean, found.latency_mean_s)
    flow, bound, _, status, found_by = _result(plan)
    lines = [f"max flow   {flow:,.1f} tokens/s (node capacities: {choice.capacities}); the "
             f"max-flow placement, found by the {found_by} method",
             f"bound      {'-' if bound is None else f'{bound:,.1f}'} tokens/s ({_bound_label(plan)})"
             f"   gap {_fmt_gap(plan)}",
             f"solver     {plan.solver or '-'} ({status}), {plan.solve_seconds:.1f} s in all",
             *_chosen_line(plan, choice), *_prediction_lines(plan),
             f"depth      {depth_max} nodes max, {depth_mean} mean per pipeline;  "
             f"{latency_s * 1e3:.1f} ms for a token to cross a pipeline (mean)",
             *_caution_line(plan), *_budget_line(choice), *_regions_line(plan)]
    return "\n".join(lines)


def _regions_line(plan) -> list[str]:
    """Where the planner took the regions from the links instead of the spec's labels."""
    from planner.link_regions import summary
    found = plan.extras.get("regions")
    return [] if found is None else [f"regions    {summary(found)}"]


def _caution_line(plan) -> list[str]:
    """Where the plan's step budget lies outside those the prediction is checked at."""
    if plan.prediction is None or plan.serving is None:
        return []
    note = unchecked_budget_note(plan.serving.chunk_tokens)
    return [] if note is None else [f"caution    {note}"]


def unchecked_budget_note(chunk_tokens: int) -> str | None:
    """One line for a plan whose step budget lies outside the prediction's
    :data:`~helix.core.serving.CHECKED_STEP_BUDGETS` (None inside them)."""
    from helix.core.serving import CHECKED_STEP_BUDGETS, DEFAULT_STEP_TOKENS
    if chunk_tokens in CHECKED_STEP_BUDGETS:
        return None
    at = "with chunking off" if chunk_tokens == 0 else f"at a step budget of {chunk_tokens:,}"
    return (f"{at} this prediction is unchecked: it holds within 15 % of `helix simulate` at "
            f"{' and '.join(map(str, CHECKED_STEP_BUDGETS))} tokens; elsewhere it has erred by up to "
            f"24 % on decode tokens/s and 42 % on TPOT (BENCHMARKS.md); check the plan with "
            f"`helix simulate` or plan at the default ({DEFAULT_STEP_TOKENS})")


def _budget_line(choice) -> list[str]:
    """When the planner chose the step budget (serving.chunk_tokens: auto, planner.budget)."""
    if choice.chunk_tokens_chosen is None:
        return []
    each = ", ".join(f"{c}: {v:,.1f}" for c, v in choice.chunk_tokens_predicted.items())
    return [f"step budget {choice.chunk_tokens_chosen} tokens (chunk_tokens: auto), the most "
            f"predicted decode tokens/s of {each}"]


def _chosen_line(plan, choice) -> list[str]:
    """The placement the plan serves, chosen on predicted throughput, and why
    (planner.predicted.choice)."""
    c = choice.choice
    if c is None:
        return []
    if c["placement"] == "max flow":
        return [f"chosen     the max-flow placement: {c['reason']}"]
    return [f"chosen     {c['placement']}, by the prediction: {c['reason']}; its own max flow "
            f"{plan.max_flow_tokens_per_s:,.1f} tokens/s"]


def _compare_table(problem, methods, plans):
    from rich.table import Table
    found = [None if p is None else _search(p) for p in plans]
    scopes = {f.bound_scope for f in found if f is not None and f.bound_scope}
    t = Table(title=f"{problem.model} on {len(problem.nodes)} nodes: every method (predicted, "
              "decode: tokens/s at saturation; TTFT, TPOT: p50 s at 75 % of it)",
              caption="".join(f"* bound only for {s}" for s in sorted(scopes)) or None)
    # predicted: prompt + decode tokens/s at saturation, decode: its decode part; TTFT and TPOT:
    # p50 seconds at 75 % of it (planner.prediction); max flow and bound: the inner flow model.
    cols = ("method", "predicted", "decode", "TTFT", "TPOT", "max flow", "bound", "gap", "status",
            "s")
    for col in cols:
        t.add_column(col, justify="left" if col == "method" else "right")
    for m, p, f in zip(methods, plans, found):
        if p is None:
            t.add_row(m, "infeasible", *["-"] * (len(cols) - 2))
            continue
        bound = p.upper_bound_tokens_per_s
        mark = "*" if f is not None and f.bound_scope else ""
        pr = p.prediction
        predicted = ["-"] * 4 if pr is None else [
            f"{pr.prompt_decode_tokens_per_s:.0f}", f"{pr.decode_tokens_per_s:.0f}",
            "-" if pr.ttft_p50_s is None else f"{pr.ttft_p50_s:.2f}",
            "-" if pr.tpot_p50_s is None else f"{pr.tpot_p50_s:.3f}"]
        t.add_row(m, *predicted, f"{p.max_flow_tokens_per_s:.0f}",
                  "-" if bound is None else f"{bound:.0f}{mark}", _fmt_gap(p),
                  _result(p)[3], f"{p.solve_seconds:.1f}")
    return t
