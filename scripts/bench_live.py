"""Live system vs simulator on this machine: a random-weight LLaMA
(``small-llama``: 8 layers, hidden 512) profiled with ``helix profile`` (one thread per pinned
core, as the workers run), planned on ``cluster_specs/local2.yaml`` (2 CPU workers) with that
profile, served by ``helix serve`` with both workers started as ``helix worker`` processes, and
loaded with ``helix bench``'s load generator at 50 % and 90 % of a capacity measured on the live
system first (a closed loop run to completion). The simulator replays the same plan, trace slice,
rate and window; the table puts the median of the live runs (and their spread) beside it.

How the processes share the 2 cores, and how the simulator is told:

- each worker is pinned to its own core (``taskset``) with one torch thread
  (``OMP_NUM_THREADS=1``). The profile is taken the same way, on every worker core at once
  (``--profile corun``, the default): two workers stepping side by side share the memory bus and
  the last-level cache, so a step is slower than on a machine with the other core idle. The
  workers serve whole replicas: each step also samples, a cost the profile measures apart (a last
  stage's fixed step cost) and the simulator charges;
- the coordinator (``helix serve``: HTTP, tokenizer, scheduler, ZeroMQ, detokenizer) and this
  script (the load generator) are not pinned and take their CPU from the workers' cores. The
  capacity run, and one more with its prompts and one output token each, measure both
  processes' CPU seconds (``/proc``); the simulator gets them as the spec's ``coordinator:
  {request_cpu, token_cpu, shared_cpu}`` (the coordinator's FIFO service time per request and per
  token, and the CPU per token taken from the workers busy at that moment: :mod:`helix.sim.hop`).
  The table shows the simulation with those figures and without them.

    python scripts/bench_live.py [--quick] [--no-write] [--runs 3] [--duration 60] [--loads 0.5,0.9]
                                 [--profile corun|alone] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SPEC = ROOT / "cluster_specs" / "local2.yaml"
MODEL = "small-llama"
HEADING = "## Live system vs simulator (`scripts/bench_live.py`)"
IDLE_PROBE_S = 3.0
"""Seconds the idle coordinator's CPU is measured for (stats polls), subtracted from the runs'."""
DECODE_SEQS = "1,2,3,4,8,16,32"
"""The profile's decode batch sizes. At 50 % load a local2 worker decodes 1-3 requests a step, and on
one CPU thread a decode step of 2 or 3 costs more than one of 4 (small-llama, context 128: 1.5, 2.4,
3.0, 2.3 ms a layer for 1-4; MKL's 2- and 3-row products cost 2x and 3x one row, 4 rows less than
3): with only 1 and 4 measured the simulator charged 2-3-decode steps 0.65x what they take, its
TPOT p50 0.70x the live one."""
LOADS_SEEN: list[float] = []
"""The machine's 1-minute load average as each live run starts (other processes' share)."""


def write_checkpoint(path: Path) -> Path:
    """The catalog's ``small-llama`` with random weights and the demo's tokenizer (cached)."""
    if not (path / "model.safetensors").is_file():
        from helix.commands.demo_checkpoint import write_tiny_checkpoint
        write_tiny_checkpoint(path, model=MODEL)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveStack:
    """``helix serve`` (all nodes external) plus one pinned ``helix worker`` per plan node."""

    def __init__(self, plan_path: Path, ckpt: Path, nodes: list[str], log_dir: Path) -> None:
        self.port, grpc_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        helix = [sys.executable, "-m", "helix.cli"]
        env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
        self.procs = []
        serve = [*helix, "serve", str(plan_path), "--model", str(ckpt), "--port", str(self.port),
                 "--grpc-port", str(grpc_port), "--served-model-name", MODEL]
        for n in nodes:
            serve += ["--external", n]
        self.procs.append(self._start(serve, env, log_dir / "serve.log"))
        for node, core in zip(nodes, worker_cores(len(nodes))):
            cmd = ["taskset", "-c", str(core), *helix, "worker", "--coordinator",
                   f"127.0.0.1:{grpc_port}", "--node", node, "--model", str(ckpt)]
            self.procs.append(self._start(cmd, {**env, "OMP_NUM_THREADS": "1"},
                                          log_dir / f"worker-{node}.log"))
        self._wait_ready(log_dir)

    @staticmethod
    def _start(cmd, env, log: Path) -> subprocess.Popen:
        return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log.open("w"),
                                stderr=subprocess.STDOUT)

    def _wait_ready(self, log_dir: Path, timeout_s: float = 180.0) -> None:
        import httpx
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs):
                break
            try:
                if httpx.get(self.url + "/v1/models", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.close()
        logs = "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in log_dir.glob("*.log"))
        raise SystemExit(f"the live stack did not come up:\n{logs}")

    def close(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()


def bench(url: str, workload, duration_s: float | None, max_concurrency: int | None = None):
    from helix.loadgen import BenchConfig, run_bench
    from helix.core.models import MODEL_CATALOG
    config = BenchConfig(url, duration_s=duration_s, max_concurrency=max_concurrency,
                         vocab_size=MODEL_CATALOG[MODEL].vocab_size)
    r = run_bench(config, workload)
    if r.requests_failed:
        raise SystemExit(f"bench: {r.requests_failed} requests failed: {r.error_examples}")
    return r


def figures(r) -> dict[str, float]:
    """decode tok/s, TTFT p50 and TPOT p50 of a bench or a simulation result."""
    def ms(x):
        return float("nan") if x is None else 1000 * x
    return {"decode": r.decode_throughput_tokens_per_s, "ttft": ms(r.ttft.p50_s),
            "tpot": ms(r.request_decode_latency.p50_s)}


def worker_cores(num_workers: int) -> list[int]:
    """The core each worker is pinned to (round robin over the cores this process may use)."""
    cores = sorted(os.sched_getaffinity(0))
    return [cores[i % len(cores)] for i in range(num_workers)]


def profile(work: Path, quick: bool, corun: int = 1) -> Path:
    """``helix profile`` of small-llama with one thread on a pinned core, as the workers run.
    ``corun`` > 1: that many profiles at once, each on its own worker core, as the workers step
    side by side (they share the memory bus and the last-level cache: a step is slower than
    alone); the first one's figures are used."""
    grid = ["--quick"] if quick else ["--prompt-lengths", "64,256,512", "--max-prompt-tokens",
                                      "1024", "--contexts", "128,512", "--seqs", DECODE_SEQS]
    outs = [work / ("profile" if i == 0 else f"profile-corun-{i}") for i in range(corun)]
    procs = [subprocess.Popen(["taskset", "-c", str(core), sys.executable, "-m", "helix.cli",
                               "profile", MODEL, "-o", str(out), "--threads", "1", *grid], cwd=ROOT,
                              env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL)
             for core, out in zip(worker_cores(corun), outs)]
    if any(p.wait() != 0 for p in procs):
        raise SystemExit("helix profile failed")
    return outs[0]


def plan_with_profile(work: Path, profile_dir: Path) -> tuple[Path, Path]:
    """local2.yaml with the measured profile for its CPU nodes, planned by ``helix plan``."""
    spec_path = work / "local2.yaml"
    spec_path.write_text(SPEC.read_text() + f"performance: {{profiles: {{CPU: {profile_dir}}}}}\n")
    plan_path = work / "plan.yaml"
    subprocess.run([sys.executable, "-m", "helix.cli", "plan", str(spec_path), "-o", str(plan_path),
                    "--time-limit", "20"], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return spec_path, plan_path


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process ``pid`` (all its threads) has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class HostCosts:
    """What a request and a streamed token cost outside the workers, from the CPU times of two
    closed-loop runs: the trace slice, and its prompts with one output token each."""

    tokens: int
    requests: int
    coordinator_cpu_s: float
    """``helix serve``'s CPU over the trace run (HTTP, tokenizer, scheduler, ZeroMQ, detokenizer)."""
    loadgen_cpu_s: float
    """This process's CPU over the trace run (the load generator: HTTP client, stream parsing)."""
    short_requests: int = 0
    """Requests of the one-token run (0: not run; then a request costs nothing apart)."""
    short_coordinator_cpu_s: float = 0.0
    idle_cpu: float = 0.0
    """The idle coordinator's CPU seconds per second (its stats polls), already taken out of
    both runs' coordinator CPU; the load it puts on the workers' cores stays in ``shared_cpu_s``
    (amortized over the trace run's tokens)."""
    trace_s: float = 0.0
    """How long the trace run took."""

    @property
    def token_cpu_s(self) -> float:
        """The coordinator's CPU per token, apart from its requests': the service time of its
        FIFO (helix.sim.hop). Two runs, C = token_cpu x tokens + request_cpu x requests each."""
        if not self.short_requests:
            return self.coordinator_cpu_s / self.tokens
        per_short = self.short_coordinator_cpu_s / self.short_requests   # one token each
        return max(0.0, (self.coordinator_cpu_s - per_short * self.requests)
                   / (self.tokens - self.requests))

    @property
    def request_cpu_s(self) -> float:
        """The coordinator's CPU per request apart from its tokens."""
        if not self.short_requests:
            return 0.0
        return max(0.0, self.short_coordinator_cpu_s / self.short_requests - self.token_cpu_s)

    @property
    def shared_cpu_s(self) -> float:
        """CPU per token that the coordinator (its requests' and its polls' included) and the load
        generator take from the workers' cores over the trace run."""
        return (self.coordinator_cpu_s + self.idle_cpu * self.trace_s + self.loadgen_cpu_s) \
            / self.tokens

    def describe(self) -> str:
        return (f"coordinator {self.request_cpu_s * 1e3:.2f} ms CPU per request and "
                f"{self.token_cpu_s * 1e3:.3f} ms per token ({self.idle_cpu * 1e3:.1f} ms/s when "
                f"idle), coordinator and load generator {self.shared_cpu_s * 1e3:.3f} ms per token "
                f"in all ({self.tokens} tokens, {self.requests} + {self.short_requests} requests)")


def with_host_costs(spec_path: Path, costs: HostCosts, out: Path) -> Path:
    """``spec_path`` with the measured figures in its ``coordinator`` section (``token_cpu``,
    ``request_cpu``, ``shared_cpu``: :class:`helix.core.spec.CoordinatorSpec`), written to ``out``."""
    import yaml
    data = yaml.safe_load(spec_path.read_text())
    data["coordinator"] = {**(data.get("coordinator") or {}),
                           "token_cpu": f"{costs.token_cpu_s * 1e6:.1f}us",
                           "request_cpu": f"{costs.request_cpu_s * 1e6:.1f}us",
                           "shared_cpu": f"{costs.shared_cpu_s * 1e6:.1f}us"}
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def _cpu_of_run(url: str, workload, concurrency: int, coordinator_pid: int, idle_cpu: float):
    """A closed-loop run, and the CPU seconds the coordinator (less what it spends idle, at
    ``idle_cpu`` seconds per second: stats polls) and this process spent in it."""
    serve0, me0, t0 = cpu_seconds(coordinator_pid), os.times(), time.monotonic()
    r = bench(url, workload, None, max_concurrency=concurrency)
    serve1, me1 = cpu_seconds(coordinator_pid), os.times()
    serve_s = max(0.0, serve1 - serve0 - idle_cpu * (time.monotonic() - t0))
    return r, serve_s, (me1.user + me1.system) - (me0.user + me0.system)


def measure_capacity(url: str, base, concurrency: int, num_requests: int,
                     coordinator_pid: int) -> tuple[float, object, HostCosts]:
    """Requests/s of a closed loop (``concurrency`` in flight) over ``num_requests`` trace requests,
    run to completion: the live system's capacity on this slice of the trace; and what a request
    and a token cost the coordinator (process ``coordinator_pid``) and this load generator: CPU
    seconds over that run and over one with the same prompts and one output token each."""
    from helix.sim.workload import TraceRequest, timed_workload
    idle0 = cpu_seconds(coordinator_pid)
    time.sleep(IDLE_PROBE_S)
    idle_cpu = (cpu_seconds(coordinator_pid) - idle0) / IDLE_PROBE_S
    workload = timed_workload(base, num_requests, float("inf"), "trace")
    r, serve_s, me_s = _cpu_of_run(url, workload, concurrency, coordinator_pid, idle_cpu)
    # A few at a time: many whole prompts at once make steps of seconds on a loaded machine,
    # and a worker answers the coordinator's stats polls only between steps.
    short = tuple(TraceRequest(0.0, q.prompt_tokens, 1) for q in workload)
    r1, short_serve_s, _ = _cpu_of_run(url, short, min(concurrency, 4), coordinator_pid, idle_cpu)
    costs = HostCosts(r.tokens_generated, r.requests_completed, serve_s, me_s,
                      r1.requests_completed, short_serve_s, idle_cpu, r.duration_s)
    return r.requests_completed / r.duration_s, r, costs


def run_loads(url: str, specs: dict, plan, base, capacity_rps: float, loads: list[float], runs: int,
              duration_s: float) -> list[tuple]:
    """Per load: the live runs' figures and, per spec of ``specs`` (label -> spec), the
    simulator's on the same workload."""
    from helix.sim.engine import SimConfig
    from helix.sim.run import simulate
    from helix.sim.workload import timed_workload
    rows = []
    for load in loads:
        rate = load * capacity_rps
        workload = timed_workload(base, len(base), rate, "trace", window_s=duration_s)
        live = []
        for i in range(runs):
            LOADS_SEEN.append(os.getloadavg()[0])
            live.append(figures(bench(url, workload, duration_s)))
            print(f"load {load:.2f} run {i + 1} (load average {LOADS_SEEN[-1]:.1f}): " + ", ".join(
                f"{k} {v:.1f}" for k, v in live[-1].items()), flush=True)
        sims = []
        for label, spec in specs.items():
            sims.append(figures(simulate(spec, plan, workload,
                                         SimConfig(mode="online", duration_s=duration_s))))
            print(f"load {load:.2f} {label}: " + ", ".join(f"{k} {v:.1f}" for k, v in
                                                         sims[-1].items()), flush=True)
        rows.append((load, rate, live, sims))
    return rows


def table(rows: list[tuple], labels: list[str]) -> str:
    """Per load and figure: the live median (min-max), then each simulation (ratio to the median)."""
    sims = " | ".join(labels)
    head = f"| load | rate req/s | live decode tok/s | {sims} | live TTFT p50 ms | {sims} | " \
           f"live TPOT p50 ms | {sims} |"
    lines = [head, "|" + "---|" * (2 + 3 * (1 + len(labels)))]
    for load, rate, live, sims_ in rows:
        cells = [f"{load:.2f}", f"{rate:.3f}"]
        for key in ("decode", "ttft", "tpot"):
            vals = [x[key] for x in live]
            med = statistics.median(vals)
            cells.append(f"{med:.1f} ({min(vals):.1f}-{max(vals):.1f})")
            cells += [f"{sim[key]:.1f} ({sim[key] / med:.2f}x)" for sim in sims_]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def describe_prediction(plan) -> str:
    """The plan's prediction in one line (B's analytic model: what `helix plan` prints)."""
    p = plan.prediction
    if p is None:
        return "no prediction"
    lat = "" if p.ttft_p50_s is None else (f"; at {p.online_load:.0%}: TTFT p50 "
                                           f"{p.ttft_p50_s * 1000:.0f} ms, TPOT p50 "
                                           f"{p.tpot_p50_s * 1000:.0f} ms")
    return (f"predicted {p.requests_per_s:.3f} req/s, {p.decode_tokens_per_s:.1f} decode tok/s at "
            f"saturation{lat}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="quick profile grid, one 20 s run per load")
    ap.add_argument("--no-write", action="store_true", help="do not write BENCHMARKS.md")
    ap.add_argument("--runs", type=int, default=3, help="live runs per load (median reported)")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds per run (live and simulated)")
    ap.add_argument("--loads", default="0.5,0.9", help="fractions of the capacity")
    ap.add_argument("--capacity", choices=("measured", "predicted"), default="measured",
                    help="100 %%: the live closed loop's requests/s, or the plan's prediction")
    ap.add_argument("--max-prompt", type=int, default=512, help="trace slice: prompt <= this")
    ap.add_argument("--max-output", type=int, default=128, help="trace slice: output <= this")
    ap.add_argument("--profile", choices=("corun", "alone"), default="corun",
                    help="profile on every worker core at once, as the workers step side by side "
                    "(default), or on one core with the others idle")
    ap.add_argument("--keep", type=Path, default=None, help="keep the profile, spec, plan and "
                    "server logs in this folder (default: a temporary one, removed)")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "helix" / "small-llama-v1")
    args = ap.parse_args()
    if args.quick:
        args.runs, args.duration = 1, 20.0
    loads = [float(x) for x in args.loads.split(",")]
    load_at_start = os.getloadavg()[0]

    from helix.core.plan import Plan
    from helix.sim.workload import load_azure_trace, mean_lengths, resolve_trace
    from helix.core.spec import load_cluster

    ckpt = write_checkpoint(args.cache)
    work = args.keep or Path(tempfile.mkdtemp(prefix="helix-bench-live-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        corun = len(load_cluster(SPEC).nodes) if args.profile == "corun" else 1
        spec_path, plan_path = plan_with_profile(work, profile(work, args.quick, corun))
        spec, plan = load_cluster(spec_path), Plan.load(plan_path)
        placement = ", ".join(f"{p.node} [{p.start},{p.end})" for p in plan.placements)
        predicted = describe_prediction(plan)
        print(f"plan: {placement}; max flow {plan.max_flow_tokens_per_s:.0f} tok/s; {predicted}",
              flush=True)
        if args.capacity == "predicted" and plan.prediction is None:
            raise SystemExit("--capacity predicted: the plan carries no prediction")
        base = load_azure_trace(resolve_trace("conv"), args.max_prompt, args.max_output)
        mean_prompt, mean_output = mean_lengths(base)
        stack = LiveStack(plan_path, ckpt, [p.node for p in plan.placements], work)
        try:
            bench(stack.url, base[:2], None)   # warm-up
            concurrency = spec.serving.max_batch_seqs
            capacity_rps, sat, costs = measure_capacity(
                stack.url, base, concurrency, concurrency if args.quick else 3 * concurrency,
                stack.procs[0].pid)
            print(f"measured capacity: {capacity_rps:.3f} req/s ({sat.decode_throughput_tokens_per_s:.1f}"
                  f" decode tok/s, {concurrency} in flight); {costs.describe()}", flush=True)
            measured_rps = capacity_rps
            if args.capacity == "predicted":
                capacity_rps = plan.prediction.requests_per_s
            host_spec = load_cluster(with_host_costs(spec_path, costs, work / "local2-host.yaml"))
            rows = run_loads(stack.url, {"sim": host_spec, "no hop": spec}, plan, base,
                             capacity_rps, loads, args.runs, args.duration)
        finally:
            stack.close()
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    text = table(rows, ["sim", "sim, no hop"])
    print(text)
    if not args.no_write:
        from benchdoc import write_section
        cmd = "python scripts/bench_live.py" + (" --quick" if args.quick else
                                                 f" --runs {args.runs} --duration {args.duration:g}") \
            + (" --capacity predicted" if args.capacity == "predicted" else "")
        entry = (f"Load average {min(LOADS_SEEN):.1f}-{max(LOADS_SEEN):.1f} as the live runs started. "
                 f"{MODEL} on local2 ({placement}), profiled with one thread on "
                 f"{'each worker core at once' if corun > 1 else 'one pinned core'} (a "
                 f"last stage's step cost, LM head and sampling, measured apart); conv "
                 f"trace, prompt <= {args.max_prompt}, output <= {args.max_output} (mean "
                 f"{mean_prompt:.0f} / {mean_output:.0f}); {args.duration:g} s windows; measured "
                 f"capacity {measured_rps:.3f} req/s ({args.capacity} capacity is 100 %); plan: "
                 f"{predicted}; measured in the capacity run: {costs.describe()}; live: median "
                 f"(min-max) of {args.runs} runs; sim: the same workload with the coordinator hop "
                 f"(helix.sim.hop: a FIFO serves each request {costs.request_cpu_s * 1e3:.2f} ms "
                 f"before it is scheduled and each token {costs.token_cpu_s * 1e3:.3f} ms before "
                 f"its caller sees it; {costs.shared_cpu_s * 1e3:.3f} ms CPU per token is taken "
                 f"from the busy workers); "
                 f"sim, no hop: without it; ratios to the live median.\n\n{text}")
        write_section("bench_live", entry, heading=HEADING, command=cmd, load0=load_at_start)


if __name__ == "__main__":
    main()
