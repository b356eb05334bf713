"""``helix profile MODEL``: measure the serving engine's layer times on this machine, for the planner.

Runs :mod:`worker.profile` (the engine ``helix serve`` runs, with random weights of MODEL's shapes) on
the local device and writes a profile folder that a cluster spec names under
``performance.profiles``, so the planner and the simulator charge this node kind measured times
instead of the roofline. Profile each node kind once, with the dtype and threads it will serve with.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Optional

import typer

from helix.core.errors import HelixUserError


def register(app: typer.Typer) -> None:
    app.command("profile")(profile_command)


def profile_command(
    model: str = typer.Argument(..., help="Catalog name (e.g. llama-2-7b), checkpoint folder with "
                                          "config.json or GGUF file. Weights are random: step times depend on "
                                          "shapes and dtype, not on values."),
    output: Optional[Path] = typer.Option(None, "-o", "--output",
                                          help="Profile folder to write (default: "
                                               "profiles/MODEL-DEVICE-DTYPE)."),
    device: str = typer.Option("auto", "--device", help="auto (CUDA when present) | cpu | cuda | cuda:N."),
    dtype: str = typer.Option("auto", "--dtype",
                              help="auto (float16 on CUDA, float32 on CPU) | float32 | float16 | "
                                   "bfloat16: the spec's dtype, which the workers serve with."),
    threads: int = typer.Option(0, "--threads", min=0,
                                help="Torch threads (0 = OMP_NUM_THREADS if set, else every core this "
                                     "process may use). Use what the worker will run with."),
    quick: bool = typer.Option(False, "--quick", help="A tiny grid: seconds, for tests and a first look."),
    prompt_lengths: Optional[str] = typer.Option(None, "--prompt-lengths",
                                                 help="Prompt tokens per request, e.g. 64,256,1024."),
    max_prompt_tokens: Optional[int] = typer.Option(None, "--max-prompt-tokens", min=1,
                                                    help="Most prompt tokens in one step (requests of "
                                                         "one length are batched 1, 2, 4, ... up to it)."),
    contexts: Optional[str] = typer.Option(None, "--contexts",
                                           help="Decode contexts (KV tokens per sequence), e.g. 128,512."),
    seqs: Optional[str] = typer.Option(None, "--seqs", help="Decode batch sizes, e.g. 1,4,16,64."),
    reps: Optional[int] = typer.Option(None, "--reps", min=1,
                                       help="Timed steps per point after a warm-up; the fastest "
                                            "counts (other processes only ever slow a step down)."),
    layers: Optional[int] = typer.Option(None, "--layers", min=1,
                                         help="Layers the measured engine holds; one layer costs "
                                              "their model run over their number."),
) -> None:
    """Measure per-layer prompt and decode step times of the serving engine on this device.

    Writes prompt_bs2time.csv and decode_bs2time.csv (batch, context, ms for one layer) and profile.yaml (device, dtype, threads, the step's fixed cost apart from its layers, for a middle stage and for a last stage, which also samples) into a folder. Name the folder in a cluster spec, performance: {profiles: {LABEL: FOLDER}} with LABEL the nodes' gpu label (CPU, L4, L4x2, ...), and `helix plan` and `helix simulate` use the measured times. Defaults: a grid for the device (--quick for a tiny one), the device's usual dtype, every core.
    """
    import dataclasses

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from helix.core.models import DTYPE_BYTES, resolve_model
    from helix.core.profiles import write_profile
    spec = resolve_model(model)
    dev = _device(device)
    dtype = ("float32" if dev == "cpu" else "float16") if dtype == "auto" else dtype
    if dtype not in DTYPE_BYTES:
        raise HelixUserError(f"--dtype {dtype!r}: known: auto, {', '.join(DTYPE_BYTES)}")
    import torch
    torch.set_num_threads(_threads(threads))
    from worker.profile import ProfileGrid, free_memory_bytes, measure
    grid = ProfileGrid.quick() if quick else ProfileGrid.default(dev.split(":")[0])
    overrides = {k: v for k, v in dict(prompt_lengths=_ints(prompt_lengths, "--prompt-lengths"),
                                       max_prompt_tokens=max_prompt_tokens,
                                       decode_contexts=_ints(contexts, "--contexts"),
                                       decode_seqs=_ints(seqs, "--seqs"), reps=reps,
                                       layers=layers).items() if v is not None}
    grid = dataclasses.replace(grid, **overrides).fit_to(spec.max_position_embeddings)
    if not grid.prompt_points() or not grid.decode_points():
        raise HelixUserError(f"nothing to measure: model {spec.name!r} holds "
                             f"{spec.max_position_embeddings} positions and the decodes run "
                             f"{grid.decode_advance} past their context (fewer --reps or --seqs)")
    free = free_memory_bytes(dev)
    if free is not None:   # fewer layers rather than running out of memory half-way
        fitted = grid.fit_memory(spec, DTYPE_BYTES[dtype], dev == "cpu" and dtype == "float32", free)
        if fitted.layers < grid.layers:
            typer.echo(f"note: the engine holds {fitted.layers} layer(s), not {grid.layers}: that is "
                       f"what fits in the {free / 2**30:.1f} GiB free")
        grid = fitted
    folder = output or Path("profiles") / f"{spec.name}-{dev.replace(':', '')}-{dtype}"
    if folder.exists() and not folder.is_dir():
        raise HelixUserError(f"-o {folder}: exists and is not a folder")
    t0 = time.perf_counter()
    columns = (TextColumn("{task.description:<34}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, transient=True) as bar:
        task = bar.add_task("starting", total=grid.num_points + 2)   # + the last stage's two
        result = measure(spec, grid, dev, dtype,
                         advance=lambda what: bar.update(task, advance=1, description=what))
    meta = _metadata(spec, dev, dtype, grid, time.perf_counter() - t0)
    write_profile(folder, list(result.prompt), list(result.decode), meta,
                  list(result.prompt_overhead), list(result.decode_overhead),
                  list(result.last_prompt_overhead), list(result.last_decode_overhead))
    typer.echo(f"wrote {folder}: {len(result.prompt)} prompt and {len(result.decode)} decode points "
               f"({meta['device_name']}, {dtype}, {meta['torch_threads']} threads, "
               f"{meta['seconds']:.1f} s)")
    typer.echo(f"use it in a cluster spec:  performance: {{profiles: {{{_label(dev)}: {folder}}}}}")


def _ints(text: Optional[str], option: str) -> Optional[tuple[int, ...]]:
    if text is None:
        return None
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise HelixUserError(f"{option} {text!r}: expected positive integers separated by commas")
    return tuple(sorted(set(values)))


def _device(device: str) -> str:
    import torch
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return device
    if device == "cuda" or device.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise HelixUserError(f"--device {device}: no CUDA device here (torch {torch.__version__})")
        return device
    raise HelixUserError(f"--device {device!r}: expected auto, cpu, cuda or cuda:N")


def _threads(asked: int) -> int:
    """The user's setting (``--threads``, else ``OMP_NUM_THREADS``), else every core we may use."""
    import torch
    if asked:
        return asked
    if os.environ.get("OMP_NUM_THREADS"):
        return torch.get_num_threads()
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:   # not on Linux
        return os.cpu_count() or 1


def _device_name(dev: str) -> str:
    import platform

    import torch
    if dev.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(dev))
    try:   # Linux names the CPU model here; platform.processor() is often empty
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _label(dev: str) -> str:
    """The spec label this device most likely has (``CPU``, a catalog GPU), else ``LABEL``."""
    if dev == "cpu":
        return "CPU"
    import torch
    return gpu_label(_device_name(dev), torch.cuda.get_device_properties(torch.device(dev)).total_memory)


def gpu_label(device_name: str, memory_bytes: float) -> str:
    """The catalog GPU whose name is in ``device_name`` (``NVIDIA A100-SXM4-80GB`` -> A100-*),
    the one whose memory is closest when several are; ``LABEL`` when none is."""
    from helix.core.hardware import GPU_CATALOG
    squashed = device_name.lower().replace(" ", "").replace("-", "")
    kinds = [k for k in GPU_CATALOG.values()
             if k.name != "CPU" and k.name.split("-")[0].lower() in squashed]
    if not kinds:
        return "LABEL"
    longest = max(len(k.name.split("-")[0]) for k in kinds)   # A100 over A10G's prefix, ...
    kinds = [k for k in kinds if len(k.name.split("-")[0]) == longest]
    return min(kinds, key=lambda k: abs(k.vram_bytes - memory_bytes)).name


def _metadata(spec, dev, dtype, grid, seconds) -> dict:
    import dataclasses
    import datetime

    import torch
    meta = {
        "helix_profile": 1,
        "model": dataclasses.asdict(spec),
        "device": dev, "device_name": _device_name(dev), "dtype": dtype,
        "torch_threads": torch.get_num_threads(), "torch_version": str(torch.__version__),
        "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(seconds, 2),
        "grid": dataclasses.asdict(grid),
    }
    return json.loads(json.dumps(meta, default=str))   # plain lists and strings for YAML
