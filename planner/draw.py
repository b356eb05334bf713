"""``--draw plan.png``: the plan as a Gantt chart of layers.

One row per node, grouped by region (a shaded band and a bold header per region); each used node is
a bar over its half-open layer range on a common ``0..L`` axis, coloured by GPU kind; unused nodes
are an empty row. Left of the bars: node name and GPU; right: layer range and the tokens/s through
the node. Flows are arcs at the layer boundary where tokens move (a stage's ``end``), their width
proportional to the flow; arcs under :data:`MIN_SHARE` of the total are left out (a footnote says
how many), arcs that cross regions are red, and each drawn arc carries its tokens/s where the label
does not cover another. The title is the summary: predicted tokens/s (or max flow), depth, latency.

``.png``/``.svg``/``.pdf`` go through matplotlib (Agg backend, no display); ``.html`` through
:mod:`planner.draw_html` (the same :func:`planner.draw_layout.layout`, inline SVG, hover for details).
"""

from __future__ import annotations

from pathlib import Path

from helix.core.plan import Plan
from planner.draw_html import write_html
from planner.draw_layout import (BULGE_IN, CROSS_REGION, MIN_SHARE, ROW_IN, Layout, fmt_rate,
                                 gpu_colours, layout, rate_label, summary, title)
from planner.problem import PlacementProblem

def plan_figure(plan: Plan, problem: PlacementProblem):
    """The chart as a matplotlib Figure (the caller saves or closes it)."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    lay = layout(plan, problem)
    colours = gpu_colours(problem)
    L = plan.num_layers
    n_rows = len(lay.rows)
    height_in = ROW_IN * n_rows + 1.6   # + title and summary (0.6 in), axis and legend (1 in)
    fig = Figure(figsize=(11.0, height_in))
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0.17, 0.95 / height_in, 0.68, ROW_IN * n_rows / height_in))
    ax.set_xlim(-0.06 * L, 1.06 * L)
    ax.set_ylim(n_rows - 0.5, -0.5)
    _draw_rows(ax, lay, colours, L)
    top = max((a.flow_tokens_per_s for a in lay.arcs), default=1.0)
    labels = _draw_arcs(ax, lay, top)
    ax.set_xlabel("layer", fontsize=8, labelpad=2)
    ax.tick_params(axis="x", labelsize=7)
    ax.spines[["top", "right", "left"]].set_visible(False)
    handles = [Patch(color=c, label=k) for k, c in colours.items()]
    handles.append(Line2D([], [], color="0.3", lw=2, label="flow (width = tokens/s)"))
    if any(a.cross_region for a in lay.arcs):
        handles.append(Line2D([], [], color=CROSS_REGION, lw=2, label="flow crossing regions"))
    fig.legend(handles=handles, loc="lower center", ncol=min(8, len(handles)), fontsize=7,
               frameon=False, bbox_to_anchor=(0.5, 0.0))
    fig.suptitle(title(plan, problem), fontsize=10, y=1 - 0.1 / height_in, va="top")
    fig.text(0.5, 1 - 0.38 / height_in, summary(plan), ha="center", va="top", fontsize=8)
    if lay.hidden_arcs:
        ax.annotate(f"{lay.hidden_arcs} arcs under {MIN_SHARE:.0%} of the flow not drawn",
                    (1.0, 0.0), xycoords="axes fraction", xytext=(0, -22),
                    textcoords="offset points", ha="right", va="top", fontsize=6, color="0.4")
    _drop_overlapping(fig, labels)
    return fig


def _draw_rows(ax, lay: Layout, colours: dict[str, str], L: int) -> None:
    from matplotlib.transforms import blended_transform_factory
    left = blended_transform_factory(ax.transAxes, ax.transData)
    shade = False
    for r in lay.rows:
        if r.kind == "region":
            shade = not shade
            ax.text(-0.01, r.y, r.name, transform=left, ha="right", va="center", fontsize=8,
                    weight="bold")
        elif r.kind == "coordinator":
            ax.text(-0.01, r.y, "coordinator", transform=left, ha="right", va="center", fontsize=7,
                    style="italic")
            ax.plot([0, L], [r.y, r.y], color="0.75", lw=1, ls=":")
        else:
            ax.text(-0.01, r.y, f"{r.name}  {r.gpu}", transform=left, ha="right", va="center",
                    fontsize=7)
            flow = lay.node_flow.get(r.name, 0.0)
            right = "unused" if r.start is None else f"[{r.start},{r.end})  {rate_label(flow)}"
            ax.text(1.01, r.y, right, transform=left, ha="left", va="center", fontsize=7,
                    color="0.5" if r.start is None else "0.1")
            if r.start is None:
                ax.plot([0, L], [r.y, r.y], color="0.85", lw=0.8, ls="--")
            else:
                ax.barh(r.y, r.end - r.start, left=r.start, height=0.62, color=colours[r.gpu],
                        alpha=0.85, lw=0)
        if shade and r.kind != "coordinator":
            ax.axhspan(r.y - 0.5, r.y + 0.5, color="0.95", zorder=-1, lw=0)
    ax.set_yticks([])


def _draw_arcs(ax, lay: Layout, top: float) -> list:
    """Draw every arc of ``lay``; returns their labels, biggest flow first."""
    labels = []
    for a in lay.arcs:
        y1, y2 = lay.row_of(a.src).y, lay.row_of(a.dst).y
        x = float(a.layer)
        p1 = ax.transData.transform((x, y1))
        p2 = ax.transData.transform((x, y2))
        # Downwards bulge left, upwards right; arc3 bulges rad/2 of the chord, so long arcs get a
        # smaller rad: no arc strays further than BULGE_IN from its layer into other bars or labels.
        chord = max(abs(p2[1] - p1[1]), 1.0)
        rad = min(0.35, 2 * BULGE_IN * ax.figure.dpi / chord) * (1 if y2 > y1 else -1)
        colour = CROSS_REGION if a.cross_region else "0.25"
        ax.annotate("", xy=(x, y2), xytext=(x, y1), zorder=3,
                    arrowprops=dict(arrowstyle="-|>", lw=0.4 + 3.6 * a.flow_tokens_per_s / top,
                                    alpha=0.55, color=colour, shrinkA=0, shrinkB=0,
                                    connectionstyle=f"arc3,rad={rad}"))
        # arc3's curve passes through the chord's midpoint moved rad/2 of the chord sideways
        # (in display space): put the label there.
        mid = (p1 + p2) / 2 + 0.5 * rad * (p2 - p1)[::-1] * (1, -1)
        lx, ly = ax.transData.inverted().transform(mid)
        labels.append(ax.text(lx, ly, fmt_rate(a.flow_tokens_per_s), fontsize=6, ha="center",
                              va="center", color=colour, zorder=4,
                              bbox=dict(boxstyle="square,pad=0.1", fc="white", ec="none",
                                        alpha=0.8)))
    return labels


def _drop_overlapping(fig, flow_labels: list) -> None:
    """Remove each flow label that would cover a text already kept (all other texts are kept;
    flow labels in order, biggest flow first)."""
    fig.canvas.draw()   # lays the legend out: its texts have their final places
    renderer = fig.canvas.get_renderer()
    candidates = set(map(id, flow_labels))
    others = {id(t): t for t in fig.findobj(_is_text) if id(t) not in candidates and t.get_text()}
    kept = [t.get_window_extent(renderer) for t in others.values()]
    for t in flow_labels:
        box = t.get_window_extent(renderer)
        if any(box.overlaps(k) for k in kept):
            t.remove()
        else:
            kept.append(box)


def _is_text(artist) -> bool:
    from matplotlib.text import Text
    return isinstance(artist, Text) and artist.get_visible()


def draw_plan(plan: Plan, problem: PlacementProblem, path: str | Path) -> None:
    """Write the chart to ``path``: ``.html`` interactive (:mod:`planner.draw_html`), anything else
    by matplotlib's format for the suffix (``.png``, ``.svg``, ``.pdf``)."""
    path = Path(path)
    if path.suffix.lower() in (".html", ".htm"):
        write_html(plan, problem, path)
        return
    fig = plan_figure(plan, problem)
    fig.savefig(path, dpi=130, bbox_inches="tight")
