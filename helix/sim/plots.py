"""PNG figures of simulation results (``--plot DIR``): throughput over time, latency CDFs, node
utilization, and for ``--compare`` one bar chart of every method x scheduler."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from helix.sim.metrics import SimResult


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _cdf(ax, samples, label: str) -> None:
    x = np.sort(np.frombuffer(samples, dtype=np.float64)) if len(samples) else np.array([])
    if len(x):
        ax.plot(x, np.arange(1, len(x) + 1) / len(x), label=label)


def _seconds(x: float, _pos=None) -> str:
    """A tick label in plain seconds: 0.002, 0.5, 2, 50 (no 2x10^-3 on log axes)."""
    return f"{x:g}" if x >= 1e-4 else f"{x:.0e}"


def _readable_log_axis(ax) -> None:
    """Log-scale x with ticks at 1-2-5 per decade in plain seconds, thinned until they fit."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    ax.set_xscale("log")
    lo, hi = ax.get_xlim()
    decades = max(1.0, np.log10(hi / lo)) if lo > 0 else 1.0
    subs = (1.0, 2.0, 5.0) if decades <= 3 else (1.0,)   # fewer labels over wide ranges
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=subs))
    ax.xaxis.set_major_formatter(FuncFormatter(_seconds))
    ax.xaxis.set_minor_formatter(NullFormatter())


def smooth(values: Sequence[float], window: int) -> np.ndarray:
    """Centered moving average over ``window`` buckets (shorter at the ends)."""
    v = np.asarray(values, dtype=float)
    if window <= 1 or len(v) == 0:
        return v
    kernel = np.ones(window)
    return np.convolve(v, kernel, mode="same") / np.convolve(np.ones_like(v), kernel, mode="same")


def plot_results(results: Sequence[SimResult], out_dir: str | Path,
                 node_kinds: dict[str, str] | None = None) -> list[Path]:
    """Write throughput.png, latency_cdf.png and node_utilization.png; return their paths.
    ``node_kinds`` (node -> GPU label) groups and colours the utilization bars by kind."""
    plt = _plt()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []

    fig, ax = plt.subplots(figsize=(8, 4))
    for i, r in enumerate(results):
        tl = r.throughput_timeline_tokens_per_s
        t = np.arange(len(tl)) * r.bucket_s
        color = f"C{i}"
        ax.plot(t, tl, color=color, alpha=0.25, linewidth=0.8)
        window = max(1, min(30, len(tl) // 20))   # ~5 % of the run, at most 30 buckets
        ax.plot(t, smooth(tl, window), color=color, linewidth=2,
                label=f"{r.label or r.scheduler} ({window * r.bucket_s:g} s average)")
    steady = next((r for r in results if r.steady_from_s is not None), None)
    if steady is not None:   # offline: the window of the summary's steady figure, after the fill
        ax.axvspan(steady.steady_from_s, steady.duration_s, color="grey", alpha=0.1,
                   label="steady state (summary)")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("decode tokens/s")
    ax.set_title("Decode throughput over time (faint: per bucket)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)
    paths.append(_save(fig, out / "throughput.png"))

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    for r in results:
        _cdf(a1, r.samples.get("ttft_s", []), r.label or r.scheduler)
        _cdf(a2, r.samples.get("request_decode_s", []), r.label or r.scheduler)
    a1.set_xlabel("time to first token (s)")
    a2.set_xlabel("per-token decode latency of a request (s)")
    for a in (a1, a2):
        a.set_ylabel("fraction of requests (CDF)")
        if a.lines:
            _readable_log_axis(a)
        a.grid(True, which="major", alpha=0.3)
        if a.get_legend_handles_labels()[0]:
            a.legend(fontsize=7)
    paths.append(_save(fig, out / "latency_cdf.png"))

    paths.append(_save(_utilization_figure(plt, results, node_kinds or {}), out / "node_utilization.png"))
    return paths


def _utilization_figure(plt, results: Sequence[SimResult], kinds: dict[str, str]):
    """Bars per node for one or two runs, grouped and coloured by GPU kind; a runs x nodes heat map
    for more (it stays readable), its columns in the same order."""
    names = list(dict.fromkeys(n for r in results for n in r.node_utilization))
    names.sort(key=lambda n: (kinds.get(n, ""), n))
    kind_of = [kinds.get(n, "node") for n in names]
    palette = {k: f"C{i % 10}" for i, k in enumerate(dict.fromkeys(kind_of))}
    if len(results) > 2:
        grid = np.array([[r.node_utilization.get(n, np.nan) for n in names] for r in results])
        fig, ax = plt.subplots(figsize=(min(20, 3 + 0.3 * len(names)), 1.5 + 0.3 * len(results)))
        im = ax.imshow(grid, vmin=0, vmax=1, aspect="auto", cmap="viridis")
        ax.set_yticks(range(len(results)), [r.label or r.scheduler for r in results], fontsize=7)
        ax.set_xticks(range(len(names)), names, rotation=90, fontsize=6)
        for tick, k in zip(ax.get_xticklabels(), kind_of):
            tick.set_color(palette[k])
        fig.colorbar(im, ax=ax, label="compute busy fraction")
        return fig
    fig, ax = plt.subplots(figsize=(min(20, max(6, 0.3 * len(names) * len(results))), 4))
    width = 0.8 / len(results)
    x = np.arange(len(names))
    for i, r in enumerate(results):
        ax.bar(x + i * width, [r.node_utilization.get(n, 0.0) for n in names], width,
               color=[palette[k] for k in kind_of], hatch="//" if i else None, edgecolor="white")
    from matplotlib.patches import Patch
    handles = [Patch(color=color, label=k) for k, color in palette.items()]   # one entry per kind
    if len(results) == 2:   # runs by hatching
        handles += [Patch(facecolor="grey", label=results[0].label or results[0].scheduler),
                    Patch(facecolor="grey", hatch="//", edgecolor="white",
                          label=results[1].label or results[1].scheduler)]
    start = 0
    for k in dict.fromkeys(kind_of):   # a thin separator between kinds
        n = kind_of.count(k)
        if start:
            ax.axvline(start - 0.5 + 0.4 - width / 2, color="grey", linewidth=0.5, alpha=0.5)
        start += n
    ax.set_xticks(x + 0.4 - width / 2, names, rotation=90, fontsize=6)
    ax.set_ylabel("compute busy fraction")
    ax.set_ylim(0, 1)
    ax.set_title("Node utilization by GPU kind" if kinds else "Node utilization")
    ax.legend(handles=handles, fontsize=7, ncols=min(4, len(handles)))
    return fig


def plot_compare(rows, out_dir: str | Path) -> Path:
    """One grouped bar chart: decode throughput per placement method, one bar per scheduler."""
    plt = _plt()
    methods = list(dict.fromkeys(r.method for r in rows))
    schedulers = list(dict.fromkeys(r.scheduler for r in rows))
    value = {(r.method, r.scheduler): r.result.decode_throughput_tokens_per_s for r in rows}
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(schedulers)
    for i, s in enumerate(schedulers):
        ax.bar(np.arange(len(methods)) + i * width, [value.get((m, s), 0.0) for m in methods], width,
               label=f"scheduler {s}")
    ax.set_xticks(np.arange(len(methods)) + 0.4 - width / 2, methods)
    ax.set_ylabel("decode tokens/s")
    ax.set_title("Placement method x scheduler")
    ax.legend(fontsize=8)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    return _save(fig, Path(out_dir) / "compare.png")


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt
    plt.close(fig)
    return path
