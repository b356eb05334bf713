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


def plot_results(results: Sequence[SimResult], out_dir: str | Path) -> list[Path]:
    """Write throughput.png, latency_cdf.png and node_utilization.png; return their paths."""
    plt = _plt()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []

    fig, ax = plt.subplots(figsize=(8, 4))
    for r in results:
        t = np.arange(len(r.throughput_timeline_tokens_per_s)) * r.bucket_s
        ax.plot(t, r.throughput_timeline_tokens_per_s, label=r.label or r.scheduler)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("decode tokens/s")
    ax.set_title("Decode throughput over time")
    ax.legend(fontsize=7)
    paths.append(_save(fig, out / "throughput.png"))

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    for r in results:
        _cdf(a1, r.samples.get("ttft_s", []), r.label or r.scheduler)
        _cdf(a2, r.samples.get("request_decode_s", []), r.label or r.scheduler)
    a1.set_xlabel("time to first token (s)")
    a2.set_xlabel("per-token decode latency of a request (s)")
    for a in (a1, a2):
        a.set_ylabel("CDF")
        a.set_xscale("log")
        if a.get_legend_handles_labels()[0]:
            a.legend(fontsize=7)
    paths.append(_save(fig, out / "latency_cdf.png"))

    paths.append(_save(_utilization_figure(plt, results), out / "node_utilization.png"))
    return paths


def _utilization_figure(plt, results: Sequence[SimResult]):
    """Bars per node for one or two runs; a runs x nodes heat map for more (it stays readable)."""
    names = list(dict.fromkeys(n for r in results for n in r.node_utilization))
    if len(results) > 2:
        grid = np.array([[r.node_utilization.get(n, np.nan) for n in names] for r in results])
        fig, ax = plt.subplots(figsize=(min(20, 3 + 0.3 * len(names)), 1.5 + 0.3 * len(results)))
        im = ax.imshow(grid, vmin=0, vmax=1, aspect="auto", cmap="viridis")
        ax.set_yticks(range(len(results)), [r.label or r.scheduler for r in results], fontsize=7)
        ax.set_xticks(range(len(names)), names, rotation=90, fontsize=6)
        fig.colorbar(im, ax=ax, label="compute busy fraction")
        return fig
    fig, ax = plt.subplots(figsize=(min(20, max(6, 0.3 * len(names) * len(results))), 4))
    width = 0.8 / len(results)
    for i, r in enumerate(results):
        ax.bar(np.arange(len(names)) + i * width, [r.node_utilization.get(n, 0.0) for n in names],
               width, label=r.label or r.scheduler)
    ax.set_xticks(np.arange(len(names)) + 0.4 - width / 2, names, rotation=90, fontsize=6)
    ax.set_ylabel("compute busy fraction")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
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
