"""One measured profile folder (written by ``helix profile``) beside the analytic roofline.

For every measured point the roofline (:func:`helix.core.costmodel.analytic_layer_time_s`, one
device, no tensor parallelism) times the same step of one layer: a prompt point of P tokens in
prompts of length L at a mean attention context of L / 2 (a whole prompt's tokens attend over
half of it on average; the planner charges prompts the same way), a decode point of D sequences
at its KV context. The model's shape and the dtype come from the folder's ``profile.yaml``; the
device's figures from the catalog kind the profile's device names (or one the user picks),
optionally with the peak and the bandwidth replaced. The ratio measured / model says how far the
roofline is from this device running this engine: above 1 the engine is slower than the model.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from pathlib import Path
from statistics import median

from helix.core.costmodel import analytic_layer_time_s
from helix.core.errors import HelixUserError
from helix.core.hardware import GPU_CATALOG, GiB, GpuKind, known_gpu_names, lookup_gpu
from helix.core.models import DTYPE_BYTES, ModelSpec
from helix.core.profiles import MeasuredProfile, load_profile

#: Devices the catalog lacks, each as (the entry whose figures stand in, the figures replaced,
#: why). NVIDIA H200 datasheet (SXM): 4.8 TB/s HBM3e and the H100 SXM's 989 TFLOPS dense FP16.
STAND_INS: dict[str, tuple[str, dict[str, float], str]] = {
    "H200": ("H100-80G", {"memory_bandwidth_bytes_per_s": 4.8e12},
             "the H200's 4.8 TB/s HBM3e (datasheet; same 989 TFLOPS dense FP16 as the H100 SXM)"),
}

PHASES = ("prompt", "decode")


@dataclass(frozen=True)
class Roofline:
    """The device figures the roofline runs with, and one line on where they come from."""

    kind: GpuKind
    source: str


@dataclass(frozen=True)
class PointRatio:
    """One measured point and the roofline's time for the same step of one layer."""

    phase: str
    """``prompt`` or ``decode``."""
    batch: float
    """Prompt tokens in the step (prompt) or decoding sequences (decode)."""
    context: float
    """Prompt length of each request (prompt) or KV tokens of each sequence (decode)."""
    measured_s: float
    model_s: float

    @property
    def ratio(self) -> float:
        """measured / model: above 1 the device is slower than the roofline says."""
        return self.measured_s / self.model_s


@dataclass(frozen=True)
class ProfileFolder:
    """A profile folder with the model and dtype its ``profile.yaml`` names."""

    profile: MeasuredProfile
    model: ModelSpec
    dtype: str

    @property
    def meta(self) -> dict:
        return self.profile.meta

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]


def read_folder(folder: Path) -> ProfileFolder:
    """The folder's profile, model and dtype; HelixUserError when ``profile.yaml`` lacks them."""
    if not folder.is_dir():
        raise HelixUserError(f"--profile {folder}: no such folder")
    profile = load_profile(folder, folder.name)
    meta = profile.meta
    if not isinstance(meta.get("model"), dict):
        raise HelixUserError(f"{folder}: profile.yaml names no model (a folder written by "
                             f"`helix profile` has one)")
    fields = {f.name for f in dataclasses.fields(ModelSpec)}
    try:
        model = ModelSpec(**{k: v for k, v in meta["model"].items() if k in fields})
    except TypeError as exc:   # a field missing
        raise HelixUserError(f"{folder}: profile.yaml model: {exc}") from None
    dtype = str(meta.get("dtype", ""))
    if dtype not in DTYPE_BYTES:
        raise HelixUserError(f"{folder}: profile.yaml dtype {dtype!r}; known: "
                             f"{', '.join(DTYPE_BYTES)}")
    return ProfileFolder(profile, model, dtype)


def _names(device_name: str) -> set[str]:
    """The words of a device name, and each two adjacent ones joined (``RTX 4090`` -> rtx4090)."""
    words = [w for w in re.split(r"[\s_-]+", device_name.lower()) if w]
    return set(words) | {a + b for a, b in zip(words, words[1:])}


def _stand_in(name: str) -> Roofline | None:
    """The stand-in entry for a device ``name`` names (``NVIDIA H200`` -> H100-80G, 4.8 TB/s)."""
    for key, (entry, figures, why) in STAND_INS.items():
        if key.lower() in _names(name):
            return Roofline(dataclasses.replace(lookup_gpu(entry), **figures),
                            f"the catalog has no {key}: its {entry} entry with {why}")
    return None


def _from_device_name(name: str) -> Roofline | None:
    """The catalog kind a CUDA device name names (a whole word of it: ``L40S`` is no L4), the
    one whose memory is closest to the size in the name when several share the family; or a
    stand-in."""
    stand_in = _stand_in(name)
    if stand_in is not None:
        return stand_in
    words = _names(name)
    kinds = [k for k in GPU_CATALOG.values()
             if k.name != "CPU" and k.name.split("-")[0].lower() in words]
    if not kinds:
        return None
    size = re.search(r"(\d+)\s*GB", name, re.IGNORECASE)
    kind = min(kinds, key=lambda k: abs(k.vram_bytes - (float(size.group(1)) * GiB if size else 0)))
    guessed = "" if size or len(kinds) == 1 else \
        " (the name gives no memory size: the smallest such entry; --gpu picks another)"
    return Roofline(kind, f"catalog entry {kind.name}, from the profile's device {name!r}{guessed}")


def choose_roofline(folder: ProfileFolder, gpu: str | None = None, tflops: float | None = None,
                    bandwidth_bytes_per_s: float | None = None) -> Roofline:
    """The device figures for ``folder``: ``gpu`` (a catalog kind or stand-in) if given, else
    the kind the profile's device names (a CPU profile: the catalog's CPU kind), then the peak
    (``tflops``, dense TFLOP/s) and memory bandwidth replaced where given."""
    device = str(folder.meta.get("device", ""))
    name = str(folder.meta.get("device_name", device))
    if gpu is not None:
        kind = lookup_gpu(gpu)
        roof = Roofline(kind, f"catalog entry {kind.name} (--gpu)") if kind else _stand_in(gpu)
        if roof is None:
            raise HelixUserError(f"--gpu {gpu!r}: unknown; known: {known_gpu_names()}, "
                                 f"{', '.join(STAND_INS)}")
    elif device == "cpu":
        roof = _cpu_roofline(name, folder.meta.get("torch_threads"), tflops, bandwidth_bytes_per_s)
    else:
        roof = _from_device_name(name)
        if roof is None:
            raise HelixUserError(f"the profile's device {name!r} is not in the catalog: pass --gpu "
                                 f"KIND ({known_gpu_names()}) and --tflops / --bandwidth-tbs")
    return _override(roof, tflops, bandwidth_bytes_per_s, folder.dtype, device == "cpu")


def _cpu_roofline(name: str, threads: object, tflops: float | None,
                  bandwidth_bytes_per_s: float | None) -> Roofline:
    kind = lookup_gpu("CPU")
    if kind is None:   # no CPU kind in the catalog: the user's figures, the default factors
        if tflops is None or bandwidth_bytes_per_s is None:
            raise HelixUserError(f"a CPU profile ({name}) and no CPU kind in the catalog: pass "
                                 f"--tflops and --bandwidth-gbs for this CPU")
        return Roofline(GpuKind("CPU", tflops * 1e12, bandwidth_bytes_per_s, 0.0, 0.0,
                                "--tflops / --bandwidth-gbs"),
                        f"this CPU ({name}) from --tflops / --bandwidth-gbs, default factors")
    return Roofline(kind, f"catalog entry CPU ({kind.source}) for the profile's {name}, "
                          f"{threads} torch threads: --tflops / --bandwidth-gbs give this "
                          f"CPU's own")


def _override(roof: Roofline, tflops: float | None, bandwidth_bytes_per_s: float | None,
              dtype: str, cpu: bool) -> Roofline:
    kind, notes = roof.kind, [roof.source]
    if tflops is not None:
        kind = dataclasses.replace(kind, fp16_flops=tflops * 1e12)
        notes.append(f"peak {tflops:g} TFLOP/s (--tflops)")
    if bandwidth_bytes_per_s is not None:
        kind = dataclasses.replace(kind, memory_bandwidth_bytes_per_s=bandwidth_bytes_per_s)
        notes.append(f"bandwidth {bandwidth_bytes_per_s / 1e9:g} GB/s (given)")
    if dtype == "float32" and not cpu and tflops is None:
        notes.append("the peak is the FP16 tensor one, a float32 profile runs below it (--tflops)")
    return Roofline(kind, "; ".join(notes))


def compare(folder: ProfileFolder, kind: GpuKind) -> list[PointRatio]:
    """Every measured point, prompt then decode, in the files' order, beside the roofline."""
    points = []
    for phase, surface in zip(PHASES, (folder.profile.prompt, folder.profile.decode)):
        for batch, context, seconds in surface.rows():
            if context is None:
                raise HelixUserError(f"{folder.profile.source}: {phase} rows without a context "
                                     f"column (`helix profile` writes batch,context,ms)")
            if phase == "prompt":
                model_s = analytic_layer_time_s(folder.model, kind, 1, folder.dtype_bytes,
                                                batch, 0, 0, context / 2)
            else:
                model_s = analytic_layer_time_s(folder.model, kind, 1, folder.dtype_bytes,
                                                0, batch, context, 0)
            points.append(PointRatio(phase, batch, context, seconds, model_s))
    return points


def ratio_table(points: list[PointRatio]) -> str:
    lines = [("| phase | batch (prompt tokens or decode seqs) | context (prompt length or KV "
              "tokens) | measured ms | model ms | measured / model |"), "|---|---|---|---|---|---|"]
    for p in points:
        lines.append(f"| {p.phase} | {p.batch:g} | {p.context:g} | {p.measured_s * 1e3:#.4g} | "
                     f"{p.model_s * 1e3:#.4g} | {p.ratio:#.3g} |")
    return "\n".join(lines)


def context_table(points: list[PointRatio]) -> str:
    """The ratios in brief, one row per phase and context: how many points (their batches), the
    median ratio and its range."""
    lines = [("| phase | context (prompt length or KV tokens) | points (batches) | measured / model, "
              "median | range |"), "|---|---|---|---|---|"]
    for phase in PHASES:
        for context in sorted({p.context for p in points if p.phase == phase}):
            mine = [p for p in points if p.phase == phase and p.context == context]
            ratios = [p.ratio for p in mine]
            batches = [p.batch for p in mine]
            lines.append(f"| {phase} | {context:g} | {len(mine)} ({min(batches):g}-{max(batches):g}) | "
                         f"{median(ratios):#.3g}x | {min(ratios):#.3g}x - {max(ratios):#.3g}x |")
    return "\n".join(lines)


def phase_summaries(points: list[PointRatio]) -> list[str]:
    """One line per phase: median ratio, range, and the point farthest from the model."""
    lines = []
    for phase in PHASES:
        mine = [p for p in points if p.phase == phase]
        if not mine:
            continue
        ratios = [p.ratio for p in mine]
        worst = max(mine, key=lambda p: abs(math.log(p.ratio)))
        at = "length" if phase == "prompt" else "context"
        lines.append(f"{phase}: {len(mine)} points, measured / model median "
                     f"{median(ratios):#.3g}x, range {min(ratios):#.3g}x - {max(ratios):#.3g}x; "
                     f"worst {worst.ratio:#.3g}x (batch {worst.batch:g}, {at} {worst.context:g})")
    return lines


def describe(folder: ProfileFolder, roof: Roofline) -> str:
    """Which measurement against which figures, in one paragraph."""
    m, k = folder.meta, roof.kind
    return (f"{folder.model.name} {folder.dtype}, one layer, measured by `helix profile` on "
            f"{m.get('device_name', m.get('device', '?'))} ({m.get('torch_threads', '?')} torch "
            f"threads, torch {m.get('torch_version', '?')}, {m.get('measured_at', '?')}), against "
            f"`helix.core.costmodel.analytic_layer_time_s` on one device: {roof.source}. Figures: "
            f"{k.fp16_flops / 1e12:g} TFLOP/s x {k.compute_efficiency:g}, "
            f"{k.memory_bandwidth_bytes_per_s / 1e9:g} GB/s x {k.memory_efficiency:g}, "
            f"{k.layer_overhead_s * 1e6:g} us per layer; prompt points at a mean attention "
            f"context of half the prompt length.")
