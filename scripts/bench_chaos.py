"""Chaos benchmark for ``helix serve``: faults every minute or so under steady load.

The demo's tiny checkpoint on ``helix plan``'s placement of cluster_specs/local3.yaml (cpu-0 holds
the whole model; cpu-2 -> cpu-1 the other pipeline), served by ``helix serve``'s own stack in this
process: Ray workers (restarted by the launcher's supervisor), the coordinator, the OpenAI HTTP API.

1. Capacity: a closed loop of ``--concurrency`` streaming clients for ``--calibrate`` seconds; the
   completed requests per second after the first quarter.
2. Load: streaming completions arrive at ``--load`` (75 %) of that capacity, a Poisson process, for
   ``--duration`` seconds (600: ten minutes). Every ``--every`` (60-90 s, drawn from ``--seed``) a
   fault, the kinds in turn:
   - ``kill -9`` of a Ray worker (cpu-0 and cpu-2 in turn);
   - ``SIGSTOP`` of a Ray worker for ``--freeze`` seconds (15), then ``SIGCONT``;
   - repeated kills: cpu-2's worker kill -9'ed three times, each time as soon as it serves again;
   - a link cut: cpu-1 runs as ``helix worker`` inside a network namespace joined to this one by a
     veth pair, which goes down for ``--freeze`` seconds (root and iproute2 only; elsewhere, or with
     ``--no-netns``, this kind is left out and the report says so).

Reported: per minute, requests by outcome (served; HTTP 503; other HTTP errors; a stream's error
event; timeouts and broken connections), TTFT p50 / p99 and decode tokens/s; per fault, the time to
recovery (from the fault until every node is ok and the plan's whole capacity serves again, as the
coordinator sees it, polled every 0.2 s); the RSS of this process (coordinator, HTTP; the load runs
elsewhere) and of the workers at the start and at the end of the load (sampled while it runs, before
the load's records come back here). A table is printed and, unless ``--no-append``, appended to
BENCHMARKS.md. The load runs in a process of its own (its timing does not wait on the server's
threads for Python's GIL); the first minute includes its start (a second or so).

    python scripts/bench_chaos.py [--duration 600] [--load 0.75] [--every 60 90] [--no-append]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

HEADING = "## Chaos: faults under load (`scripts/bench_chaos.py`)"
FAIL_KINDS = ("http_503", "http_other", "error_event", "timeout")
KINDS = ("kill -9", "SIGSTOP", "3 x kill -9", "link cut")
FAULT_NOTE = "default health settings (suspect 2 s, dead 10 s or 2 refused polls) and restarts"


@dataclass
class Record:
    """One request: when it was sent, its first token and end, its tokens' arrival times."""

    sent_s: float
    first_s: float | None = None
    end_s: float | None = None
    token_s: list[float] = field(default_factory=list)
    outcome: str = "pending"
    """``ok`` or one of :data:`FAIL_KINDS`."""
    detail: str = ""
    """An HTTP error's code (``queue_full``, ``no_pipeline``, ...)."""
    due_s: float | None = None
    """When the Poisson schedule said to send it (``sent_s`` later: the load process lagged)."""


# --- the cluster --------------------------------------------------------------------------------------
class NetNs:
    """A network namespace joined to this one by a veth pair (as tests/helix/server/test_link_cut)."""

    def __init__(self) -> None:
        tag = os.getpid() % 100_000
        self.ns, self.host_if, ns_if = f"hxc{tag}", f"hxch{tag}", f"hxcn{tag}"
        subnet = f"10.214.{tag % 250}"
        self.host_addr, self.ns_addr = f"{subnet}.1", f"{subnet}.2"
        _ip("netns", "add", self.ns)
        try:
            _ip("link", "add", self.host_if, "type", "veth", "peer", "name", ns_if)
            _ip("link", "set", ns_if, "netns", self.ns)
            _ip("addr", "add", f"{self.host_addr}/30", "dev", self.host_if)
            _ip("link", "set", self.host_if, "up")
            for args in (("addr", "add", f"{self.ns_addr}/30", "dev", ns_if),
                         ("link", "set", ns_if, "up"), ("link", "set", "lo", "up")):
                _ip("netns", "exec", self.ns, "ip", *args)
        except BaseException:
            self.close()
            raise

    def link(self, up: bool) -> None:
        _ip("link", "set", self.host_if, "up" if up else "down")

    def close(self) -> None:
        _ip("link", "del", self.host_if, check=False)
        _ip("netns", "del", self.ns, check=False)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=30)


def netns_available() -> bool:
    return shutil.which("ip") is not None and os.geteuid() == 0


class Cluster:
    """The demo cluster served in this process; cpu-1 in a namespace when ``netns`` is given."""

    def __init__(self, ckpt: Path, plan, netns: NetNs | None) -> None:
        from coordinator.runtime import RuntimeConfig
        from helix.server.http import HttpThread
        from helix.server.launcher import LaunchConfig
        from helix.server.stack import ServeOptions, ServeStack
        self.netns, self.worker = netns, None
        host = netns.host_addr if netns else "127.0.0.1"
        external = ("cpu-1",) if netns else ()
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        self.stack = ServeStack(plan, str(ckpt), ServeOptions(
            host=host, model_name="tiny-llama", external_nodes=external,
            launch=LaunchConfig(bind_host=host), runtime=RuntimeConfig(request_timeout_s=60)))
        errors: list[BaseException] = []
        starter = threading.Thread(target=lambda: _start(self.stack, errors), daemon=True)
        starter.start()
        if netns:
            while self.stack.grpc is None and starter.is_alive():
                time.sleep(0.05)
            self.worker = subprocess.Popen(
                ["ip", "netns", "exec", netns.ns, sys.executable, "-m", "helix.cli", "worker",
                 "--coordinator", self.stack.grpc.address, "--node", "cpu-1", "--model", str(ckpt),
                 "--host", netns.ns_addr], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                env={**os.environ, "OMP_NUM_THREADS": "1"})
        starter.join(timeout=600)
        if errors or starter.is_alive():
            self.close()
            raise RuntimeError(f"the stack did not start: {errors}")
        self.coord = self.stack.coordinator
        self.http = HttpThread(self.stack.app, host=host)
        self.ray_nodes = [p.node for p in plan.placements if p.node not in external]

    def pid(self, node: str) -> int:
        if self.worker is not None and node == "cpu-1":
            return self.worker.pid
        return self.stack.launcher.worker_pid(node)

    def settled(self) -> bool:
        """Every node ok and the plan's whole capacity serving."""
        return self.coord.capacity_fraction >= 1.0 and \
            all(s == "ok" for s in self.coord.node_states().values())

    def close(self) -> None:
        if getattr(self, "http", None) is not None:
            self.http.stop()
        self.stack.close()
        if self.worker is not None and self.worker.poll() is None:
            self.worker.kill()
            self.worker.wait(timeout=30)


def _start(stack, errors: list) -> None:
    try:
        stack.start()
    except BaseException as exc:
        errors.append(exc)


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def rss(cluster: Cluster) -> tuple[float, float]:
    """(this process, all workers) resident MB."""
    workers = 0.0
    for node in cluster.coord.workers:
        try:
            workers += rss_mb(cluster.pid(node))
        except Exception:   # a worker being restarted: not counted
            pass
    return rss_mb(os.getpid()), workers


# --- load -----------------------------------------------------------------------------------------------
PROMPTS = ["Helix serves one large language model", "Each worker holds a contiguous slice",
           "every request gets its own pipeline", "Chunked prefill cuts long prompts",
           "Iteration-level scheduling lets finished requests leave", "mixed GPUs in several regions"]


_COMPLETION_TOKENS = re.compile(r'"completion_tokens":(\d+)')


async def one_request(client, url: str, rec: Record, k: int, max_tokens: int) -> None:
    """A streamed completion; the running usage in every chunk says when each token came."""
    import httpx
    body = {"model": "tiny-llama", "prompt": PROMPTS[k % len(PROMPTS)], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    seen = 0
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as r:
            if r.status_code != 200:
                rec.outcome = "http_503" if r.status_code == 503 else "http_other"
                try:
                    rec.detail = json.loads(await r.aread())["error"]["code"] or ""
                except (ValueError, KeyError, TypeError):
                    pass
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                if line.startswith('data: {"error"'):
                    rec.outcome = "error_event"
                    return
                # No JSON parse per chunk: the load process must keep up with its schedule.
                found = _COMPLETION_TOKENS.search(line)
                n = int(found.group(1)) if found else seen
                now = time.monotonic()
                if n > seen:
                    rec.first_s = rec.first_s or now
                    rec.token_s.extend([now] * (n - seen))
                    seen = n
        rec.outcome = "ok"
    except (httpx.TimeoutException, httpx.TransportError):
        rec.outcome = "timeout"
    finally:
        rec.end_s = time.monotonic()


def in_process(fn, *args, while_waiting=None):
    """``fn(*args)`` in a process of its own (spawned): the load's timing must not wait on the
    server's threads for Python's GIL, nor theirs on it. ``while_waiting`` is called every 0.5 s
    until it returns (before its result, which may be large, is unpickled here)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        future = pool.submit(fn, *args)
        while while_waiting is not None and not future.done():
            while_waiting()
            time.sleep(0.5)
        return future.result()


def closed_loop(url: str, concurrency: int, seconds: float, max_tokens: int) -> float:
    """Completed requests per second of ``concurrency`` clients each sending one after another."""
    import httpx
    done: list[float] = []

    async def client_loop(client, k):
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            rec = Record(time.monotonic())
            await one_request(client, url, rec, k, max_tokens)
            if rec.outcome == "ok":
                done.append(rec.end_s)

    async def run():
        limits = httpx.Limits(max_connections=concurrency + 8)
        async with httpx.AsyncClient(timeout=120, limits=limits) as client:
            await asyncio.gather(*(client_loop(client, k) for k in range(concurrency)))
    t0 = time.monotonic()
    asyncio.run(run())
    warm = t0 + seconds / 4
    return sum(1 for t in done if warm <= t < t0 + seconds) / (seconds * 3 / 4)


def open_loop(url: str, rate_per_s: float, seconds: float, max_tokens: int, seed: int) -> list[tuple]:
    """Poisson arrivals at ``rate_per_s`` for ``seconds``; every request, as a tuple of
    :class:`Record`'s fields (the monotonic clock is the machine's: times compare across
    processes)."""
    import httpx
    rng = random.Random(seed)
    records: list[Record] = []

    async def run():
        limits = httpx.Limits(max_connections=4096, max_keepalive_connections=256)
        async with httpx.AsyncClient(timeout=120, limits=limits) as client:
            tasks, t_end, k = [], time.monotonic() + seconds, 0
            next_s = time.monotonic()
            while next_s < t_end:
                await asyncio.sleep(max(0.0, next_s - time.monotonic()))
                rec = Record(time.monotonic(), due_s=next_s)
                records.append(rec)
                tasks.append(asyncio.ensure_future(one_request(client, url, rec, k, max_tokens)))
                k += 1
                next_s += rng.expovariate(rate_per_s)
            await asyncio.gather(*tasks)
    asyncio.run(run())
    return [(r.sent_s, r.first_s, r.end_s, r.token_s, r.outcome, r.detail, r.due_s) for r in records]


# --- faults ---------------------------------------------------------------------------------------------
@dataclass
class Fault:
    kind: str
    node: str
    at_s: float = 0.0
    """When it began (monotonic)."""
    recovered_s: float | None = None
    """Seconds from its start until every node was ok and the whole capacity served again."""
    note: str = ""


def schedule(duration_s: float, every: tuple[float, float], kinds: list[str], seed: int,
             t0: float) -> list[tuple[float, str]]:
    """(time, kind) of each fault: gaps drawn from ``every``, kinds in turn, none in the last 30 s
    (room to recover)."""
    rng, out, t, k = random.Random(seed), [], t0, 0
    while True:
        t += rng.uniform(*every)
        if t > t0 + duration_s - 30:
            return out
        out.append((t, kinds[k % len(kinds)]))
        k += 1


def inject(cluster: Cluster, fault: Fault, freeze_s: float) -> None:
    """Do ``fault`` (blocking while it lasts: a freeze or a cut is undone after ``freeze_s``)."""
    coord = cluster.coord
    if fault.kind == "kill -9":
        os.kill(cluster.pid(fault.node), signal.SIGKILL)
    elif fault.kind == "SIGSTOP":
        pid = cluster.pid(fault.node)
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(freeze_s)
        finally:
            os.kill(pid, signal.SIGCONT)
    elif fault.kind == "3 x kill -9":
        for k in range(3):
            restarts = coord.restarts[fault.node]
            os.kill(cluster.pid(fault.node), signal.SIGKILL)
            deadline = time.monotonic() + 120
            # Back (a new process serves) before the next kill; the last one: seen down.
            while not (coord.restarts[fault.node] > restarts and
                       coord.node_states()[fault.node] == "ok") if k < 2 else \
                    coord.node_states()[fault.node] == "ok":
                if time.monotonic() > deadline:
                    fault.note = f"not back after kill {k + 1}"
                    return
                time.sleep(0.1)
    elif fault.kind == "link cut":
        cluster.netns.link(False)
        try:
            time.sleep(freeze_s)
        finally:
            cluster.netns.link(True)


def watch_recovery(cluster: Cluster, fault: Fault, injected: threading.Event,
                   timeout_s: float = 180.0) -> None:
    """Fill ``fault.recovered_s``: the first time, once the fault is over (``injected``: a freeze
    undone, the last of repeated kills done), that the cluster settled, having been seen unsettled
    since it began (a kill nobody noticed within 10 s is noted as such)."""
    seen_down = False
    while time.monotonic() - fault.at_s < timeout_s:
        if not cluster.settled():
            seen_down = True
        elif seen_down and injected.is_set():
            fault.recovered_s = time.monotonic() - fault.at_s
            return
        elif not seen_down and time.monotonic() - fault.at_s > 10 and fault.kind == "kill -9":
            fault.note = fault.note or "no outage seen"
            return
        time.sleep(0.2)
    fault.note = fault.note or f"not recovered within {timeout_s:.0f} s"


def run_faults(cluster: Cluster, plan_: list[tuple[float, str]], freeze_s: float,
               faults: list[Fault], stop: threading.Event, t0: float) -> None:
    nodes = {"kill -9": ["cpu-0", "cpu-2"], "SIGSTOP": ["cpu-2", "cpu-0"],
             "3 x kill -9": ["cpu-2"], "link cut": ["cpu-1"]}
    turns: dict[str, int] = {}
    for at_s, kind in plan_:
        if stop.wait(max(0.0, at_s - time.monotonic())):
            return
        k = turns[kind] = turns.get(kind, -1) + 1
        fault = Fault(kind, nodes[kind][k % len(nodes[kind])], time.monotonic())
        faults.append(fault)
        print(f"  {fault.at_s - t0:.0f} s: {kind} {fault.node}", flush=True)
        injected = threading.Event()
        watcher = threading.Thread(target=watch_recovery, args=(cluster, fault, injected),
                                   daemon=True)
        watcher.start()
        try:
            inject(cluster, fault, freeze_s)
        except Exception as exc:   # the fault itself failed (a worker gone meanwhile): say so
            fault.note = f"injection failed: {exc}"
        injected.set()
        watcher.join(timeout=200)
        if fault.recovered_s is not None:
            print(f"  recovered {fault.recovered_s:.1f} s after it began", flush=True)


# --- report ---------------------------------------------------------------------------------------------
def _pct(xs: list[float], q: float) -> str:
    if not xs:
        return "-"
    xs = sorted(xs)
    return f"{xs[min(len(xs) - 1, round(q / 100 * (len(xs) - 1)))] * 1000:.0f}"


def minute_rows(records: list[Record], t0: float, duration_s: float) -> list[str]:
    rows = []
    for m in range(int((duration_s + 59) // 60)):
        a, b = t0 + 60 * m, min(t0 + 60 * (m + 1), t0 + duration_s)
        sent = [r for r in records if a <= r.sent_s < b]
        fails = {k: sum(1 for r in sent if r.outcome == k) for k in FAIL_KINDS}
        ttft = [r.first_s - r.sent_s for r in sent if r.first_s is not None]
        tokens = sum(1 for r in records for t in r.token_s if a <= t < b)
        rows.append(f"| {m} | {len(sent)} | {sum(1 for r in sent if r.outcome == 'ok')} | "
                    + " | ".join(str(fails[k]) for k in FAIL_KINDS)
                    + f" | {_pct(ttft, 50)} | {_pct(ttft, 99)} | {tokens / max(b - a, 1e-9):.0f} |")
    return rows


def monitor(cluster: Cluster, stop: threading.Event, t0: float, every_s: float) -> None:
    """A line every ``every_s``: the capacity serving, the queue against its bound, nodes not ok."""
    coord = cluster.coord
    while not stop.wait(every_s):
        bad = {n: s for n, s in coord.node_states().items() if s != "ok"}
        print(f"  [{time.monotonic() - t0:5.0f} s] capacity {coord.capacity_fraction:.2f}, "
              f"{coord.num_running} running, {coord.num_waiting} waiting (bound "
              f"{coord.queue_limit()}), moved {coord.requests_moved}" + (f", {bad}" if bad else ""),
              flush=True)


def report(records, faults, t0, duration_s, capacity, rate, rss0, rss1, netns_note) -> str:
    head = ("| minute | sent | served | HTTP 503 | other HTTP | error event | timeout / broken | "
            "TTFT p50 ms | TTFT p99 ms | decode tok/s |")
    measured = "not measured" if capacity is None else f"{capacity:.1f} req/s (closed loop)"
    lags = sorted(r.sent_s - r.due_s for r in records if r.due_s is not None)
    lag = (f"; the load process sent {len(records) / duration_s:.1f} req/s, up to "
           f"{lags[int(0.99 * (len(lags) - 1))]:.2f} s (p99) / {lags[-1]:.2f} s (max) behind its "
           f"schedule" if lags else "")
    lines = [(f"Capacity {measured}; offered {rate:.1f} req/s (Poisson){lag}; {FAULT_NOTE}. "
              f"{netns_note}"), "", head, "|" + "---|" * 10, *minute_rows(records, t0, duration_s)]
    total = {k: sum(1 for r in records if r.outcome == k) for k in ("ok", *FAIL_KINDS)}
    codes = sorted({r.detail for r in records if r.detail})
    by_code = ", ".join(f"{sum(1 for r in records if r.detail == c)} {c}" for c in codes)
    lines += ["", f"Total: {len(records)} sent, {total['ok']} served, "
              + ", ".join(f"{total[k]} {k}" for k in FAIL_KINDS)
              + (f" ({by_code})" if by_code else "")
              + f"; {sum(1 for r in records if r.outcome == 'pending')} unfinished.", "",
              "| fault at (s) | kind | node | time to recovery (s) | note |", "|---|---|---|---|---|"]
    for f in faults:
        rec = "-" if f.recovered_s is None else f"{f.recovered_s:.1f}"
        lines.append(f"| {f.at_s - t0:.0f} | {f.kind} | {f.node} | {rec} | {f.note} |")
    lines += ["", (f"RSS: this process {rss0[0]:.0f} -> {rss1[0]:.0f} MB, workers {rss0[1]:.0f} -> "
               f"{rss1[1]:.0f} MB.")]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of load with faults")
    ap.add_argument("--load", type=float, default=0.75, help="offered load, fraction of capacity")
    ap.add_argument("--every", type=float, nargs=2, default=(60.0, 90.0), metavar=("MIN", "MAX"),
                    help="seconds between faults, drawn uniformly")
    ap.add_argument("--freeze", type=float, default=15.0, help="seconds of a SIGSTOP or link cut")
    ap.add_argument("--calibrate", type=float, default=40.0, help="seconds of the capacity run")
    ap.add_argument("--rate", type=float, default=None,
                    help="offer this many requests per second instead (no capacity run)")
    ap.add_argument("--concurrency", type=int, default=48, help="clients of the capacity run")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kinds", type=lambda v: [k.strip() for k in v.split(",")],
                    default=list(KINDS),
                    help="the faults to inject, in turn (comma-separated; default all four)")
    ap.add_argument("--no-netns", action="store_true", help="no link cut (no network namespace)")
    ap.add_argument("--no-append", action="store_true", help="do not write BENCHMARKS.md")
    ap.add_argument("--verbose", action="store_true", help="print the coordinator's view every 5 s")
    args = ap.parse_args()
    unknown = sorted(set(args.kinds) - set(KINDS))
    if unknown:
        ap.error(f"--kinds: unknown fault(s) {unknown}; known: {', '.join(KINDS)}")
    import logging
    logging.basicConfig(level=logging.ERROR, format="%(asctime)s %(name)s %(message)s")
    from helix.commands.demo import plan_local3
    from helix.commands.demo_checkpoint import ensure_tiny_checkpoint
    load0 = os.getloadavg()[0]
    scratch = Path(tempfile.mkdtemp(prefix="helix-bench-chaos-"))
    try:
        run(args, ensure_tiny_checkpoint(scratch), plan_local3(), load0)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def run(args, ckpt: Path, plan, load0: float) -> None:
    """The benchmark (see the module) on checkpoint ``ckpt`` with ``plan``."""
    netns = None
    if not args.no_netns and netns_available():
        try:
            netns = NetNs()
        except (subprocess.CalledProcessError, OSError) as exc:
            print(f"no network namespace ({exc}): no link cut", flush=True)
    netns_note = ("Link cut: cpu-1 in a network namespace, its veth down." if netns else
                  "No link cut (no network namespace here).")
    cluster = None
    try:
        cluster = Cluster(ckpt, plan, netns)
        url = cluster.http.url
        if args.rate is None:
            print(f"serving at {url}; measuring capacity for {args.calibrate:.0f} s", flush=True)
            capacity = in_process(closed_loop, url, args.concurrency, args.calibrate, args.max_tokens)
            rate = args.load * capacity
        else:
            capacity, rate = None, args.rate
        kinds = [k for k in args.kinds if k != "link cut" or netns]
        rss0 = rss(cluster)
        faults: list[Fault] = []
        t0 = time.monotonic()
        plan_ = schedule(args.duration, tuple(args.every), kinds, args.seed, t0)
        print(f"{rate:.1f} req/s for {args.duration:.0f} s with {len(plan_)} fault(s)", flush=True)
        stop = threading.Event()
        chaos = threading.Thread(target=run_faults, daemon=True,
                                 args=(cluster, plan_, args.freeze, faults, stop, t0))
        chaos.start()
        if args.verbose:
            threading.Thread(target=monitor, args=(cluster, stop, t0, 5.0), daemon=True).start()
        # The server's RSS at the end of the load: sampled while it runs, so the last sample comes
        # before this process holds the load's records (tens of MB for a long run).
        last = [rss0]
        records = [Record(*t) for t in in_process(open_loop, url, rate, args.duration,
                                                   args.max_tokens, args.seed,
                                                   while_waiting=lambda: last.__setitem__(0, rss(cluster)))]
        stop.set()
        chaos.join(timeout=300)
        rss1 = last[0]
    finally:
        if cluster is not None:
            cluster.close()
        if netns is not None:
            netns.close()
    table = report(records, faults, t0, args.duration, capacity, rate, rss0, rss1, netns_note)
    print(table)
    if not args.no_append:
        from benchdoc import write_section  # scripts/ is on the path
        cmd = " ".join(["python scripts/bench_chaos.py", *sys.argv[1:]])
        write_section("bench_chaos", table, heading=HEADING, command=cmd, load0=load0)


if __name__ == "__main__":
    main()
