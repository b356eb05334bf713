"""Check the analytic cost model against measured layer profiles, in and out of sample.

For every point of a measured profile folder (``prompt_bs2time.csv`` and ``decode_bs2time.csv``,
ms for one layer) the analytic roofline of :mod:`helix.core.costmodel` predicts the same batch; the
relative error ``|predicted - measured| / measured`` is summarised per folder and *per phase*
(prompt and decode apart: a pooled median hides a decode error behind the many good prompt
points). The profiles have no context dimension: decode points are compared at
``decode_context`` tokens, prompt points at a prompt context of ``min(P, 763) / 2``.

Three sets of efficiency factors (``compute_efficiency``, ``memory_efficiency``) are compared:

- *in sample*: each kind's catalog factors, fitted to these same profiles (:func:`fit_factors` on
  every folder of the kind);
- *leave one kind out*: one pair of factors fitted on the folders of every other GPU kind (all
  folders of the held-out kind left out: ``l4`` and ``l4x2`` go together), used on the held-out
  kind; this is how well the model's structure carries to a kind it was not fitted to;
- *default*: :data:`~helix.core.hardware.DEFAULT_COMPUTE_EFFICIENCY` /
  :data:`~helix.core.hardware.DEFAULT_MEMORY_EFFICIENCY`, what a kind without a profile gets.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from pathlib import Path
from statistics import median

from helix.core.costmodel import LayerWork, layer_work, work_time_s
from helix.core.errors import SpecError
from helix.core.hardware import DEFAULT_COMPUTE_EFFICIENCY, DEFAULT_MEMORY_EFFICIENCY, GpuKind, lookup_gpu
from helix.core.models import ModelSpec
from helix.core.profiles import load_profile

#: Profile folder names of the Helix artifact mapped to catalog GPU kinds.
FOLDER_GPU = {"a100": "A100-40G", "v100": "V100-16G", "l4": "L4", "t4": "T4"}

#: Prompt context of a prompt point: the mean prompt of the Azure conversation trace, halved.
PROMPT_MEAN_TOKENS = 763


@dataclass(frozen=True)
class PhaseError:
    """Median and worst relative error over one phase's points of one folder."""

    median: float
    worst: float

    @classmethod
    def of(cls, errors: list[float]) -> "PhaseError":
        return cls(median(errors), max(errors)) if errors else cls(math.nan, math.nan)


@dataclass(frozen=True)
class FolderPoints:
    """A profile folder's measured points, each with the work the analytic model sees."""

    folder: str
    gpu: GpuKind
    num_gpus: int
    prompt: tuple[tuple[LayerWork, float], ...]
    """(work, measured seconds) of each prompt point."""
    decode: tuple[tuple[LayerWork, float], ...]


@dataclass(frozen=True)
class CalibrationRow:
    """Relative errors of the analytic model over one profile folder's grid, per phase."""

    folder: str
    gpu: str
    num_gpus: int
    prompt_points: int
    decode_points: int
    prompt: PhaseError
    """In sample: the kind's catalog factors."""
    decode: PhaseError
    prompt_loko: PhaseError
    """Leave one kind out: factors fitted on the other kinds' folders."""
    decode_loko: PhaseError
    loko_factors: tuple[float, float]
    """(compute, memory) efficiency fitted without this kind."""
    prompt_default: PhaseError
    """Default factors: how a kind without a profile fares."""
    decode_default: PhaseError

    @property
    def points(self) -> int:
        return self.prompt_points + self.decode_points


def parse_folder(name: str) -> tuple[GpuKind, int]:
    """``l4x2`` -> (L4, 2). Raises SpecError for folders that name no known kind."""
    m = re.fullmatch(r"([a-z0-9]+?)(?:x(\d+))?", name.lower())
    kind = lookup_gpu(FOLDER_GPU.get(m.group(1), m.group(1))) if m else None
    if kind is None:
        raise SpecError(f"profile folder {name!r}: no known GPU kind")
    return kind, int(m.group(2) or 1)


def folder_points(model: ModelSpec, folder: Path, decode_context: float = 1024,
                  dtype_bytes: int = 2) -> FolderPoints:
    """The folder's points with their analytic work (contexts as the module docstring says)."""
    gpu, n = parse_folder(folder.name)
    profile = load_profile(folder, folder.name)
    prompt = tuple(
        (layer_work(model, dtype_bytes, tokens, 0, 0,
                    (min(tokens, PROMPT_MEAN_TOKENS) if length is None else length) / 2,
                    gpu.kv_reread_cost), seconds)
        for tokens, length, seconds in profile.prompt.rows() if tokens > 0)
    decode = tuple(
        (layer_work(model, dtype_bytes, 0, seqs, decode_context if context is None else context,
                    0, gpu.kv_reread_cost), seconds)
        for seqs, context, seconds in profile.decode.rows() if seqs > 0)
    return FolderPoints(folder.name, gpu, n, prompt, decode)


def relative_errors(points: FolderPoints, gpu: GpuKind | None = None
                    ) -> tuple[list[float], list[float]]:
    """(prompt, decode) relative errors of the model on ``gpu`` (default: the folder's kind)."""
    gpu = gpu or points.gpu

    def err(pairs: tuple[tuple[LayerWork, float], ...]) -> list[float]:
        return [abs(work_time_s(w, gpu, points.num_gpus) - s) / s for w, s in pairs]
    return err(points.prompt), err(points.decode)


def with_factors(gpu: GpuKind, compute: float, memory: float) -> GpuKind:
    return dataclasses.replace(gpu, compute_efficiency=compute, memory_efficiency=memory)


def _loss(folders: list[FolderPoints], compute: float, memory: float) -> float:
    """Mean |log(predicted / measured)|, prompt and decode weighted equally, over ``folders``."""
    phases: list[list[float]] = [[], []]
    for f in folders:
        gpu = with_factors(f.gpu, compute, memory)
        for phase, pairs in zip(phases, (f.prompt, f.decode)):
            phase.extend(abs(math.log(work_time_s(w, gpu, f.num_gpus) / s)) for w, s in pairs)
    return sum(sum(p) / len(p) for p in phases if p) / sum(1 for p in phases if p)


def fit_factors(folders: list[FolderPoints], compute: float | None = None) -> tuple[float, float]:
    """(compute, memory) efficiency minimising :func:`_loss` over ``folders``: a grid at 0.05,
    then at 0.01 around its best (compute 0.10-1.00, memory 0.30-1.00). With ``compute`` given,
    only the memory efficiency is fitted."""
    def search(cs: list[float], ms: list[float]) -> tuple[float, float]:
        return min(((c, m) for c in cs for m in ms), key=lambda cm: _loss(folders, *cm))
    coarse = [compute] if compute is not None else [x / 20 for x in range(2, 21)]
    c, m = search(coarse, [x / 20 for x in range(6, 21)])
    fine = [compute] if compute is not None else \
        [round(c + d / 100, 2) for d in range(-4, 5) if 0.05 <= c + d / 100 <= 1]
    return search(fine, [round(m + d / 100, 2) for d in range(-4, 5) if 0.2 <= m + d / 100 <= 1])


def load_folders(model: ModelSpec, root: str | Path, decode_context: float = 1024
                 ) -> list[FolderPoints]:
    return [folder_points(model, p, decode_context)
            for p in sorted(q for q in Path(root).iterdir() if q.is_dir())]


def calibrate(model: ModelSpec, root: str | Path, decode_context: float = 1024
              ) -> list[CalibrationRow]:
    """One row per profile folder under ``root`` (e.g. ``shared/data/profiles/llama1-30b``)."""
    folders = load_folders(model, root, decode_context)
    rows = []
    for f in folders:
        others = [g for g in folders if g.gpu.name != f.gpu.name]
        loko = fit_factors(others)
        default = with_factors(f.gpu, DEFAULT_COMPUTE_EFFICIENCY, DEFAULT_MEMORY_EFFICIENCY)
        p, d = relative_errors(f)
        pl, dl = relative_errors(f, with_factors(f.gpu, *loko))
        pd, dd = relative_errors(f, default)
        rows.append(CalibrationRow(f.folder, f.gpu.name, f.num_gpus, len(p), len(d),
                                   PhaseError.of(p), PhaseError.of(d), PhaseError.of(pl),
                                   PhaseError.of(dl), loko, PhaseError.of(pd), PhaseError.of(dd)))
    return rows


def fit_kinds(model: ModelSpec, root: str | Path, decode_context: float = 1024,
              keep_compute: bool = True) -> dict[str, tuple[float, float]]:
    """Each GPU kind's in-sample factors, fitted on all its folders (how the catalog's were);
    with ``keep_compute`` only the memory efficiency, the catalog's compute efficiency kept."""
    folders = load_folders(model, root, decode_context)
    kinds = sorted({f.gpu.name for f in folders})
    fitted = {}
    for kind in kinds:
        mine = [f for f in folders if f.gpu.name == kind]
        fitted[kind] = fit_factors(mine, mine[0].gpu.compute_efficiency if keep_compute else None)
    return fitted
