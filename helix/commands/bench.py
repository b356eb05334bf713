"""``helix bench``: load a running OpenAI-compatible endpoint with a trace and report what it served."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Optional

import typer

from helix.core.errors import HelixUserError


def bench(
    url: str = typer.Argument("http://127.0.0.1:8000", help="The server's root URL."),
    model: Optional[str] = typer.Option(None, "--model", help="Model name (default: the first "
                                        "one the server lists)."),
    trace: str = typer.Option("conv", "--trace", help="conv | code | path to an Azure-format CSV: "
                              "prompt and output lengths (and, with --arrivals trace, times)."),
    input_len: Optional[int] = typer.Option(None, "--input-len", help="Synthetic: every prompt this "
                                            "many tokens (with --output-len; replaces --trace)."),
    output_len: Optional[int] = typer.Option(None, "--output-len", help="Synthetic: every output "
                                             "this many tokens."),
    max_prompt: int = typer.Option(2048, "--max-prompt", help="Drop trace requests with longer prompts."),
    max_output: int = typer.Option(1024, "--max-output", help="Drop trace requests with longer outputs."),
    rate: float = typer.Option(math.inf, "--rate", help="Arrival rate, requests/s (inf: all at once)."),
    arrivals: Optional[str] = typer.Option(None, "--arrivals", help="trace (the trace's own gaps, "
                                           "rescaled so --rate holds over --duration, as `helix "
                                           "simulate` does) | poisson | constant. Default: trace "
                                           "for a trace, poisson for synthetic lengths."),
    num_requests: Optional[int] = typer.Option(None, "--num-requests", help="Requests to send at "
                                               "most (default: as many as --rate brings in "
                                               "--duration, else 100)."),
    duration: float = typer.Option(0.0, "--duration", help="Stop after this many seconds, cancelling "
                                   "requests in flight (0: when every request is done)."),
    max_concurrency: int = typer.Option(0, "--max-concurrency", help="Requests in flight at most "
                                        "(0: unbounded)."),
    vocab_size: int = typer.Option(256, "--vocab-size", help="Prompt token ids are drawn from "
                                   "[0, VOCAB_SIZE): at most the model's vocabulary."),
    request_timeout: float = typer.Option(600.0, "--request-timeout", help="Seconds a request may "
                                          "stay silent before it fails."),
    seed: int = typer.Option(0, "--seed", help="Random seed (Poisson arrivals, sampled lengths): the same seed replays the same requests."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Write the numbers as JSON to this "
                                           "file ('-': stdout, and the table goes to stderr)."),
) -> int:
    """Send a trace's requests to a running endpoint (streamed /v1/completions, exact prompt and
    output lengths) and report request and token throughput, TTFT, TPOT and ITL percentiles and
    errors, in the simulator's terms. Exit status 1 when any request failed."""
    from rich.console import Console

    from helix import loadgen
    from helix.sim.workload import ARRIVALS, TraceRequest, timed_workload

    _check_numbers(num_requests=num_requests, duration=duration, rate=rate, vocab_size=vocab_size,
                   max_concurrency=max_concurrency, request_timeout=request_timeout,
                   max_prompt=max_prompt, max_output=max_output)
    synthetic = input_len is not None or output_len is not None
    if synthetic and (input_len is None or output_len is None or input_len < 1 or output_len < 1):
        raise HelixUserError("--input-len and --output-len go together, each >= 1 token")
    arrivals = arrivals or ("poisson" if synthetic else "trace")
    if arrivals not in ARRIVALS:
        raise HelixUserError(f"--arrivals must be one of {', '.join(ARRIVALS)}, got {arrivals!r}")
    if synthetic and arrivals == "trace":
        raise HelixUserError("--arrivals trace needs a trace (synthetic lengths have no times)")
    if num_requests is None:
        num_requests = _enough_requests(rate, duration)
    if synthetic:
        base = (TraceRequest(0.0, input_len, output_len),) * num_requests
    else:
        from helix.sim.workload import load_azure_trace, resolve_trace
        base = load_azure_trace(resolve_trace(trace), max_prompt, max_output)
    workload = timed_workload(base, num_requests, rate, arrivals, seed, duration or None)
    config = loadgen.BenchConfig(base_url=url, model=model, duration_s=duration or None,
                                 max_concurrency=max_concurrency or None, vocab_size=vocab_size,
                                 seed=seed, request_timeout_s=request_timeout)
    to_stdout = json_out == "-"
    console = Console(stderr=to_stdout)
    result = _run(config, workload, console)
    console.print(_table(result))
    if json_out is not None:
        text = json.dumps(result.to_dict(), indent=1)
        if to_stdout:
            sys.stdout.write(text + "\n")
        else:
            Path(json_out).write_text(text)
    if result.requests_failed:
        kinds = ", ".join(f"{k} x{n} ({result.error_examples[k]})" for k, n in result.errors.items())
        typer.secho(f"error: {result.requests_failed} of {result.requests_arrived} requests failed: "
                    f"{kinds}", err=True, fg="red")
        return 1
    return 0


def _enough_requests(rate: float, duration: float) -> int:
    """Requests that fill ``duration`` at ``rate`` with room for Poisson's spread (arrivals past
    the deadline are never sent); 100 when either is unbounded."""
    if duration and math.isfinite(rate):
        expected = rate * duration
        return max(1, math.ceil(expected + 5 * math.sqrt(expected) + 10))
    return 100


def _run(config, workload, console):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from helix import loadgen
    columns = (TextColumn("bench"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True,
                  disable=not console.is_terminal) as progress:
        task = progress.add_task("requests", total=len(workload))
        return loadgen.run_bench(config, workload,
                                 on_progress=lambda n: progress.update(task, completed=n))


def _table(r):
    from rich.table import Table
    table = Table(title=f"helix bench: {r.model} at {r.base_url}", show_header=False)
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("duration s", f"{r.duration_s:.2f}"),
        ("requests sent / completed", f"{r.requests_arrived} / {r.requests_completed}"),
        ("failed / unfinished", f"{r.requests_failed} / {r.requests_unfinished}"),
        ("request throughput req/s", f"{r.request_throughput_per_s:.3f}"),
        ("prompt tok/s", f"{r.prompt_throughput_tokens_per_s:.1f}"),
        ("decode tok/s", f"{r.decode_throughput_tokens_per_s:.1f}"),
    ]
    for name, stats in (("TTFT", r.ttft), ("TPOT", r.request_decode_latency),
                        ("ITL", r.inter_token_latency), ("E2E", r.e2e_latency)):
        rows.append((f"{name} ms mean / p50 / p90 / p99",
                     " / ".join(_ms(getattr(stats, k)) for k in ("mean_s", "p50_s", "p90_s", "p99_s"))))
    for row in rows:
        table.add_row(*row)
    return table


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{1000 * x:.1f}"


def _check_numbers(**values) -> None:
    """One line naming the first out-of-range option and its value."""
    finite = math.isfinite
    v = values
    checks = (
        ("--num-requests", v["num_requests"] is None or v["num_requests"] >= 1, ">= 1"),
        ("--duration", finite(v["duration"]) and v["duration"] >= 0, "a finite number of seconds >= 0"),
        ("--rate", v["rate"] > 0, "> 0 requests/s (inf: all at once)"),
        ("--vocab-size", v["vocab_size"] >= 1, ">= 1"),
        ("--max-concurrency", v["max_concurrency"] >= 0, ">= 0 (0: unbounded)"),
        ("--request-timeout", finite(v["request_timeout"]) and v["request_timeout"] > 0, "> 0 seconds"),
        ("--max-prompt", v["max_prompt"] >= 1, ">= 1 token"),
        ("--max-output", v["max_output"] >= 1, ">= 1 token"),
    )
    for name, ok, bound in checks:
        if not ok:
            value = v[name[2:].replace("-", "_")]
            raise HelixUserError(f"{name} must be {bound}, got {value:g}")


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
