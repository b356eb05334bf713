"""What a drawing of a plan shows, apart from how it is rendered: one :class:`Row` per node (grouped
by region), one :class:`Arc` per drawn flow, the title and labels. :mod:`planner.draw` renders it with
matplotlib, :mod:`planner.draw_html` as inline SVG.
"""

from __future__ import annotations

from dataclasses import dataclass

from helix.core.plan import COORDINATOR, Plan
from planner.problem import PlacementProblem

MIN_SHARE = 0.02
"""Arcs carrying less than this share of the total flow are not drawn (counted in a footnote)."""

ROW_IN = 0.2
"""Height of one row in inches (a 7-point label fits with room to spare)."""

BULGE_IN = 0.35
"""How far (inches) an arc may curve away from its layer boundary (within the chart's margin)."""

CROSS_REGION = "#d62728"


@dataclass(frozen=True)
class Row:
    """One line of the chart: a region header, the coordinator, or a node."""

    y: int
    kind: str
    """``"coordinator"``, ``"region"`` or ``"node"``."""
    name: str
    region: str = ""
    gpu: str = ""
    start: int | None = None
    end: int | None = None
    """The node's half-open layer range; None for an unused node and for headers."""


@dataclass(frozen=True)
class Arc:
    """A flow to draw: from ``src``'s row to ``dst``'s at layer boundary ``layer``."""

    src: str
    dst: str
    layer: int
    flow_tokens_per_s: float
    cross_region: bool


@dataclass(frozen=True)
class Layout:
    """Rows top to bottom, the arcs worth drawing, and the per-node flow through it."""

    rows: tuple[Row, ...]
    arcs: tuple[Arc, ...]
    hidden_arcs: int
    """Arcs with flow left out (under :data:`MIN_SHARE`)."""
    node_flow: dict[str, float]
    """Tokens/s into each node (0 for unused nodes)."""

    def row_of(self, name: str) -> Row:
        return next(r for r in self.rows if r.name == name and r.kind != "region")

    @property
    def node_rows(self) -> list[Row]:
        return [r for r in self.rows if r.kind == "node"]


def layout(plan: Plan, problem: PlacementProblem) -> Layout:
    """Rows: the coordinator, then per region (sorted) a header and its nodes, used ones by layer
    range, unused ones last."""
    placed = {p.node: p for p in plan.placements}
    rows = [Row(0, "coordinator", COORDINATOR)]
    regions = sorted({n.region or "cluster" for n in problem.nodes})
    for region in regions:
        rows.append(Row(len(rows), "region", region, region))
        members = [n for n in problem.nodes if (n.region or "cluster") == region]
        members.sort(key=lambda n: (n.name not in placed, placed[n.name].start if n.name in placed
                                    else 0, placed[n.name].end if n.name in placed else 0, n.name))
        for n in members:
            p = placed.get(n.name)
            rows.append(Row(len(rows), "node", n.name, region, n.gpu,
                            p.start if p else None, p.end if p else None))
    region_of = {n.name: n.region or "cluster" for n in problem.nodes}
    node_flow = {n.name: 0.0 for n in problem.nodes}
    total = sum(a.flow_tokens_per_s for a in plan.arc_flows if a.src == COORDINATOR) or 1.0
    arcs, hidden = [], 0
    for a in plan.arc_flows:
        if a.flow_tokens_per_s <= 0:
            continue
        if a.dst in node_flow:
            node_flow[a.dst] += a.flow_tokens_per_s
        if a.flow_tokens_per_s < MIN_SHARE * total:
            hidden += 1
            continue
        layer = 0 if a.src == COORDINATOR else placed[a.src].end
        cross = COORDINATOR not in (a.src, a.dst) and region_of[a.src] != region_of[a.dst]
        arcs.append(Arc(a.src, a.dst, layer, a.flow_tokens_per_s, cross))
    arcs.sort(key=lambda a: -a.flow_tokens_per_s)   # the biggest flows get their labels first
    return Layout(tuple(rows), tuple(arcs), hidden, node_flow)


def summary(plan: Plan) -> str:
    """One line: what users get (predicted, else max flow), depth and latency of a pass."""
    e = plan.extras
    if plan.prediction is not None:
        head = (f"predicted {plan.prediction.prompt_decode_tokens_per_s:,.0f} tokens/s "
                f"(prompt + decode; {plan.prediction.decode_tokens_per_s:,.0f} decode)")
    else:
        head = f"max flow {plan.max_flow_tokens_per_s:,.0f} tokens/s"
    parts = [head]
    if e.get("depth_max") is not None:
        parts.append(f"depth {e['depth_max']} nodes max, {float(e.get('depth_mean', 0)):.1f} mean")
    if e.get("latency_mean_s") is not None:
        parts.append(f"{float(e['latency_mean_s']) * 1e3:,.0f} ms per pass through the pipeline")
    return ";  ".join(parts)


def title(plan: Plan, problem: PlacementProblem) -> str:
    used = len(plan.placements)
    return (f"{plan.model} ({plan.num_layers} layers) on {len(problem.nodes)} nodes, {used} used "
            f"- {plan.method}")


def fmt_rate(tokens_per_s: float) -> str:
    return f"{tokens_per_s / 1e3:,.1f}k" if tokens_per_s >= 1e4 else f"{tokens_per_s:,.0f}"


def rate_label(tokens_per_s: float) -> str:
    """What the column right of a used node's bar says: its tokens/s, or idle."""
    return f"{fmt_rate(tokens_per_s)} tok/s" if tokens_per_s > 0 else "idle (no flow)"


def gpu_colours(problem: PlacementProblem) -> dict[str, str]:
    """GPU kind -> a hex colour (matplotlib's tab10, in sorted order of kinds)."""
    tab10 = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
             "#bcbd22", "#17becf", "#aec7e8")   # tab10 without its red, kept for cross-region
    return {k: tab10[i % len(tab10)] for i, k in enumerate(sorted({n.gpu for n in problem.nodes}))}
