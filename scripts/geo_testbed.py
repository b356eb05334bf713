"""Emulated regions with real delay: serve a plan across Ray nodes in separate network namespaces.

Usage (root; a benchmark harness, not part of CI)::

    python scripts/geo_testbed.py                 # network probes, then serve the tiny model across 3 regions
    python scripts/geo_testbed.py --net-only      # only build the network and measure it

Three regions are three network namespaces joined through a router namespace whose user-space
router delays every packet by its link's one-way latency (40, 60, 80 ms between regions by default)
and whose ``tc tbf`` caps the rate into each region (150 Mbit/s); see scripts/testbed_net.py. The
script measures the round trip (UDP echo) of every region pair and one TCP bulk transfer, then
starts one Ray node per region (``ray start --block`` inside the namespace, the head in r0, each
declaring ``helix_node:<region>-cpu``), runs ``helix serve --address`` in r0 on a 3-stage plan of the
tiny demo checkpoint (r0 [0,3) -> r1 [3,6) -> r2 [6,8)), sends a few greedy requests over gRPC from
r0 and checks them token for token against ``transformers``; it prints TTFT and time per output
token beside the sum of the links' latencies a token crosses (r0 -> r1 -> r2 -> r0).

Everything it made (processes by process group and by namespace, the namespaces and their veths,
temp folders) is removed on exit, on failure and on Ctrl-C / SIGTERM. Names carry a random run id,
so parallel runs never collide. ``--bench`` (scripts/testbed_bench.py) then
serves the planner's placement and Swarm's of a spec describing the testbed, loads each with the same
trace slice (``helix bench`` in r0) and writes live beside simulated numbers to BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))   # testbed_net beside this script
from testbed_net import (
    NetConfig,
    Network,
    kill_group,
    namespaces_available,
    probe_rate_mbit,
    probe_rtt_ms,
)

REPO = Path(__file__).resolve().parent.parent
PROMPTS = ["Helix serves one large language model", "Each worker holds a slice",
           "The placement maximizes the max flow", "regions of mixed GPUs"]
RAY_PORT = 6379
GRPC_PORT = 50051


def delay_matrix(pairs_ms: list[float], n: int) -> tuple[tuple[float, ...], ...]:
    """Symmetric one-way latencies from the upper triangle in row order (0-1, 0-2, ..., 1-2, ...)."""
    want = n * (n - 1) // 2
    if len(pairs_ms) != want:
        raise SystemExit(f"error: --delay-ms needs {want} values for {n} regions, got {len(pairs_ms)}")
    m = [[0.0] * n for _ in range(n)]
    it = iter(pairs_ms)
    for i in range(n):
        for j in range(i + 1, n):
            m[i][j] = m[j][i] = next(it)
    return tuple(tuple(r) for r in m)


def measure_network(net: Network, seconds: float) -> dict:
    """Median UDP round trip of every region pair and one TCP transfer r1 -> r0 (into r0)."""
    n = len(net.config.regions)
    rtts = {}
    for i in range(n):
        for j in range(i + 1, n):
            got = probe_rtt_ms(net, i, j, 10)
            rtts[f"{net.config.regions[i]}-{net.config.regions[j]}"] = \
                (statistics.median(got) if got else None, len(got))
            print(f"rtt {net.config.regions[i]} <-> {net.config.regions[j]}: median "
                  f"{rtts[f'{net.config.regions[i]}-{net.config.regions[j]}'][0]:.2f} ms over "
                  f"{len(got)}/10 (2 x one-way {net.config.delay_ms[i][j]:g} ms = "
                  f"{2 * net.config.delay_ms[i][j]:g})", flush=True)
    rate = probe_rate_mbit(net, 1, 0, seconds)
    print(f"tcp {net.config.regions[1]} -> {net.config.regions[0]}: {rate:.1f} Mbit/s over "
          f"{seconds:g} s (tbf {net.config.rate_mbit:g} Mbit/s)", flush=True)
    return {"rtt_ms": rtts, "tcp_mbit": rate}


def three_stage_plan(regions: tuple[str, ...]):
    """The tiny model's 8 layers cut into one contiguous slice per region, in region order."""
    import dataclasses

    from helix.core.plan import ArcFlow, Plan
    from helix.core.serving import ServingLimits, ServingSpec
    from helix.core.slices import LayerSlice
    nodes = [f"{r}-cpu" for r in regions]
    cuts = [round(8 * k / len(nodes)) for k in range(len(nodes) + 1)]
    hops = ["coordinator", *nodes, "coordinator"]
    plan = Plan(model="tiny-llama", num_layers=8,
                placements=tuple(LayerSlice(n, cuts[k], cuts[k + 1]) for k, n in enumerate(nodes)),
                arc_flows=tuple(ArcFlow(a, b, 100.0) for a, b in zip(hops, hops[1:])),
                max_flow_tokens_per_s=100.0, method="geo-testbed")
    return dataclasses.replace(plan, serving=ServingLimits.of(ServingSpec(), "float32",
                                                              {n: 8192 for n in nodes}))


class Serving:
    """The Ray nodes and ``helix serve`` of one run; :meth:`close` stops them by process group."""

    def __init__(self, net: Network, work: Path):
        self.net, self.work = net, work
        self.procs: list[subprocess.Popen] = []
        self.env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
                    "PYTHONPATH": str(REPO)}

    def _spawn(self, region: int, args: list[str], log: str) -> subprocess.Popen:
        out = open(self.work / log, "w")
        # One temp folder per Ray node: nodes on one machine sharing one collide on their sockets.
        tmp = self.work / f"ray{region}"
        tmp.mkdir(exist_ok=True)   # also --temp-dir of its node: RAY_TMPDIR alone is not enough
        proc = subprocess.Popen(self.net.exec_prefix(region) + args, stdout=out,
                                stderr=subprocess.STDOUT, env={**self.env, "RAY_TMPDIR": str(tmp)},
                                cwd=REPO,
                                start_new_session=True)
        self.procs.append(proc)
        return proc

    def start(self, checkpoint: Path, plan_path: Path, timeout_s: float) -> str:
        """Start the Ray nodes and ``helix serve``; returns the coordinator's gRPC address."""
        head = self.net.host(0)
        ray = shutil.which("ray") or "ray"
        for i, region in enumerate(self.net.config.regions):
            where = ["--head", f"--port={RAY_PORT}", "--include-dashboard=false"] if i == 0 else \
                [f"--address={head}:{RAY_PORT}"]
            self._spawn(i, [ray, "start", "--block", *where, f"--node-ip-address={self.net.host(i)}",
                            "--num-cpus=0", "--disable-usage-stats",
                            f"--temp-dir={self.work / f'ray{i}'}",
                            f"--resources={json.dumps({f'helix_node:{region}-cpu': 1})}"],
                        f"ray-{region}.log")
            if i == 0:
                time.sleep(3)   # the head's GCS first
        helix = shutil.which("helix") or "helix"
        serve = self._spawn(0, [helix, "serve", str(plan_path), "--model", str(checkpoint),
                                "--address", f"{head}:{RAY_PORT}", "--host", head, "--port", "8000",
                                "--grpc-port", str(GRPC_PORT), "--node-timeout", str(timeout_s)],
                            "serve.log")
        deadline = time.monotonic() + timeout_s + 60
        while "workers ready" not in (self.work / "serve.log").read_text():
            if serve.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("helix serve did not become ready:\n" +
                                   (self.work / "serve.log").read_text()[-3000:])
            time.sleep(0.5)
        return f"{head}:{GRPC_PORT}"

    def close(self) -> None:
        for proc in reversed(self.procs):   # helix serve first, then the nodes, the head last
            kill_group(proc)


def run_client(address: str, prompts: list[list[int]], max_tokens: int) -> list[dict]:
    """Greedy requests one after another; each: token ids, TTFT and mean time per output token."""
    from helix.client import Client
    out = []
    with Client(address) as client:
        for ids in prompts:
            t0 = time.perf_counter()
            times, tokens = [], []
            for chunk in client.stream(ids, temperature=0, max_tokens=max_tokens):
                if chunk.token_ids:
                    times.append(time.perf_counter() - t0)
                    tokens += list(chunk.token_ids)
            tpot = (times[-1] - times[0]) / (len(tokens) - 1) if len(tokens) > 1 else None
            out.append({"tokens": tokens, "ttft_s": times[0], "tpot_s": tpot})
    return out


def serve_and_check(net: Network, work: Path, max_tokens: int, timeout_s: float) -> bool:
    import torch
    from transformers import AutoTokenizer

    from helix.commands.demo_checkpoint import write_tiny_checkpoint
    work.mkdir(exist_ok=True)
    ckpt = work / "tiny"
    model = write_tiny_checkpoint(ckpt)
    tok = AutoTokenizer.from_pretrained(ckpt)
    prompts = [tok.encode(p) for p in PROMPTS]
    plan_path = work / "plan.yaml"
    three_stage_plan(net.config.regions).save(plan_path)
    serving = Serving(net, work)
    try:
        t0 = time.monotonic()
        address = serving.start(ckpt, plan_path, timeout_s)
        print(f"serving: 3 Ray nodes + helix serve ready in {time.monotonic() - t0:.1f} s; "
              f"gRPC {address}", flush=True)
        done = subprocess.run(net.exec_prefix(0) + [
            sys.executable, __file__, "client", address, json.dumps(prompts), str(max_tokens)],
            capture_output=True, text=True, timeout=300, env=serving.env, cwd=REPO)
        print(done.stderr[-2000:], file=sys.stderr)
        if done.returncode != 0:
            raise RuntimeError(f"client failed: {done.stderr[-3000:]}")
        results = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        serving.close()
    ok = True
    d = net.config.delay_ms
    ring_ms = sum(d[i][(i + 1) % len(d)] for i in range(len(d)))
    for ids, got in zip(prompts, results):
        with torch.no_grad():
            ref = model.generate(torch.tensor([ids]), max_new_tokens=max_tokens, do_sample=False,
                                 eos_token_id=2, pad_token_id=0)[0, len(ids):].tolist()
        same = got["tokens"] == ref
        ok &= same
        tpot = f"{got['tpot_s'] * 1e3:.0f}" if got["tpot_s"] is not None else "-"
        print(f"request {len(ids)} prompt tokens: {'same as transformers' if same else 'DIFFERS'}"
              f" ({len(got['tokens'])} tokens), TTFT {got['ttft_s'] * 1e3:.0f} ms, TPOT {tpot} ms "
              f"(links crossed per token: {ring_ms:g} ms)", flush=True)
    return ok


def bench(net: Network, work: Path, measured: dict, args) -> None:
    from testbed_bench import benchmarks_entry, run_bench, write_entry
    load = {"num_requests": args.num_requests, "rate": args.rate, "max_prompt": 200, "max_output": 32}
    before = os.getloadavg()[0]
    rows = run_bench(net, work, work / "check" / "tiny", Serving, load)
    entry = benchmarks_entry(rows, net.config, load, measured, (before, os.getloadavg()[0]))
    write_entry(entry)
    print(entry, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--delay-ms", default="40,60,80",
                    help="one-way latency between regions, pairs r0-r1,r0-r2,r1-r2 (default 40,60,80)")
    ap.add_argument("--rate-mbit", type=float, default=150.0, help="tbf rate into each region")
    ap.add_argument("--mtu", type=int, default=9000, help="MTU of every link (default 9000)")
    ap.add_argument("--net-only", action="store_true", help="build the network, measure it, stop")
    ap.add_argument("--bench", action="store_true",
                    help="after the check: the planner's placement vs Swarm's, live (helix bench) and "
                         "simulated (helix simulate) on one trace slice, written to BENCHMARKS.md")
    ap.add_argument("--num-requests", type=int, default=60, help="--bench: trace requests sent")
    ap.add_argument("--rate", type=float, default=6.0, help="--bench: requests/s")
    ap.add_argument("--tcp-seconds", type=float, default=5.0, help="length of the TCP bulk probe")
    ap.add_argument("--max-tokens", type=int, default=8, help="tokens per request")
    ap.add_argument("--node-timeout", type=float, default=180.0,
                    help="seconds helix serve waits for the Ray nodes")
    args = ap.parse_args(argv)
    why = namespaces_available()
    if why is not None:
        print(f"geo_testbed: cannot run here: {why}", file=sys.stderr)
        return 2
    regions = ("r0", "r1", "r2")
    config = NetConfig(regions=regions, rate_mbit=args.rate_mbit, mtu=args.mtu,
                       delay_ms=delay_matrix([float(x) for x in args.delay_ms.split(",")], 3))
    net = Network("hx" + os.urandom(3).hex(), config)
    work = Path(tempfile.mkdtemp(prefix=f"{net.run_id}-", dir="/tmp"))

    def stop(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    print(f"geo_testbed run {net.run_id}: load average {os.getloadavg()}", flush=True)
    try:
        net.up()
        measured = measure_network(net, args.tcp_seconds)
        if args.net_only:
            return 0
        ok = serve_and_check(net, work / "check", args.max_tokens, args.node_timeout)
        print("geo_testbed: outputs " + ("match transformers" if ok else "DIFFER"), flush=True)
        if ok and args.bench:
            bench(net, work, measured, args)
        return 0 if ok else 1
    finally:
        # Teardown must not be cut short by a second Ctrl-C.
        for s in old:
            signal.signal(s, signal.SIG_IGN)
        net.down()
        shutil.rmtree(work, ignore_errors=True)
        r = net.router_stats
        if r and r["packets"]:
            print(f"router: {r['packets']} packets, released late by {r['late_sum_s'] / r['packets'] * 1e3:.2f}"
                  f" ms on average (max {r['late_max_s'] * 1e3:.1f} ms; {r['over_1ms']} over 1 ms, "
                  f"{r['over_10ms']} over 10 ms)", flush=True)
        print(f"geo_testbed run {net.run_id}: torn down; load average {os.getloadavg()}", flush=True)
        for s, h in old.items():
            signal.signal(s, h)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "client":
        print(json.dumps(run_client(sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]))))
        sys.exit(0)
    sys.exit(main())
