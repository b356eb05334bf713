"""``helix simulate --plot`` figures people can read: latency CDF tick labels in plain
seconds that do not overlap, utilization bars grouped and coloured by GPU kind, throughput with a
smoothed line over the per-bucket one."""

from __future__ import annotations

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")

from helix.sim import plots  # noqa: E402
from helix.sim.engine import SimConfig  # noqa: E402
from tests.builders.plans import small_diamond_plan  # noqa: E402
from tests.builders.sims import burst, make_sim  # noqa: E402


@pytest.fixture(scope="module")
def result():
    return make_sim(small_diamond_plan(), burst(60, 30, 20, 0.05),
                    SimConfig(mode="online", duration_s=None)).run()


def _overlaps(labels, renderer) -> list:
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in labels if t.get_visible() and t.get_text()]
    return [(a, b) for i, (a, ba) in enumerate(boxes) for b, bb in boxes[i + 1:] if ba.overlaps(bb)]


def test_latency_cdf_ticks_are_plain_and_do_not_overlap(result, tmp_path):
    plt = plots._plt()
    fig, ax = plt.subplots(figsize=(5, 4))
    samples = np.geomspace(0.0015, 3.0, 200)   # three decades, as a real run's decode latencies
    plots._cdf(ax, samples.tobytes(), "x")
    plots._readable_log_axis(ax)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    labels = ax.get_xticklabels()
    assert not _overlaps(labels, renderer)
    texts = [t.get_text() for t in labels if t.get_text()]
    assert texts and not any("times" in t or "^" in t for t in texts), texts   # no 2x10^-3
    plt.close(fig)


def test_utilization_groups_and_colours_by_kind(result):
    plt = plots._plt()
    kinds = {"A": "T4", "B": "A100-40G", "C": "T4"}
    fig = plots._utilization_figure(plt, [result], kinds)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["B", "A", "C"]   # A100 first, then T4s
    colors = [tuple(p.get_facecolor()) for p in ax.patches]
    assert colors[1] == colors[2] != colors[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["A100-40G", "T4"]
    plt.close(fig)


def test_plot_results_writes_a_smoothed_throughput(result, tmp_path):
    paths = plots.plot_results([result], tmp_path, {"A": "T4", "B": "T4", "C": "L4"})
    assert [p.name for p in paths] == ["throughput.png", "latency_cdf.png", "node_utilization.png"]
    assert all(p.stat().st_size > 0 for p in paths)
    v = [0, 10, 0, 10, 0, 10]
    s = plots.smooth(v, 3)
    assert len(s) == len(v) and max(s) - min(s) < max(v) - min(v)
