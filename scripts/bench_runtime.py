"""Runtime benchmarks for ``helix serve``; prints tables and writes them to BENCHMARKS.md.

1. Data plane: activation frames/s and GB/s between two processes through ``helix.net.data_plane``
   (``helix.net.wire`` messages built from and decoded back to ``InputBatch``/``StageInput``/tensors) vs raw
   pyzmq PUSH/PULL moving the same bytes, in the same run. Target: >= 70 % of raw (two frames,
   zero-copy); the fastest raw pattern for the size (one copied frame for small payloads) is shown too.
   ``--curve`` adds the data plane with cluster keys (ZeroMQ CURVE: encrypted, authenticated) beside
   the plain one, interleaved in the same run, with its ratio to plain.
2. Coordinator: pipeline decisions/s of the shared Helix scheduler (IWRR + KV masking, with worker-stat
   corrections) on a 42-node plan of ``cluster_specs/hetero42.yaml``. Target: >= 20k/s.
3. End to end: tokens/s and TTFT of 3 local Ray workers behind the OpenAI API vs the whole model in one
   single-process engine, same model (the demo checkpoint) and the same burst.

    python scripts/bench_runtime.py [--quick] [--no-write] [--only data,decisions,e2e] [--compare REV]
                                    [--curve]

Each part rewrites its own block of BENCHMARKS.md (``bench_runtime-data``, ``-decisions``,
``-e2e``), so ``--only data`` leaves the other parts' figures as they are.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


# --- 1. data plane -------------------------------------------------------------------------------
# Raw pyzmq patterns, each moving a small header and the same payload bytes:
RAW_PATTERNS = {
    "raw": "2 frames, zero-copy",       # the baseline of the target (helix >= 70 % of raw)
    "raw1": "1 frame, copied",          # header + payload joined: the fastest raw pattern for small frames
}
RAW_HEADER = b'{"id":0,"pos":0}'
CURVE = "helix+curve"


def bench_keys():
    """CURVE keys for the data plane (the TLS and token fields are not used by it)."""
    import zmq

    from helix.net.keys import ClusterKeys
    server, client = zmq.curve_keypair(), zmq.curve_keypair()
    return ClusterKeys(server[0], server[1], client[0], client[1], b"", b"", "unused-by-the-data-plane")


def _payload(shape: tuple[int, int]):
    """The tensor every message carries (seeded, so the receiver can check the last one bit for bit)."""
    import torch
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


def _use_code(code_dir: str | None) -> None:
    """Import ``worker`` from ``code_dir`` (an older revision's tree) instead of this checkout."""
    if code_dir:
        sys.path.insert(0, code_dir)


def _sender(kind: str, address: str, shape: tuple[int, int], count: int, code_dir: str | None,
            cpu_s, keys=None) -> None:
    """Send ``count`` messages; put this process's CPU seconds (its ZeroMQ I/O thread included) on
    ``cpu_s``."""
    import zmq
    _use_code(code_dir)
    hs = _payload(shape)
    if kind.startswith("helix"):
        from helix.net.data_plane import DataPlane
        from helix.net.io_types import StageInput
        from helix.net.wire import InputBatch, WireInput
        plane = DataPlane(keys=keys)
        plane.set_peers({"dst": address})
        c0 = time.process_time()
        for i in range(count):
            plane.send("dst", InputBatch((WireInput(StageInput(i, i, hidden_states=hs)),)))
        plane.close(linger_s=60.0)
        zmq.Context.instance().term()   # waits until every zero-copy frame has left
    else:
        sock = zmq.Context.instance().socket(zmq.PUSH)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.connect(address)
        payload = memoryview(hs.numpy()).cast("B")
        header = RAW_HEADER
        c0 = time.process_time()
        if kind == "raw":
            for _ in range(count):
                sock.send_multipart([header, payload], copy=False)
        else:
            for _ in range(count):
                sock.send(header + payload)
        sock.close(linger=60_000)
        zmq.Context.instance().term()
    cpu_s.put(time.process_time() - c0)


def _receive(kind: str, shape: tuple[int, int], count: int, code_dir: str | None,
             keys=None) -> tuple[float, float]:
    """(Seconds from the first to the last of ``count`` messages (the first is not timed), CPU seconds
    of both processes for the whole run, ZeroMQ I/O threads included). Every
    message's header is checked (helix: request id and position; raw: payload length) and the last
    payload bit for bit. Raw receivers, like the data plane, try a non-blocking receive before polling."""
    import torch
    import zmq
    _use_code(code_dir)
    ctx = mp.get_context("spawn")
    if kind.startswith("helix"):
        from helix.net.data_plane import DataPlane
        plane = DataPlane(keys=keys)
        address = plane.address
    else:
        sock = zmq.Context.instance().socket(zmq.PULL)
        sock.setsockopt(zmq.RCVHWM, 0)
        port = sock.bind_to_random_port("tcp://127.0.0.1")
        address = f"tcp://127.0.0.1:{port}"
        # raw: multipart, zero-copy; raw1: one part, copied (a plain recv, no RCVMORE query)
        recv = (lambda flags=0: sock.recv_multipart(flags, copy=False)) if kind == "raw" else \
            (lambda flags=0: [sock.recv(flags)])
    nbytes = shape[0] * shape[1] * 4
    send_cpu_s = ctx.Queue()
    proc = ctx.Process(target=_sender, args=(kind, address, shape, count, code_dir, send_cpu_s, keys))
    proc.start()
    t0 = None
    c0 = time.process_time()
    try:
        for i in range(count):
            if kind.startswith("helix"):
                msg = plane.recv(timeout_s=60.0)
                assert msg is not None, "data plane stalled"
                item = msg.inputs[0].item
                assert item.request_id == i and item.start_position == i and item.hidden_states.shape == shape
            else:
                try:
                    frames = recv(zmq.NOBLOCK)
                except zmq.Again:
                    assert sock.poll(60_000), "raw zmq stalled"
                    frames = recv()
                assert len(frames[-1]) == nbytes + (0 if kind == "raw" else len(RAW_HEADER))
            if i == 0:
                t0 = time.perf_counter()
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - c0 + send_cpu_s.get(timeout=120)
        last = item.hidden_states if kind.startswith("helix") else \
            torch.frombuffer(bytearray(frames[-1])[-nbytes:], dtype=torch.float32).view(shape)
        assert torch.equal(last, _payload(shape)), f"{kind}: the last payload arrived corrupted"
        return elapsed, cpu
    finally:
        proc.join(timeout=30)
        (plane.close() if kind.startswith("helix") else sock.close(linger=0))


def _receive_child(kind: str, shape: tuple[int, int], count: int, code_dir: str | None, results,
                   keys=None) -> None:
    try:
        results.put(_receive(kind, shape, count, code_dir, keys))
    except BaseException as exc:   # handed to the parent, which raises it
        results.put(exc)


def _run_pair(kind: str, shape: tuple[int, int], count: int, code_dir: str | None) -> tuple[float, float]:
    """One timed run in two fresh processes (receiver and sender), whichever code they run."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    keys = bench_keys() if kind == CURVE else None
    proc = ctx.Process(target=_receive_child, args=(kind, shape, count, code_dir, results, keys))
    proc.start()
    try:
        out = results.get(timeout=600)
    finally:
        proc.join(timeout=60)
    if isinstance(out, BaseException):
        raise out
    return out


def checkout_tree(rev: str) -> tuple[str, str]:
    """(``worker/`` of git revision ``rev`` extracted to a temporary folder, its short hash)."""
    import subprocess
    import tempfile
    short = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev], check=True,
                           capture_output=True, text=True).stdout.strip()
    folder = tempfile.mkdtemp(prefix=f"helix-{short}-")
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "worker"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)
    return folder, short


def bench_data_plane(quick: bool, compare: str | None = None, rounds: int = 6,
                     curve: bool = False) -> list[tuple]:
    """Rows per payload size: each raw pattern, helix, (``curve``) helix with CURVE, and
    (``compare``) helix at an older revision."""
    import shutil
    code = {kind: None for kind in (*RAW_PATTERNS, "helix", *((CURVE,) if curve else ()))}
    if compare:
        folder, short = checkout_tree(compare)
        code[f"helix@{short}"] = folder
    try:
        return _data_plane_rows(quick, code, rounds)
    finally:
        if compare:
            shutil.rmtree(folder, ignore_errors=True)


def _data_plane_rows(quick: bool, code: dict[str, str | None], rounds: int) -> list[tuple]:
    rows = []
    # Runs of ~1 s or more: with short runs, best-of-N favours whichever path is faster (a shorter run
    # more often fits in a quiet moment of a shared machine).
    for shape, count in (((256, 1024), 200 if quick else 1000), ((1, 4096), 4000 if quick else 20000)):
        nbytes = shape[0] * shape[1] * 4
        res, cpu = {}, {}
        for kind in tuple(code) * rounds:   # interleaved, best of all rounds (the machine is shared)
            dt, cpu_s = _run_pair(kind, shape, count, code[kind])
            res[kind] = max(res.get(kind, 0.0), (count - 1) / dt)
            cpu[kind] = min(cpu.get(kind, float("inf")), cpu_s / count)
        fastest = max(res[k] for k in RAW_PATTERNS)
        for kind in code:
            label = f"{kind} ({RAW_PATTERNS[kind]})" if kind in RAW_PATTERNS else kind
            if kind == CURVE:
                label += f" ({res[kind] / res['helix'] * 100:.0f} % of helix)"
            rows.append((f"{nbytes / 2**10:,.0f} KiB [{shape[0]}x{shape[1]}] fp32", label,
                         f"{res[kind]:,.0f}", f"{res[kind] * nbytes / 1e9:.2f}",
                         f"{res[kind] / res['raw'] * 100:.0f} %", f"{res[kind] / fastest * 100:.0f} %",
                         f"{cpu[kind] * 1e6:,.0f}"))
    return rows


# --- 2. coordinator decisions/s --------------------------------------------------------------------
def bench_decisions(quick: bool) -> list[tuple]:
    import logging
    logging.disable(logging.CRITICAL)
    from helix.core.spec import load_cluster
    from planner.build import build_problem
    from planner.solve import solve
    plan = solve(build_problem(load_cluster(ROOT / "cluster_specs" / "hetero42.yaml")), method="petals")
    n = 20_000 if quick else 100_000
    name = f"{len(plan.placements)} nodes, {plan.num_layers} layers (hetero42, petals placement)"
    rows = []
    # Saturated: about 60 requests of 1000 tokens fill a node, so about half the decisions find every
    # path masked (the oldest request then finishes). Ample: KV never masks anything.
    for label, requests_per_node in (("saturated", 60), ("ample KV", 10**9)):
        masked, rate = _decisions(plan, n, requests_per_node)
        rows.append((name, label, f"{n:,}", f"{masked:,}", f"{rate:,.0f}"))
    return rows


def _decisions(plan, n: int, requests_per_node: int) -> tuple[int, float]:
    from coordinator.kv_estimator import KVEstimator
    from coordinator.pipeline import RequestInfo
    from coordinator.schedulers import make_scheduler
    caps = {p.node: requests_per_node * 1000 * p.num_layers for p in plan.placements}
    sched = make_scheduler("helix", plan, KVEstimator(caps, high_water=0.9))
    live: deque[int] = deque()
    masked = 0
    t0 = time.perf_counter()
    for rid in range(n):
        if sched.schedule(RequestInfo(rid, 763, 237)) is None:
            masked += 1
            sched.release(live.popleft())   # every path is masked: the oldest request finishes
        else:
            live.append(rid)
            if len(live) > 5000:
                sched.release(live.popleft())
        if rid % 1000 == 0:   # a stats round: workers report real use (here: 90 % of the estimate)
            for node in caps:
                sched.kv.observe(node, 0.9 * sched.kv.used(node))
    return masked, n / (time.perf_counter() - t0)


# --- 3. end to end -----------------------------------------------------------------------------------
def bench_end_to_end(quick: bool) -> list[tuple]:
    import asyncio
    import statistics

    from helix import demo
    from helix.commands.demo_checkpoint import ensure_tiny_checkpoint
    from helix.server.http import HttpThread
    from helix.server.stack import ServeOptions, ServeStack
    n_req, max_tokens = (16, 16) if quick else (32, 32)
    ckpt = ensure_tiny_checkpoint()
    plan = demo.plan_local3()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    stack = ServeStack(plan, str(ckpt), ServeOptions(model_name="tiny-llama")).start()
    try:
        http = HttpThread(stack.app)
        asyncio.run(demo._burst(http.url, 4, 4))   # warm-up
        t0 = time.perf_counter()
        raw = asyncio.run(demo._burst(http.url, n_req, max_tokens))
        wall = time.perf_counter() - t0
        stats = {n: s for n, s in stack.coordinator.stats.items()}
        http.stop()
    finally:
        stack.close()
    toks = sum(r[1] for r in raw)
    ttft = sorted(r[2] for r in raw)
    rows = [("3 Ray workers + HTTP", n_req, toks, f"{toks / wall:,.0f}",
             f"{statistics.median(ttft) * 1000:.0f}", f"{ttft[-1] * 1000:.0f}")]
    rows.append(_single_process(ckpt, n_req, max_tokens))
    busy = ", ".join(f"{n}: {s.steps_total} steps x {s.step_time_s_avg * 1000:.1f} ms"
                     for n, s in sorted(stats.items()))
    return rows, busy, wall


def _single_process(ckpt: Path, n_req: int, max_tokens: int) -> tuple:
    import torch

    from coordinator.textcodec import TextCodec
    from helix import demo
    from helix.net.sampling import SamplingParams
    from worker.engine import SliceEngine
    from worker.engine_config import EngineConfig
    from worker.local_pipeline import LocalPipeline, Prompt
    torch.set_num_threads(1)
    codec = TextCodec(ckpt)
    prompts = [codec.encode_chat(demo._messages(i)) if i % 2 else codec.encode(demo._PROMPTS[i % 6])
               for i in range(n_req)]
    engine = SliceEngine.from_checkpoint(ckpt, 0, 8, EngineConfig(eos_token_ids=codec.eos_token_ids))
    pipe = LocalPipeline([engine])
    for i, p in enumerate(prompts):
        pipe.submit(Prompt(i, tuple(p), SamplingParams(temperature=0, max_tokens=max_tokens)))
    t0 = time.perf_counter()
    first: dict[int, float] = {}
    for _ in range(100_000):
        if not pipe.busy():
            break
        for o in pipe.step():
            first.setdefault(o.request_id, time.perf_counter() - t0)
    wall = time.perf_counter() - t0
    toks = sum(len(v) for v in pipe.tokens.values())
    ttft = sorted(first.values())
    return ("1 engine, one process", n_req, toks, f"{toks / wall:,.0f}",
            f"{ttft[len(ttft) // 2] * 1000:.0f}", f"{ttft[-1] * 1000:.0f}")


# --- report ----------------------------------------------------------------------------------------
def table(headers: tuple, rows: list[tuple]) -> str:
    cells = [tuple(str(c) for c in r) for r in [headers, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    fmt = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"
    return "\n".join([fmt(cells[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|",
                      *map(fmt, cells[1:])])


PARTS = ("data", "decisions", "e2e")


def parse_only(values: list[str] | None) -> tuple[str, ...]:
    """The parts named by ``--only`` (repeatable, each a comma list), in run order; all when none."""
    if not values:
        return PARTS
    named = {p.strip() for v in values for p in v.split(",") if p.strip()}
    unknown = sorted(named - set(PARTS))
    if unknown:
        raise SystemExit(f"--only: unknown part {', '.join(map(repr, unknown))}; known: {', '.join(PARTS)}")
    return tuple(p for p in PARTS if p in named)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer frames, requests and decisions")
    ap.add_argument("--no-write", action="store_true", help="do not write BENCHMARKS.md")
    ap.add_argument("--only", action="append", metavar="PARTS",
                    help=f"run only these parts (comma list or repeated; of {', '.join(PARTS)})")
    ap.add_argument("--skip-e2e", action="store_true", help="same as leaving e2e out of --only")
    ap.add_argument("--rounds", type=int, default=6, help="data plane: interleaved runs per path (best kept)")
    ap.add_argument("--curve", action="store_true",
                    help="data plane: also time it with cluster keys (ZeroMQ CURVE), same run")
    ap.add_argument("--compare", metavar="REV",
                    help="data plane: also time the worker/ code of git revision REV (same run)")
    args = ap.parse_args()
    load_at_start = os.getloadavg()[0]
    parts = tuple(p for p in parse_only(args.only) if not (args.skip_e2e and p == "e2e"))
    out = {}
    if "data" in parts:
        rows = bench_data_plane(args.quick, args.compare, args.rounds, args.curve)
        out["data"] = (f"Data plane (two processes, loopback, best of {args.rounds} interleaved runs; target: "
                       "helix >= 70 % of raw; CPU: both processes per message, least of the runs):\n\n"
                       + table(("payload", "path", "frames/s", "GB/s", "vs raw", "vs fastest raw",
                                "CPU µs/msg"), rows))
        print(out["data"], "\n", flush=True)
    if "decisions" in parts:
        out["decisions"] = ("Coordinator pipeline decisions (IWRR + KV masking, stats corrections every "
                            "1000):\n\n" + table(("plan", "KV", "decisions", "masked (None)", "decisions/s"),
                                                  bench_decisions(args.quick)))
        print(out["decisions"], "\n", flush=True)
    if "e2e" in parts:
        rows, busy, wall = bench_end_to_end(args.quick)
        out["e2e"] = ("End to end, demo checkpoint (tiny-llama, 8 layers, hidden 64), greedy burst, local3 "
                      "plan:\n\n" + table(("setup", "requests", "output tokens", "tokens/s", "TTFT p50 ms",
                                            "TTFT max ms"), rows)
                      + f"\n\nWorker busy time in the distributed run ({wall:.2f} s wall): {busy}.")
        print(out["e2e"], flush=True)
    if not args.no_write:
        from benchdoc import write_section  # scripts/ is this script's import path
        cmd = "python scripts/bench_runtime.py" + (" --quick" if args.quick else "") + \
            ("" if parts == PARTS else f" --only {','.join(parts)}") + \
            (f" --compare {args.compare}" if args.compare else "") + \
            (" --curve" if args.curve else "") + \
            (f" --rounds {args.rounds}" if args.rounds != 6 else "")
        for part, text in out.items():
            write_section(f"bench_runtime-{part}", text, heading=HEADING, command=cmd, load0=load_at_start)


HEADING = "## Runtime: data plane, coordinator, end to end (`scripts/bench_runtime.py`)"


if __name__ == "__main__":
    main()
