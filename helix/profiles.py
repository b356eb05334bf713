"""Measured layer profiles: milliseconds for ONE transformer layer, as measured on a real GPU.

Format (the Helix artifact's, see ``shared/data/profiles``): a folder with two headerless CSV files,
``prompt_bs2time.csv`` (total prompt tokens in the batch -> ms) and ``decode_bs2time.csv`` (decode
sequences in the batch, one token each -> ms). Context length is not a dimension. A mixed batch
costs prompt(P) + decode(D), each interpolated piecewise-linearly and extrapolated past the last
point along the last segment's slope.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path

from helix.errors import SpecError

PROMPT_FILE = "prompt_bs2time.csv"
DECODE_FILE = "decode_bs2time.csv"


@dataclass(frozen=True)
class Curve:
    """A piecewise-linear function from batch size to seconds, with sorted distinct x."""

    x: tuple[float, ...]
    seconds: tuple[float, ...]

    def __call__(self, value: float) -> float:
        if value <= 0:
            return 0.0
        xs, ys = self.x, self.seconds
        if len(xs) == 1:
            return ys[0] * value / xs[0] if xs[0] > 0 else ys[0]
        i = bisect.bisect_left(xs, value)
        if i < len(xs) and xs[i] == value:
            return ys[i]
        i = min(max(i, 1), len(xs) - 1)  # extrapolate with the nearest segment
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return max(0.0, y0 + (y1 - y0) * (value - x0) / (x1 - x0))


@dataclass(frozen=True)
class MeasuredProfile:
    """Measured one-layer times of a GPU kind (or a multi-GPU node) for one model."""

    label: str
    prompt: Curve
    decode: Curve
    source: str = ""

    def layer_time_s(self, prompt_tokens: float, decode_seqs: float) -> float:
        return self.prompt(prompt_tokens) + self.decode(decode_seqs)


def read_curve(path: Path) -> Curve:
    """Parse ``x,ms`` rows; a bad row raises SpecError naming the file and line."""
    if not path.is_file():
        raise SpecError(f"profile: missing file {str(path)!r}")
    points: dict[float, float] = {}
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = [p.strip() for p in line.split(",")]
        try:
            if len(parts) != 2:
                raise ValueError
            x, ms = float(parts[0]), float(parts[1])
        except ValueError:
            raise SpecError(f"{path}:{lineno}: bad profile row {line.strip()!r} "
                            f"(expected 'batch,milliseconds')") from None
        if x < 0 or ms < 0 or x != x or ms != ms:
            raise SpecError(f"{path}:{lineno}: bad profile row {line.strip()!r} "
                            f"(values must be non-negative numbers)")
        points[x] = ms / 1e3
    points.pop(0.0, None)
    if not points:
        raise SpecError(f"{path}: profile has no rows with a positive batch size")
    xs = tuple(sorted(points))
    return Curve(xs, tuple(points[x] for x in xs))


def load_profile(folder: str | Path, label: str) -> MeasuredProfile:
    folder = Path(folder)
    if not folder.is_dir():
        raise SpecError(f"performance.profiles.{label}: no such folder {str(folder)!r}")
    return MeasuredProfile(label=label, prompt=read_curve(folder / PROMPT_FILE),
                           decode=read_curve(folder / DECODE_FILE), source=str(folder))
