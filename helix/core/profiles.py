"""Measured layer profiles: milliseconds for ONE transformer layer, as measured on a real device.

A profile is a folder (``performance.profiles`` in the spec names one per node label) with:

- ``prompt_bs2time.csv``: prompt tokens computed in one step -> ms for one layer;
- ``decode_bs2time.csv``: decoding sequences in one step (one token each) -> ms for one layer;
- optionally ``profile.yaml``: how it was measured (model, device, dtype, threads, ...) and, under
  ``step_overhead_ms``, the step's fixed cost apart from its layers as ``[batch, context, ms]`` rows
  for prompt and decode steps, of a middle stage and (``last_prompt``, ``last_decode``) of a last
  stage, which also samples (written by ``helix profile``; see :func:`write_profile`).

Rows are ``batch,ms`` (the Helix artifact's format, see ``shared/data/profiles``: no context
dimension) or ``batch,context,ms``, where context is the prompt length of each request (prompt
table) or the tokens of KV each decoding request attends over (decode table). Lines starting with
``#`` are comments. One file uses one form.

Lookup: along the batch axis piecewise-linear, extrapolated past the last point along the last
segment's slope; with contexts, the same at the two measured contexts around the asked one, then
linear between them; past the longest context along the last pair's slope, below the shortest
as the shortest (short contexts cost what the weights cost). Below the smallest batch measured at
a context (a prompt piece shorter than the prompt length it is looked up at), the shortest
context's curve plus that context's measured excess over it, per token (:meth:`Surface._at`). Past
the last batch or context a step never costs less than at the last one measured. A mixed batch
costs prompt(P) + decode(D).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from helix.core.errors import SpecError
from helix.core.yamlio import read_yaml

PROMPT_FILE = "prompt_bs2time.csv"
DECODE_FILE = "decode_bs2time.csv"
META_FILE = "profile.yaml"
OVERHEAD_KEY = "step_overhead_ms"


class ProfileRow(NamedTuple):
    """One measured point: ``batch`` (prompt tokens, or decoding sequences), ``context`` (None in
    the two-column form) and seconds."""

    batch: float
    context: float | None
    seconds: float


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
        y = y0 + (y1 - y0) * (value - x0) / (x1 - x0)
        # A bigger batch never takes less time: past the last point, no less than its time (a
        # noisy last segment that falls would otherwise reach 0 s).
        return max(y, ys[-1]) if value > xs[-1] else max(0.0, y)


@dataclass(frozen=True)
class Surface:
    """Seconds by batch size and context: one :class:`Curve` per measured context (sorted), or a
    single curve without a context dimension (``contexts == ()``)."""

    contexts: tuple[float, ...]
    curves: tuple[Curve, ...]

    def __call__(self, batch: float, context: float | None = None) -> float:
        if len(self.curves) == 1:
            return self.curves[0](batch)
        cs = self.contexts
        if context is None:   # a table with contexts asked without one: its middle context
            return self.curves[len(cs) // 2](batch)
        if context <= cs[0]:  # short contexts cost what the shortest measured one does
            return self.curves[0](batch)
        i = min(bisect.bisect_left(cs, context), len(cs) - 1)
        c0, c1 = cs[i - 1], cs[i]
        y0, y1 = self._at(i - 1, batch), self._at(i, batch)
        y = y0 + (y1 - y0) * (context - c0) / (c1 - c0)
        return max(y, y1) if context > c1 else max(0.0, y)   # longer contexts never cost less

    def _at(self, i: int, batch: float) -> float:
        """Seconds for ``batch`` at the ``i``-th context. Below the smallest batch measured there
        (a prompt table at length L holds whole prompts only, batch >= L: a prompt *piece* of t < L
        tokens whose mean position is L / 2 lands here), the shortest context's curve for the batch
        plus the measured excess of this context over it, per token: extrapolating this context's
        own first segment down to t reaches 0 s wherever that segment is steeper than proportional
        (the CPU profiles: a 101-token second piece of a 356-token prompt looked up as 0 ms, the
        whole prompt 37 ms, a live step 10 ms, which made the simulated TPOT at a 256-token budget
        far too short)."""
        curve = self.curves[i]
        if i == 0 or batch >= curve.x[0]:
            return curve(batch)
        base, x0 = self.curves[0], curve.x[0]   # the excess at x0 may be < 0 (noise): continuous at x0
        return max(0.0, base(batch) + (curve.seconds[0] - base(x0)) * batch / x0)

    def rows(self) -> list[ProfileRow]:
        """Every measured point, in order."""
        if not self.contexts:
            return [ProfileRow(x, None, s) for x, s in zip(self.curves[0].x, self.curves[0].seconds)]
        return [ProfileRow(x, c, s) for c, curve in zip(self.contexts, self.curves)
                for x, s in zip(curve.x, curve.seconds)]

    @classmethod
    def from_rows(cls, rows: list[ProfileRow]) -> "Surface":
        by_context: dict[float | None, dict[float, float]] = {}
        for r in rows:
            if r.batch > 0:
                by_context.setdefault(r.context, {})[r.batch] = r.seconds
        if not by_context:
            raise ValueError("no rows with a positive batch size")
        curves = {c: Curve(tuple(sorted(p)), tuple(p[x] for x in sorted(p)))
                  for c, p in by_context.items()}
        if None in curves:
            return cls((), (curves[None],))
        contexts = tuple(sorted(curves))
        return cls(contexts, tuple(curves[c] for c in contexts))


@dataclass(frozen=True)
class MeasuredProfile:
    """Measured one-layer times of a device kind (or a multi-GPU node) for one model."""

    label: str
    prompt: Surface
    decode: Surface
    source: str = ""
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    """What ``profile.yaml`` says about the measurement (empty for a bare two-file profile)."""
    prompt_overhead: Surface | None = None
    """The step's fixed cost apart from its layers, by prompt tokens and length (``helix
    profile`` measures it; None in the reference's profiles)."""
    decode_overhead: Surface | None = None
    """The same by decoding sequences and context."""
    last_prompt_overhead: Surface | None = None
    """The fixed cost of a *last* stage's step (it also runs the LM head and samples), by prompt
    tokens and length; None: not measured (a last stage then costs what a middle one does)."""
    last_decode_overhead: Surface | None = None
    """The same by decoding sequences and context."""

    def layer_time_s(self, prompt_tokens: float, decode_seqs: float,
                     decode_context: float | None = None,
                     prompt_context: float | None = None) -> float:
        """One layer of a step with ``prompt_tokens`` prefill tokens whose mean attention context
        is ``prompt_context`` (half the prompt length for whole prompts) and ``decode_seqs``
        decodes at mean context ``decode_context``; contexts matter only to tables that have them."""
        length = None if prompt_context is None else 2 * prompt_context
        return self.prompt(prompt_tokens, length) + self.decode(decode_seqs, decode_context)

    def step_overhead_s(self, prompt_tokens: float, decode_seqs: float,
                        decode_context: float | None = None,
                        prompt_context: float | None = None, last: bool = False) -> float:
        """The step's fixed cost apart from its layers (scheduling, building the batch, moving
        inputs and outputs): once per step, whatever the number of layers; 0 when not measured.
        ``last``: of a pipeline's last stage (the LM head and sampling too), where measured."""
        length = None if prompt_context is None else 2 * prompt_context
        prompt, decode = self.prompt_overhead, self.decode_overhead
        if last and (self.last_prompt_overhead is not None or self.last_decode_overhead is not None):
            prompt, decode = self.last_prompt_overhead, self.last_decode_overhead
        total = 0.0
        if prompt is not None:
            total += prompt(prompt_tokens, length)
        if decode is not None:
            total += decode(decode_seqs, decode_context)
        return total


def read_rows(path: Path) -> list[ProfileRow]:
    """Parse ``batch,ms`` or ``batch,context,ms`` rows; a bad row raises SpecError naming the
    file and line."""
    if not path.is_file():
        raise SpecError(f"profile: missing file {str(path)!r}")
    rows: list[ProfileRow] = []
    width = None
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = [p.strip() for p in line.split(",")]
        where = f"{path}:{lineno}: bad profile row {line.strip()!r}"
        try:
            if len(parts) not in (2, 3):
                raise ValueError
            values = [float(p) for p in parts]
        except ValueError:
            raise SpecError(f"{where} (expected 'batch,milliseconds' or "
                            f"'batch,context,milliseconds')") from None
        if width is not None and len(parts) != width:
            raise SpecError(f"{where} ({len(parts)} columns where the rows above have {width})")
        width = len(parts)
        if any(v < 0 or v != v for v in values):
            raise SpecError(f"{where} (values must be non-negative numbers)")
        rows.append(ProfileRow(values[0], values[1] if width == 3 else None, values[-1] / 1e3))
    return rows


def read_surface(path: Path) -> Surface:
    try:
        return Surface.from_rows(read_rows(path))
    except ValueError:
        raise SpecError(f"{path}: profile has no rows with a positive batch size") from None


def load_profile(folder: str | Path, label: str) -> MeasuredProfile:
    folder = Path(folder)
    if not folder.is_dir():
        raise SpecError(f"performance.profiles.{label}: no such folder {str(folder)!r}")
    meta_path = folder / META_FILE
    meta = read_yaml(meta_path, "profile metadata") if meta_path.is_file() else {}
    if not isinstance(meta, dict):
        raise SpecError(f"{meta_path}: expected a mapping")
    overhead = meta.get(OVERHEAD_KEY) or {}
    return MeasuredProfile(label=label, prompt=read_surface(folder / PROMPT_FILE),
                           decode=read_surface(folder / DECODE_FILE), source=str(folder), meta=meta,
                           prompt_overhead=_overhead(overhead, "prompt", meta_path),
                           decode_overhead=_overhead(overhead, "decode", meta_path),
                           last_prompt_overhead=_overhead(overhead, "last_prompt", meta_path),
                           last_decode_overhead=_overhead(overhead, "last_decode", meta_path))


def _overhead(section: Any, kind: str, where: Path) -> Surface | None:
    """``[batch, context, ms]`` rows of ``profile.yaml``'s step overhead, or None."""
    rows = section.get(kind) if isinstance(section, dict) else None
    if not rows:
        return None
    try:
        return Surface.from_rows([ProfileRow(float(b), float(c), float(ms) / 1e3) for b, c, ms in rows])
    except (TypeError, ValueError):
        raise SpecError(f"{where}: {OVERHEAD_KEY}.{kind}: expected [batch, context, ms] rows") from None


def write_rows(path: Path, header: str, rows: list[ProfileRow]) -> None:
    """``batch,context,ms`` rows (``batch,ms`` when rows have no context) under a comment header."""
    lines = [f"# {header}"]
    for r in rows:
        ms = f"{r.seconds * 1e3:.6g}"
        lines.append(f"{r.batch:g},{ms}" if r.context is None else f"{r.batch:g},{r.context:g},{ms}")
    path.write_text("\n".join(lines) + "\n")


def write_profile(folder: str | Path, prompt: list[ProfileRow], decode: list[ProfileRow],
                  meta: dict[str, Any], prompt_overhead: list[ProfileRow] = (),
                  decode_overhead: list[ProfileRow] = (), last_prompt_overhead: list[ProfileRow] = (),
                  last_decode_overhead: list[ProfileRow] = ()) -> Path:
    """Write a profile folder that :func:`load_profile` reads back; returns the folder. ``meta``
    goes to ``profile.yaml`` with the step overheads (rows with contexts; a middle stage's and a
    last stage's) under :data:`OVERHEAD_KEY`."""
    import yaml

    def ms_rows(rows: list[ProfileRow]) -> list[list[float]]:
        return [[r.batch, r.context, round(r.seconds * 1e3, 6)] for r in rows]
    if prompt_overhead or decode_overhead:
        meta = {**meta, OVERHEAD_KEY: {
            "note": "the step's fixed cost apart from its layers: [batch, context, ms]",
            "prompt": ms_rows(prompt_overhead), "decode": ms_rows(decode_overhead)}}
        if last_prompt_overhead or last_decode_overhead:
            meta[OVERHEAD_KEY].update(last_prompt=ms_rows(last_prompt_overhead),
                                      last_decode=ms_rows(last_decode_overhead))
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    write_rows(folder / PROMPT_FILE, "prompt tokens in the step, prompt length per request, "
               "ms for one layer", prompt)
    write_rows(folder / DECODE_FILE, "decoding sequences in the step, context tokens per "
               "sequence, ms for one layer", decode)
    (folder / META_FILE).write_text(yaml.safe_dump(meta, sort_keys=False))
    return folder
