"""``--draw plan.png``: regions as boxes, nodes coloured by GPU kind with their layer range, arcs
with width proportional to their flow. Matplotlib with the Agg backend (no display needed)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from helix.plan import COORDINATOR, Plan
from planner.problem import PlacementProblem


def draw_plan(plan: Plan, problem: PlacementProblem, path: str | Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch, Rectangle

    by_region: dict[str, list] = defaultdict(list)
    for p in plan.placements:
        by_region[problem.node(p.node).region or "cluster"].append(p)
    regions = sorted(by_region)
    kinds = sorted({problem.node(p.node).gpu for p in plan.placements})
    colours = {k: plt.get_cmap("tab10")(i % 10) for i, k in enumerate(kinds)}
    rows = max((len(v) for v in by_region.values()), default=1)
    fig, ax = plt.subplots(figsize=(3.2 * len(regions) + 2.5, 0.45 * rows + 2.5))
    pos: dict[str, tuple[float, float]] = {COORDINATOR: (-1.2, rows / 2)}
    ax.add_patch(Rectangle((-1.8, rows / 2 - 0.4), 1.2, 0.8, color="0.85"))
    ax.text(-1.2, rows / 2, "coordinator", ha="center", va="center", fontsize=7)
    for ri, region in enumerate(regions):
        x0 = ri * 3.2
        ax.add_patch(FancyBboxPatch((x0 - 0.1, -0.6), 2.7, rows + 0.4, boxstyle="round,pad=0.05",
                                    fill=False, ec="0.4", ls="--"))
        ax.text(x0 + 1.25, rows - 0.05, region, ha="center", fontsize=9, weight="bold")
        for i, p in enumerate(sorted(by_region[region], key=lambda q: (q.start, q.node))):
            y = rows - 1 - i - 0.5
            gpu = problem.node(p.node).gpu
            ax.add_patch(Rectangle((x0, y - 0.35), 2.5, 0.7, color=colours[gpu], alpha=0.8))
            ax.text(x0 + 1.25, y, f"{p.node}  [{p.start},{p.end})", ha="center", va="center",
                    fontsize=6)
            pos[p.node] = (x0 + 1.25, y)
    top = max((a.flow_tokens_per_s for a in plan.arc_flows), default=1.0) or 1.0
    for a in plan.arc_flows:
        if a.src in pos and a.dst in pos:
            (x1, y1), (x2, y2) = pos[a.src], pos[a.dst]
            ax.annotate("", xy=(x2, y2), xytext=(x1, y1),
                        arrowprops=dict(arrowstyle="-|>", lw=0.3 + 3.5 * a.flow_tokens_per_s / top,
                                        alpha=0.45, color="0.2", connectionstyle="arc3,rad=0.15"))
    for k, c in colours.items():
        ax.plot([], [], "s", color=c, label=k)
    ax.legend(loc="lower right", fontsize=7, frameon=False)
    ax.set_title(f"{plan.model}: {plan.max_flow_tokens_per_s:,.0f} tokens/s ({plan.method})", fontsize=10)
    ax.set_xlim(-2.0, 3.2 * len(regions))
    ax.set_ylim(-1.0, rows + 0.5)
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)
