"""Failure benchmark for ``helix serve``: what a worker's death or freeze costs users.

The live stack in this process (coordinator, cpu-0 and cpu-1 as in-process workers) with cpu-2 a
``helix worker`` subprocess, serving the demo's tiny checkpoint on the branching plan (pipelines
cpu-0 -> cpu-1 and cpu-0 -> cpu-2). A steady stream of greedy requests (each one thread that records
every token's arrival) runs; after ``--before`` seconds cpu-2 is SIGKILLed (or SIGSTOPped), and the
stream goes on for ``--after`` seconds. Reported per event, median and worst over ``--runs``:

- detection: kill -> the coordinator reports the node dead (SIGSTOP: suspect, then dead);
- pause of a moved request: its last token before the event -> its first token on the new route,
  p50 / p99 over the moved requests;
- prompt tokens prefilled again for moved requests;
- decode tokens/s before the event, during (the event to 2 s after detection) and after;
- requests that failed (the target is 0).

And the simulator's view of the same event on geo24 (LLaMA-2 70B, the planner's placement, online
at 75 % of the predicted capacity): one node that is not on every pipeline dies at 300 s (declared
dead 0.3 s later, as a killed process is live), once for good and once back after 120 s; decode
tokens/s before, in the minute after and for the rest, beside the same run without the failure.

    python scripts/bench_faults.py [--runs 3] [--before 6] [--after 14] [--no-write] [--no-sim]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

HEADING = "## Failures (`scripts/bench_faults.py`)"


class Stack:
    """The serving stack with cpu-2 in a subprocess."""

    def __init__(self, ckpt: Path, plan, health) -> None:
        from coordinator.runtime import RuntimeConfig
        from helix.net.control import COORDINATOR_SERVICE, ControlClient
        from helix.server.stack import ServeOptions, ServeStack
        from worker.server import WorkerServer
        runtime = RuntimeConfig(stats_interval_s=0.1, request_timeout_s=120, health=health,
                                max_waiting_requests=10_000)
        self.stack = ServeStack(plan, str(ckpt), ServeOptions(
            external_nodes=("cpu-0", "cpu-1", "cpu-2"), register_timeout_s=120, runtime=runtime))
        errors: list[BaseException] = []

        def start():
            try:
                self.stack.start()
            except BaseException as exc:
                errors.append(exc)
        starter = threading.Thread(target=start, daemon=True)
        starter.start()
        while self.stack.grpc is None:
            time.sleep(0.02)
        self.proc = subprocess.Popen([sys.executable, "-m", "helix.cli", "worker", "--coordinator",
                                      self.stack.grpc.address, "--node", "cpu-2", "--model", str(ckpt)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     env={**os.environ, "OMP_NUM_THREADS": "1"})
        self.local = [WorkerServer(n, str(ckpt), torch_threads=1) for n in ("cpu-0", "cpu-1")]
        reg = ControlClient(self.stack.grpc.address, COORDINATOR_SERVICE)
        for w in self.local:
            reg.call("Register", w.addresses)
        reg.close()
        starter.join(timeout=300)
        if errors or starter.is_alive():
            raise RuntimeError(f"stack did not start: {errors}")
        self.coord = self.stack.coordinator

    def close(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(timeout=30)
        self.stack.close()
        for w in self.local:
            w.shutdown()


def _one_run(ckpt: Path, plan, sig: int, before_s: float, after_s: float, rate_per_s: float,
             max_tokens: int) -> dict:
    from coordinator.health import HealthConfig
    from helix.net.sampling import SamplingParams
    st = Stack(ckpt, plan, HealthConfig())
    coord = st.coord
    prompt = coord.codec.encode("Helix serves one large language model over mixed GPUs")
    records: list[dict] = []
    lock = threading.Lock()
    stop = threading.Event()

    def collect(handle, rec):
        for ev in handle.events(timeout_s=120):
            if hasattr(ev, "token_ids"):
                rec["token_s"].extend([time.monotonic()] * len(ev.token_ids))
            else:
                rec["done"] = ev

    def feed():
        while not stop.is_set():
            rec = {"token_s": [], "done": None, "sent_s": time.monotonic()}
            handle = coord.submit(prompt, SamplingParams(temperature=0, max_tokens=max_tokens))
            rec["rid"] = handle.request_id
            threading.Thread(target=collect, args=(handle, rec), daemon=True).start()
            with lock:
                records.append(rec)
            stop.wait(1.0 / rate_per_s)
    feeder = threading.Thread(target=feed, daemon=True)
    t0 = time.monotonic()
    feeder.start()
    try:
        time.sleep(before_s)
        event_s = time.monotonic()
        st.proc.send_signal(sig)
        suspect_s = dead_s = None
        while time.monotonic() - event_s < 60 and dead_s is None:
            state = coord.node_states()["cpu-2"]
            now = time.monotonic()
            if state in ("suspect", "dead") and suspect_s is None:
                suspect_s = now
            if state == "dead":
                dead_s = now
            time.sleep(0.005)
        time.sleep(0.3)   # the poll that saw it dead moved its requests; their original ids:
        with coord._lock:
            moved_ids = set(coord._alias)
        time.sleep(max(0.0, event_s + after_s - time.monotonic()))
        stop.set()
        feeder.join()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and any(r["done"] is None for r in records):
            time.sleep(0.1)
        moved_prefill = coord.moved_prefill_tokens
        moved = coord.requests_moved
    finally:
        st.close()
    end_s = event_s + after_s
    during_end = (dead_s or event_s) + 2.0

    def rate(a, b):
        return sum(1 for r in records for t in r["token_s"] if a <= t < b) / max(b - a, 1e-9)
    pauses = []
    for r in records:
        if r["rid"] not in moved_ids:
            continue
        ts = r["token_s"]
        before = [t for t in ts if t < event_s]
        later = [t for t in ts if t >= event_s]
        if later:   # from its last token before the event (or the event) to its first on the new route
            pauses.append(later[0] - (before[-1] if before else event_s))
    failed = sum(1 for r in records if r["done"] is None or r["done"].error is not None)
    return {"detect_suspect_s": None if suspect_s is None else suspect_s - event_s,
            "detect_dead_s": None if dead_s is None else dead_s - event_s,
            "pauses": pauses, "moved": moved, "moved_prefill": moved_prefill,
            "before": rate(t0 + 1.0, event_s), "during": rate(event_s, during_end),
            "after": rate(during_end, end_s), "requests": len(records), "failed": failed}


def geo24_case(duration_s: float):
    """geo24 (LLaMA-2 70B) with the planner's placement (60 s), its busiest node that is not on
    every pipeline, and an online workload at 75 % of the predicted capacity for ``duration_s``:
    ``(spec, plan, node, workload)`` (bench_drain.py uses it too)."""
    from coordinator.pipeline import Topology
    from helix.sim import run as simrun
    from helix.core.spec import load_cluster
    spec = load_cluster(ROOT / "cluster_specs" / "geo24.yaml")
    plan = simrun.make_plan(spec, "milp", time_limit_s=60.0)
    topo = Topology.from_plan(plan)
    nodes = sorted(topo.nodes, key=lambda n: -sum(a.flow_tokens_per_s for a in plan.arc_flows if a.src == n))
    node = next(n for n in nodes if topo.has_path(topo.mask_of(m for m in topo.nodes if m != n)))
    opts = simrun.WorkloadOptions(load=0.75)
    return spec, plan, node, simrun.make_workload(opts, "online", plan, 0, duration_s)


def simulated_view(duration_s: float = 900.0, fail_at_s: float = 300.0) -> str:
    """The geo24 table of the simulator's view (see the module docstring)."""
    from helix.sim import run as simrun
    from helix.sim.engine import NodeFailure, SimConfig
    spec, plan, node, workload = geo24_case(duration_s)
    rows = []
    for label, failures in (("no failure", ()),
                            (f"{node} dies at {fail_at_s:.0f} s", (NodeFailure(node, fail_at_s),)),
                            (f"{node} down {fail_at_s:.0f}-{fail_at_s + 120:.0f} s",
                             (NodeFailure(node, fail_at_s, 120.0),))):
        r = simrun.simulate(spec, plan, workload, SimConfig(mode="online", duration_s=duration_s,
                                                            failures=failures))
        tl, b = r.throughput_timeline_tokens_per_s, r.bucket_s

        def mean(a, z):
            xs = tl[int(a / b):int(z / b)]
            return sum(xs) / len(xs) if xs else 0.0
        rows.append(f"| {label} | {mean(fail_at_s - 100, fail_at_s):.0f} | "
                    f"{mean(fail_at_s, fail_at_s + 60):.0f} | {mean(fail_at_s + 60, duration_s):.0f} | "
                    f"{r.requests_moved} | {r.moved_prefill_tokens} | {r.requests_completed} | "
                    f"{r.requests_rejected} |")
    head = (f"| geo24 70B, online at 75 % of the prediction, {duration_s:.0f} s | decode tok/s "
            f"{fail_at_s - 100:.0f}-{fail_at_s:.0f} s | first minute after | rest | moved | prefilled "
            f"again | completed | rejected |")
    return "\n".join([head, "|" + "---|" * 8, *rows])


def _fmt(xs, q=None):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    if q is None:
        return f"{statistics.median(xs):.2f} (max {max(xs):.2f})"
    xs = sorted(xs)
    return f"{xs[min(len(xs) - 1, int(q * len(xs)))]:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--before", type=float, default=6.0, help="seconds of load before the event")
    ap.add_argument("--after", type=float, default=14.0, help="seconds of load after it")
    ap.add_argument("--rate", type=float, default=8.0, help="requests per second")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--no-write", action="store_true", help="do not write BENCHMARKS.md")
    ap.add_argument("--no-sim", action="store_true", help="skip the simulator's view on geo24")
    args = ap.parse_args()
    from helix.commands.demo_checkpoint import write_tiny_checkpoint
    load0 = os.getloadavg()[0]
    ckpt = Path(tempfile.mkdtemp(prefix="helix-bench-faults-"))
    write_tiny_checkpoint(ckpt)
    from tests.builders.serving import branching_plan  # the serving tests' plan
    plan = branching_plan()
    rows = []
    for name, sig in (("kill -9", signal.SIGKILL), ("kill -STOP", signal.SIGSTOP)):
        runs = [_one_run(ckpt, plan, sig, args.before, args.after, args.rate, args.max_tokens)
                for _ in range(args.runs)]
        pauses = [p for r in runs for p in r["pauses"]]
        rows.append((name, _fmt([r["detect_suspect_s"] for r in runs]),
                     _fmt([r["detect_dead_s"] for r in runs]), _fmt(pauses, 0.5), _fmt(pauses, 0.99),
                     f"{statistics.median(r['moved'] for r in runs):.0f}",
                     f"{statistics.median(r['moved_prefill'] for r in runs):.0f}",
                     f"{statistics.median(r['before'] for r in runs):.0f}",
                     f"{statistics.median(r['during'] for r in runs):.0f}",
                     f"{statistics.median(r['after'] for r in runs):.0f}",
                     f"{sum(r['failed'] for r in runs)} / {sum(r['requests'] for r in runs)}"))
    head = ("| event | suspect after (s) | dead after (s) | pause p50 (s) | pause p99 (s) | moved | "
            "prefilled again (tokens) | decode tok/s before | during | after | failed |")
    table = "\n".join([head, "|" + "---|" * 11] + ["| " + " | ".join(r) + " |" for r in rows])
    print(table)
    sim_table = "" if args.no_sim else simulated_view()
    if sim_table:
        print(sim_table)
        table += "\n\nThe simulator's view (`helix simulate --fail`):\n\n" + sim_table
    if not args.no_write:
        from benchdoc import write_section  # scripts/ is this script's import path
        cmd = (f"python scripts/bench_faults.py --runs {args.runs} --before {args.before:g} --after "
               f"{args.after:g} --rate {args.rate:g} --max-tokens {args.max_tokens}")
        write_section("bench_faults", "Default health settings (suspect 2 s, dead 10 s or 2 refused polls). "
                      f"Medians over the runs, max in brackets.\n\n{table}", heading=HEADING, command=cmd,
                      load0=load0)


if __name__ == "__main__":
    main()
