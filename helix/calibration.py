"""Check the analytic cost model against measured layer profiles.

For every point of a measured profile folder (``prompt_bs2time.csv`` and ``decode_bs2time.csv``,
ms for one layer) the analytic roofline of :mod:`helix.costmodel` predicts the same batch; the
relative error ``|predicted - measured| / measured`` is summarised per GPU kind. The profiles have
no context dimension: decode points are compared at ``decode_context`` tokens (1024 fits all kinds
best, see BENCHMARKS.md), prompt points at a prompt context of ``min(P, 763) / 2``.
"""

from __future__ import annotations

import dataclasses
import re
from statistics import median
from dataclasses import dataclass
from pathlib import Path

from helix.costmodel import analytic_layer_time_s
from helix.errors import SpecError
from helix.hardware import DEFAULT_COMPUTE_EFFICIENCY, DEFAULT_MEMORY_EFFICIENCY, GpuKind, lookup_gpu
from helix.models import ModelSpec
from helix.profiles import load_profile

#: Profile folder names of the Helix artifact mapped to catalog GPU kinds.
FOLDER_GPU = {"a100": "A100-40G", "v100": "V100-16G", "l4": "L4", "t4": "T4"}


@dataclass(frozen=True)
class CalibrationRow:
    """Relative errors of the analytic model over one profile folder's grid."""

    folder: str
    gpu: str
    num_gpus: int
    points: int
    median_error: float
    worst_error: float
    median_error_default: float
    """Same, with the default (uncalibrated) efficiency factors: how a kind without a profile fares."""
    worst_error_default: float


def parse_folder(name: str) -> tuple[GpuKind, int]:
    """``l4x2`` -> (L4, 2). Raises SpecError for folders that name no known kind."""
    m = re.fullmatch(r"([a-z0-9]+?)(?:x(\d+))?", name.lower())
    kind = lookup_gpu(FOLDER_GPU.get(m.group(1), m.group(1))) if m else None
    if kind is None:
        raise SpecError(f"profile folder {name!r}: no known GPU kind")
    return kind, int(m.group(2) or 1)


def relative_errors(model: ModelSpec, gpu: GpuKind, num_gpus: int, folder: Path,
                    decode_context: float = 1024, dtype_bytes: int = 2) -> list[float]:
    profile = load_profile(folder, folder.name)
    errors = []
    for tokens, length, measured in profile.prompt.rows():
        predicted = analytic_layer_time_s(model, gpu, num_gpus, dtype_bytes, tokens, 0, 0,
                                          (min(tokens, 763) if length is None else length) / 2)
        errors.append(abs(predicted - measured) / measured)
    for seqs, context, measured in profile.decode.rows():
        predicted = analytic_layer_time_s(model, gpu, num_gpus, dtype_bytes, 0, seqs,
                                          decode_context if context is None else context, 0)
        errors.append(abs(predicted - measured) / measured)
    return errors


def calibrate(model: ModelSpec, root: str | Path, decode_context: float = 1024
              ) -> list[CalibrationRow]:
    """One row per profile folder under ``root`` (e.g. ``shared/data/profiles/llama1-30b``)."""
    rows = []
    for folder in sorted(p for p in Path(root).iterdir() if p.is_dir()):
        gpu, n = parse_folder(folder.name)
        default = dataclasses.replace(gpu, compute_efficiency=DEFAULT_COMPUTE_EFFICIENCY,
                                      memory_efficiency=DEFAULT_MEMORY_EFFICIENCY)
        err = relative_errors(model, gpu, n, folder, decode_context)
        err_default = relative_errors(model, default, n, folder, decode_context)
        rows.append(CalibrationRow(folder.name, gpu.name, n, len(err), median(err), max(err),
                                   median(err_default), max(err_default)))
    return rows
