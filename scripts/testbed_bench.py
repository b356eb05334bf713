"""``geo_testbed.py --bench``: the planner's placement vs Swarm's on the testbed.

For each method, ``helix plan`` places the tiny model on a spec that describes the testbed (three
regions, one CPU node each, the testbed's latencies and tbf rate between them, the coordinator in
r0); ``helix simulate`` predicts it under a slice of the conversation trace; the testbed serves it
(Ray nodes in their namespaces, ``helix serve`` in r0) and ``helix bench``, run in r0, sends the
same slice. Decode tokens/s and TTFT of both, live and simulated, go to BENCHMARKS.md.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

METHODS = ("milp", "swarm")
HEADING = "## Geo testbed: planner vs region-blind placement (`scripts/geo_testbed.py --bench`)"


def testbed_spec(regions: tuple[str, ...], delay_ms, rate_mbit: float) -> str:
    """The cluster spec of the testbed: r0's node stands for a bigger machine (as local3's cpu-0)."""
    links = "\n".join(f"  - {{regions: [{regions[i]}, {regions[j]}], bandwidth: {rate_mbit:g}Mbps, "
                      f"latency: {delay_ms[i][j]:g}ms}}"
                      for i in range(len(regions)) for j in range(i + 1, len(regions)))
    nodes = "\n".join(
        f"  - {{name: {r}-cpu, gpu: CPU, " + ("gpus: 4, memory: 3000KiB" if k == 0 else "memory: 1500KiB")
        + f", region: {r}}}" for k, r in enumerate(regions))
    region_lines = "\n".join(f"  {r}: {{bandwidth: 1GB/s, latency: 100us}}" for r in regions)
    return f"""model: tiny-llama
dtype: float32
workload: {{mean_prompt_tokens: 48, mean_output_tokens: 16}}
serving: {{max_batch_seqs: 32, min_kv_requests: 8}}
regions:
{region_lines}
region_links:
{links}
coordinator: {{region: {regions[0]}}}
nodes:
{nodes}
"""


def _helix(*args: str, timeout: float = 600) -> None:
    helix = shutil.which("helix") or "helix"
    done = subprocess.run([helix, *args], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"helix {' '.join(args)}: {done.stderr[-2000:]}")


def _stats(d: dict) -> dict:
    return {"decode": d["decode_throughput_tokens_per_s"], "ttft_p50": d["ttft"]["p50_s"],
            "ttft_mean": d["ttft"]["mean_s"], "tpot_mean": d["request_decode_latency"]["mean_s"],
            "done": d["requests_completed"]}


def run_bench(net, work: Path, checkpoint: Path, serving_cls, load: dict) -> list[dict]:
    """One row per method: its placement, live and simulated numbers under ``load``
    (``num_requests``, ``rate``, ``max_prompt``, ``max_output``)."""
    spec = work / "spec.yaml"
    spec.write_text(testbed_spec(net.config.regions, net.config.delay_ms, net.config.rate_mbit))
    trace = ["--trace", "conv", "--max-prompt", str(load["max_prompt"]), "--max-output",
             str(load["max_output"]), "--num-requests", str(load["num_requests"]),
             "--rate", str(load["rate"]), "--seed", "0"]
    rows = []
    for k, method in enumerate(METHODS):
        plan, sim_json, live_json = work / f"{method}.yaml", work / f"{method}-sim.json", \
            work / f"{method}-live.json"
        _helix("plan", str(spec), "-m", method, "--time-limit", "30", "-o", str(plan))
        _helix("simulate", str(spec), "--plan", str(plan), "--mode", "online", *trace,
               "--json", str(sim_json))
        sub = work / f"b{k}"
        sub.mkdir()
        serving = serving_cls(net, sub)
        try:
            address = serving.start(checkpoint, plan, 180.0)
            host = address.rpartition(":")[0]
            helix = shutil.which("helix") or "helix"
            done = subprocess.run(net.exec_prefix(0) + [
                helix, "bench", f"http://{host}:8000", *trace, "--vocab-size", "300",
                "--json", str(live_json)], capture_output=True, text=True, timeout=600,
                env=serving.env)
            if not live_json.exists():
                raise RuntimeError(f"helix bench ({method}) wrote nothing: {done.stderr[-2000:]}")
        finally:
            serving.close()
        from helix.core.plan import Plan
        placed = Plan.load(plan).placements
        rows.append({"method": method,
                     "placement": ", ".join(f"{p.node} [{p.start},{p.end})" for p in placed),
                     "live": _stats(json.loads(live_json.read_text())),
                     "sim": _stats(json.loads(sim_json.read_text()))})
        print(f"{method}: live {rows[-1]['live']}  simulated {rows[-1]['sim']}", flush=True)
    return rows


def _f(x, scale=1.0, fmt="{:.2f}") -> str:
    return "-" if x is None else fmt.format(x * scale)


def benchmarks_entry(rows: list[dict], net_config, load: dict, measured: dict, loads) -> str:
    d = net_config.delay_ms
    lines = [
        "",
        f"Run of {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} "
        f"({os.cpu_count()} cores, CPU only, load average {loads[0]:.1f} -> {loads[1]:.1f}). "
        f"scripts/geo_testbed.py --bench: 3 regions in network namespaces, one-way "
        f"{d[0][1]:g}/{d[0][2]:g}/{d[1][2]:g} ms (r0-r1/r0-r2/r1-r2) from the user-space router, tbf "
        f"{net_config.rate_mbit:g} Mbit/s; measured RTT "
        + ", ".join(f"{k} {v[0]:.1f} ms" for k, v in measured["rtt_ms"].items())
        + f", one TCP stream r1->r0 {measured['tcp_mbit']:.0f} Mbit/s. Tiny LLaMA (8 layers, "
        f"float32), one Ray node per region (all on this machine's 2 shared cores), coordinator in "
        f"r0; conversation trace, prompts <= {load['max_prompt']}, outputs <= {load['max_output']}, "
        f"first {load['num_requests']} requests at {load['rate']:g} req/s (the trace's gaps "
        f"rescaled), the same slice for helix bench (live) and helix simulate (online).",
        "",
        ("| placement | layers | decode tok/s live / sim | TTFT p50 s live / sim | "
         "TTFT mean s live / sim | TPOT mean ms live / sim | done live / sim |"),
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lv, sm = r["live"], r["sim"]
        lines.append(
            f"| {r['method']} | {r['placement']} | {_f(lv['decode'], fmt='{:.1f}')} / "
            f"{_f(sm['decode'], fmt='{:.1f}')} | {_f(lv['ttft_p50'])} / {_f(sm['ttft_p50'])} | "
            f"{_f(lv['ttft_mean'])} / {_f(sm['ttft_mean'])} | {_f(lv['tpot_mean'], 1e3, '{:.0f}')} / "
            f"{_f(sm['tpot_mean'], 1e3, '{:.0f}')} | {lv['done']} / {sm['done']} |")
    return "\n".join(lines) + "\n"


def write_entry(entry: str) -> None:
    """``entry`` as this benchmark's block of BENCHMARKS.md (it carries its own stamp)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from benchdoc import write_section  # scripts/ is this script's import path
    write_section("geo_testbed", entry, heading=HEADING)
