"""``--draw plan.png``: regions as boxes, nodes coloured by GPU kind with their layer range (unused
nodes greyed), arcs with width proportional to their flow, the legend outside the drawing.
Matplotlib with the Agg backend (no display needed)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from helix.plan import COORDINATOR, Plan
from planner.problem import PlacementProblem

NODE_W, NODE_H = 2.5, 0.7
"""Size of a node's box in data units; rows are 1 apart, region columns 3.2 apart."""

#: (x0, y0, x1, y1) in data units.
Box = tuple[float, float, float, float]


@dataclass(frozen=True)
class Layout:
    """Where everything goes: one column per region, one row per node (used ones by layer range,
    then the unused ones), the coordinator left of the columns, vertically centred."""

    rows: int
    centres: dict[str, tuple[float, float]]
    """Every node's (and the coordinator's) box centre."""
    region_boxes: dict[str, Box]
    """Each region's dashed box; every node box of the region lies inside it."""
    unused: frozenset[str]

    def node_box(self, name: str) -> Box:
        x, y = self.centres[name]
        return (x - NODE_W / 2, y - NODE_H / 2, x + NODE_W / 2, y + NODE_H / 2)


def layout(plan: Plan, problem: PlacementProblem) -> Layout:
    placed = {p.node: p for p in plan.placements}
    by_region: dict[str, list[str]] = defaultdict(list)
    for n in problem.nodes:
        by_region[n.region or "cluster"].append(n.name)
    for names in by_region.values():
        names.sort(key=lambda m: (m not in placed, placed[m].start if m in placed else 0, m))
    rows = max((len(v) for v in by_region.values()), default=1)
    centres = {COORDINATOR: (-1.2, (rows - 1) / 2)}
    boxes = {}
    for ri, region in enumerate(sorted(by_region)):
        x0 = ri * 3.2
        boxes[region] = (x0 - 0.15, -0.55, x0 + NODE_W + 0.15, rows - 0.45)
        for i, name in enumerate(by_region[region]):
            centres[name] = (x0 + NODE_W / 2, rows - 1 - i)  # row i from the top
    return Layout(rows, centres, boxes, frozenset(n.name for n in problem.nodes) - set(placed))


def draw_plan(plan: Plan, problem: PlacementProblem, path: str | Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch, Rectangle

    lay = layout(plan, problem)
    placed = {p.node: p for p in plan.placements}
    kinds = sorted({n.gpu for n in problem.nodes})
    colours = {k: plt.get_cmap("tab10")(i % 10) for i, k in enumerate(kinds)}
    fig, ax = plt.subplots(figsize=(3.2 * len(lay.region_boxes) + 3.5, 0.45 * lay.rows + 1.5))
    cx, cy = lay.centres[COORDINATOR]
    ax.add_patch(Rectangle((cx - 0.6, cy - 0.4), 1.2, 0.8, color="0.85"))
    ax.text(cx, cy, "coordinator", ha="center", va="center", fontsize=7)
    for region, (x0, y0, x1, y1) in lay.region_boxes.items():
        ax.add_patch(FancyBboxPatch((x0, y0), x1 - x0, y1 - y0, boxstyle="round,pad=0.02",
                                    fill=False, ec="0.4", ls="--"))
        ax.text((x0 + x1) / 2, y1 + 0.1, region, ha="center", va="bottom", fontsize=9,
                weight="bold")
    for n in problem.nodes:
        x0, y0, _, _ = lay.node_box(n.name)
        x, y = lay.centres[n.name]
        if n.name in lay.unused:
            ax.add_patch(Rectangle((x0, y0), NODE_W, NODE_H, fc="0.93", ec=colours[n.gpu], ls="--"))
            ax.text(x, y, f"{n.name}  unused", ha="center", va="center", fontsize=6, color="0.45")
            continue
        p = placed[n.name]
        ax.add_patch(Rectangle((x0, y0), NODE_W, NODE_H, color=colours[n.gpu], alpha=0.8))
        ax.text(x, y, f"{n.name}  [{p.start},{p.end})", ha="center", va="center", fontsize=6)
    top = max((a.flow_tokens_per_s for a in plan.arc_flows), default=1.0) or 1.0
    for a in plan.arc_flows:
        if a.src in placed or a.src == COORDINATOR:
            (x1, y1), (x2, y2) = lay.centres[a.src], lay.centres[a.dst]
            ax.annotate("", xy=(x2, y2), xytext=(x1, y1),
                        arrowprops=dict(arrowstyle="-|>", lw=0.3 + 3.5 * a.flow_tokens_per_s / top,
                                        alpha=0.45, color="0.2", connectionstyle="arc3,rad=0.15"))
    for k, c in colours.items():
        ax.plot([], [], "s", color=c, label=k)
    if lay.unused:
        ax.add_patch(Rectangle((0, 0), 0, 0, fc="0.93", ec="0.45", ls="--", label="unused"))
    # Outside the axes, right of the last region: it can never cover a node.
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)
    ax.set_title(f"{plan.model}: {plan.max_flow_tokens_per_s:,.0f} tokens/s ({plan.method})",
                 fontsize=10)
    right = max(x1 for _, _, x1, _ in lay.region_boxes.values())
    ax.set_xlim(cx - 0.8, right + 0.1)
    ax.set_ylim(-0.8, lay.rows + 0.2)
    ax.axis("off")
    fig.savefig(path, dpi=150, bbox_inches="tight")
    plt.close(fig)
