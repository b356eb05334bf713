"""Drain benchmark: what draining a node costs users, live and in the simulator.

Live: the in-process stack (tests.builders.stack: three WorkerServers, the coordinator, the HTTP
API) serving the demo's tiny checkpoint on the branching plan (cpu-0 -> cpu-1 or cpu-0 -> cpu-2). A
steady stream of greedy requests (one thread each, recording every token's arrival) runs; after
``--before`` seconds cpu-2 is drained over ``POST /admin/drain`` (or with ``--move``), the stream goes
on for ``--after`` seconds, then cpu-2 is undrained and the stream runs ``--after`` seconds more.
Reported per mode, median over ``--runs``: seconds until cpu-2 reports ``drained``, decode tokens/s
before, while draining, after (drained) and after the undrain, requests routed through cpu-2 while
drained (the target is 0) and requests that failed (the target is 0).

Simulated: geo24 (LLaMA-2 70B, the planner's placement, online at 75 % of the predicted capacity,
``helix simulate --drain / --join``): the busiest node not on every pipeline is drained at 300 s
(its requests finish in place, or move), or joins at 300 s (absent before); decode tokens/s in the
100 s before, the first minute after and the rest, beside the same run without the event.

    python scripts/bench_drain.py [--runs 3] [--before 6] [--after 10] [--no-write] [--no-sim]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

HEADING = "## Draining a node (`scripts/bench_drain.py`)"
NODE = "cpu-2"
VIA = ("cpu-0", "cpu-2")


class Load:
    """Greedy requests at ``rate_per_s`` straight to the coordinator; every token's arrival time."""

    def __init__(self, coord, rate_per_s: float, max_tokens: int) -> None:
        from helix.net.sampling import SamplingParams
        self.coord = coord
        self.params = SamplingParams(temperature=0, max_tokens=max_tokens)
        self.prompt = coord.codec.encode("Helix serves one large language model over mixed GPUs")
        self.rate_per_s = rate_per_s
        self.records: list[dict] = []
        self._stop = threading.Event()
        self._feeder = threading.Thread(target=self._feed, daemon=True)
        self._feeder.start()

    def _collect(self, handle, rec: dict) -> None:
        for ev in handle.events(timeout_s=120):
            if hasattr(ev, "token_ids"):
                rec["token_s"].extend([time.monotonic()] * len(ev.token_ids))
            else:
                rec["done"] = ev

    def _feed(self) -> None:
        while not self._stop.is_set():
            rec = {"token_s": [], "done": None}
            handle = self.coord.submit(self.prompt, self.params)
            threading.Thread(target=self._collect, args=(handle, rec), daemon=True).start()
            self.records.append(rec)
            self._stop.wait(1.0 / self.rate_per_s)

    def stop(self, timeout_s: float = 120.0) -> None:
        """Stop sending; wait for the requests in flight."""
        self._stop.set()
        self._feeder.join()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(r["done"] is None for r in self.records):
            time.sleep(0.1)

    def rate(self, a: float, b: float) -> float:
        """Tokens per second that arrived in ``[a, b)``."""
        return sum(1 for r in self.records for t in r["token_s"] if a <= t < b) / max(b - a, 1e-9)

    def failed(self) -> int:
        return sum(1 for r in self.records if r["done"] is None or r["done"].error is not None)


def _one_run(ckpt: Path, move: bool, before_s: float, after_s: float, rate_per_s: float,
             max_tokens: int) -> dict:
    import httpx

    from coordinator.runtime import RuntimeConfig
    from tests.builders.stack import local_stack
    runtime = RuntimeConfig(stats_interval_s=0.1, request_timeout_s=120, max_waiting_requests=10_000)
    with local_stack(ckpt, runtime) as stack:
        coord = stack.coordinator
        t0 = time.monotonic()
        load = Load(coord, rate_per_s, max_tokens)
        time.sleep(before_s)
        drain_s = time.monotonic()
        r = httpx.post(stack.url + "/admin/drain", json={"node": NODE, "move": move}, timeout=30)
        r.raise_for_status()
        routed = coord.pipeline_counts[VIA]
        drained_s = None
        while drained_s is None and time.monotonic() - drain_s < 60:
            if httpx.get(stack.url + f"/admin/nodes/{NODE}", timeout=30).json()["state"] == "drained":
                drained_s = time.monotonic()
            else:
                time.sleep(0.02)
        time.sleep(max(0.0, drain_s + after_s - time.monotonic()))
        routed_while_drained = coord.pipeline_counts[VIA] - routed
        undrain_s = time.monotonic()
        httpx.post(stack.url + "/admin/undrain", json={"node": NODE}, timeout=30).raise_for_status()
        time.sleep(after_s)
        end_s = time.monotonic()
        load.stop()
        back = (drained_s or undrain_s)
        return {"drained_after_s": None if drained_s is None else drained_s - drain_s,
                "before": load.rate(t0 + 1.0, drain_s), "draining": load.rate(drain_s, back),
                "drained": load.rate(back, undrain_s), "undrained": load.rate(undrain_s + 1.0, end_s),
                "routed_while_drained": routed_while_drained, "moved": coord.requests_moved,
                "requests": len(load.records), "failed": load.failed()}


def simulated_view(duration_s: float = 900.0, at_s: float = 300.0) -> str:
    """The geo24 table of the simulator's view (see the module docstring)."""
    from bench_faults import geo24_case  # scripts/ is this script's import path

    from helix.sim import run as simrun
    from helix.sim.elastic import NodeDrain, NodeJoin
    from helix.sim.engine import SimConfig
    spec, plan, node, workload = geo24_case(duration_s)
    rows = []
    for label, drains, joins in (("no event", (), ()),
                                 (f"{node} drained at {at_s:.0f} s", (NodeDrain(node, at_s),), ()),
                                 (f"{node} drained at {at_s:.0f} s, --move", (NodeDrain(node, at_s, True),), ()),
                                 (f"{node} joins at {at_s:.0f} s", (), (NodeJoin(node, at_s),))):
        config = SimConfig(mode="online", duration_s=duration_s, drains=drains, joins=joins)
        sim = simrun.build_simulator(spec, plan, workload, config)
        r = sim.run()
        tl, b = r.throughput_timeline_tokens_per_s, r.bucket_s

        def mean(a, z):
            xs = tl[int(a / b):int(z / b)]
            return sum(xs) / len(xs) if xs else 0.0
        drained = sim.drained_s.get(node)
        rows.append(f"| {label} | {mean(at_s - 100, at_s):.0f} | {mean(at_s, at_s + 60):.0f} | "
                    f"{mean(at_s + 60, duration_s):.0f} | "
                    f"{'-' if drained is None else f'{drained - at_s:.1f}'} | "
                    f"{r.node_requests.get(node, 0)} | {r.requests_moved} | {r.requests_completed} | "
                    f"{r.requests_rejected} |")
    head = (f"| geo24 70B, online at 75 % of the prediction, {duration_s:.0f} s | decode tok/s "
            f"{at_s - 100:.0f}-{at_s:.0f} s | first minute after | rest | drained after (s) | requests "
            f"through {node} | moved | completed | rejected |")
    return "\n".join([head, "|" + "---|" * 9, *rows])


def _med(runs: list[dict], key: str, fmt: str = ".0f") -> str:
    xs = [r[key] for r in runs if r[key] is not None]
    return f"{statistics.median(xs):{fmt}}" if xs else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--before", type=float, default=6.0, help="seconds of load before the drain")
    ap.add_argument("--after", type=float, default=10.0, help="seconds of load after it, and after "
                    "the undrain")
    ap.add_argument("--rate", type=float, default=8.0, help="requests per second")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--no-write", action="store_true", help="do not write BENCHMARKS.md")
    ap.add_argument("--no-sim", action="store_true", help="skip the simulator's view on geo24")
    args = ap.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from helix.commands.demo_checkpoint import write_tiny_checkpoint
    load0 = os.getloadavg()[0]
    ckpt = Path(tempfile.mkdtemp(prefix="helix-bench-drain-"))
    write_tiny_checkpoint(ckpt)
    rows = []
    for name, move in (("drain", False), ("drain --move", True)):
        runs = [_one_run(ckpt, move, args.before, args.after, args.rate, args.max_tokens)
                for _ in range(args.runs)]
        rows.append((name, _med(runs, "drained_after_s", ".2f"), _med(runs, "before"),
                     _med(runs, "draining"), _med(runs, "drained"), _med(runs, "undrained"),
                     f"{sum(r['routed_while_drained'] for r in runs)}", _med(runs, "moved"),
                     f"{sum(r['failed'] for r in runs)} / {sum(r['requests'] for r in runs)}"))
    head = (f"| {NODE} | drained after (s) | decode tok/s before | while draining | drained | after "
            f"undrain | routed through {NODE} while drained | moved | failed |")
    table = "\n".join([head, "|" + "---|" * 9] + ["| " + " | ".join(r) + " |" for r in rows])
    print(table)
    sim_table = "" if args.no_sim else simulated_view()
    if sim_table:
        print(sim_table)
        table += "\n\nThe simulator's view (`helix simulate --drain / --join`):\n\n" + sim_table
    if not args.no_write:
        from benchdoc import write_section  # scripts/: the import path
        cmd = (f"python scripts/bench_drain.py --runs {args.runs} --before {args.before:g} --after "
               f"{args.after:g} --rate {args.rate:g} --max-tokens {args.max_tokens}")
        write_section("bench_drain", f"Medians over the runs; counts summed.\n\n{table}", heading=HEADING,
                      command=cmd, load0=load0)


if __name__ == "__main__":
    main()
