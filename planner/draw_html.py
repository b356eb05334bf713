"""``--draw plan.html``: the chart of :mod:`planner.draw` as one self-contained page.

Inline SVG (same rows, bars, arcs and colours as the PNG) and a few lines of JavaScript, nothing
fetched from the network: hovering a node's row shows its name, GPU, region, layers, the tokens/s
into and out of it and its KV capacity (``plan.serving.kv_capacity_tokens``, when the plan has
one), and fades the arcs that do not touch it.
"""

from __future__ import annotations

import json
from html import escape
from pathlib import Path

from helix.core.plan import Plan
from planner.draw_layout import (CROSS_REGION, Layout, gpu_colours, layout, rate_label, summary,
                                 title)
from planner.problem import PlacementProblem

ROW_PX = 22
LABEL_PX = 240
"""Width of the name + GPU column left of the bars."""
CHART_PX = 640
RIGHT_PX = 170
"""Width of the layer range + tokens/s column right of the bars."""
TOP_PX = 10


def node_details(plan: Plan, problem: PlacementProblem, lay: Layout) -> dict[str, dict]:
    """Per node, what hovering shows (the page's JSON)."""
    kv = plan.serving.kv_capacity_tokens if plan.serving is not None else {}
    out_flow = {n.name: 0.0 for n in problem.nodes}
    for a in plan.arc_flows:
        if a.src in out_flow:
            out_flow[a.src] += a.flow_tokens_per_s
    details = {}
    for r in lay.node_rows:
        details[r.name] = {
            "node": r.name, "gpu": r.gpu, "region": r.region,
            "layers": "unused" if r.start is None else f"[{r.start}, {r.end}) ({r.end - r.start})",
            "flow in": f"{lay.node_flow[r.name]:,.1f} tokens/s",
            "flow out": f"{out_flow[r.name]:,.1f} tokens/s",
            "KV capacity": f"{kv[r.name]:,} tokens" if r.name in kv else "-",
        }
    return details


def _x(layer: float, num_layers: int) -> float:
    # The margins leave room for the arcs' bulge (at most 40 px, see _arc).
    return LABEL_PX + 45 + layer / num_layers * (CHART_PX - 90)


def _y(row: int) -> float:
    return TOP_PX + row * ROW_PX + ROW_PX / 2


def svg(plan: Plan, problem: PlacementProblem, lay: Layout) -> str:
    """The chart as an ``<svg>`` element (well-formed XML)."""
    colours = gpu_colours(problem)
    L = plan.num_layers
    width = LABEL_PX + CHART_PX + RIGHT_PX
    height = TOP_PX + len(lay.rows) * ROW_PX + 40
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="sans-serif" font-size="12">']
    shade = False
    for r in lay.rows:
        y = _y(r.y)
        if r.kind == "region":
            shade = not shade
        if shade and r.kind != "coordinator":
            parts.append(f'<rect x="0" y="{y - ROW_PX / 2}" width="{width}" height="{ROW_PX}" '
                         f'fill="#f2f2f2"/>')
        if r.kind == "region":
            parts.append(f'<text x="{LABEL_PX}" y="{y + 4}" text-anchor="end" font-weight="bold">'
                         f'{escape(r.name)}</text>')
        elif r.kind == "coordinator":
            parts.append(f'<text x="{LABEL_PX}" y="{y + 4}" text-anchor="end" font-style="italic">'
                         f'coordinator</text><line x1="{_x(0, L)}" x2="{_x(L, L)}" y1="{y}" '
                         f'y2="{y}" stroke="#bbb" stroke-dasharray="2,3"/>')
        else:
            parts.append(_node_row(r, y, L, colours, lay.node_flow[r.name]))
    top = max((a.flow_tokens_per_s for a in lay.arcs), default=1.0)
    for a in lay.arcs:
        parts.append(_arc(a, lay, L, top))
    for i in range(0, 11):
        layer = round(L * i / 10)
        x = _x(layer, L)
        y = TOP_PX + len(lay.rows) * ROW_PX
        parts.append(f'<line x1="{x}" x2="{x}" y1="{y}" y2="{y + 4}" stroke="#333"/>'
                     f'<text x="{x}" y="{y + 16}" text-anchor="middle" font-size="11">'
                     f'{layer}</text>')
    parts.append(f'<text x="{_x(L / 2, L)}" y="{height - 4}" text-anchor="middle">layer</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def _node_row(r, y: float, L: int, colours: dict[str, str], flow: float) -> str:
    name = escape(r.name)
    row = [f'<g class="node" data-node="{name}">',
           f'<rect x="0" y="{y - ROW_PX / 2}" width="{LABEL_PX + CHART_PX + RIGHT_PX}" '
           f'height="{ROW_PX}" fill="transparent"/>',
           f'<text x="{LABEL_PX}" y="{y + 4}" text-anchor="end">{name} &#183; '
           f'{escape(r.gpu)}</text>']
    if r.start is None:
        row.append(f'<line x1="{_x(0, L)}" x2="{_x(L, L)}" y1="{y}" y2="{y}" stroke="#ccc" '
                   f'stroke-dasharray="4,3"/><text x="{LABEL_PX + CHART_PX + 4}" y="{y + 4}" '
                   f'fill="#888">unused</text>')
    else:
        x0, x1 = _x(r.start, L), _x(r.end, L)
        row.append(f'<rect class="bar" x="{x0:.1f}" y="{y - 7}" width="{x1 - x0:.1f}" height="14" '
                   f'fill="{colours[r.gpu]}" fill-opacity="0.85"/>'
                   f'<text x="{LABEL_PX + CHART_PX + 4}" y="{y + 4}">[{r.start},{r.end})  '
                   f'{rate_label(flow)}</text>')
    row.append("</g>")
    return "".join(row)


def _arc(a, lay: Layout, L: int, top: float) -> str:
    """A quadratic curve bulging left going down, right going up, as the PNG's arc3 arcs."""
    x = _x(a.layer, L)
    y1, y2 = _y(lay.row_of(a.src).y), _y(lay.row_of(a.dst).y)
    # The curve's widest point is half the control point's offset: at most 40 px from its layer.
    cx = x - max(-80.0, min(80.0, 0.35 * (y2 - y1)))
    colour = CROSS_REGION if a.cross_region else "#404040"
    src, dst = escape(a.src), escape(a.dst)
    width = 0.6 + 5.4 * a.flow_tokens_per_s / top
    return (f'<path class="arc" data-src="{src}" data-dst="{dst}" d="M {x:.1f} {y1:.1f} '
            f'Q {cx:.1f} {(y1 + y2) / 2:.1f} {x:.1f} {y2:.1f}" fill="none" stroke="{colour}" '
            f'stroke-opacity="0.55" stroke-width="{width:.2f}"><title>{src} to {dst}: '
            f'{a.flow_tokens_per_s:,.1f} tokens/s</title></path>')


_SCRIPT = """
const details = JSON.parse(document.getElementById('details').textContent);
const tip = document.getElementById('tip');
const arcs = document.querySelectorAll('.arc');
document.querySelectorAll('.node').forEach(g => {
  g.addEventListener('mousemove', ev => {
    const d = details[g.dataset.node];
    tip.replaceChildren(...Object.entries(d).map(([k, v]) => {
      const line = document.createElement('div');
      const key = document.createElement('b');
      key.textContent = k + ': ';
      line.append(key, v);
      return line;
    }));
    tip.style.display = 'block';
    tip.style.left = (ev.pageX + 14) + 'px';
    tip.style.top = (ev.pageY + 10) + 'px';
    arcs.forEach(a => a.style.opacity =
      (a.dataset.src === g.dataset.node || a.dataset.dst === g.dataset.node) ? 1 : 0.12);
  });
  g.addEventListener('mouseleave', () => {
    tip.style.display = 'none';
    arcs.forEach(a => a.style.opacity = 1);
  });
});
"""


def page(plan: Plan, problem: PlacementProblem) -> str:
    """The whole HTML document."""
    lay = layout(plan, problem)
    data = json.dumps(node_details(plan, problem, lay)).replace("</", "<\\/")
    legend = " ".join(f'<span style="color:{c}">&#9632;</span> {escape(k)}'
                      for k, c in gpu_colours(problem).items())
    hidden = (f"; {lay.hidden_arcs} arcs under 2 % of the flow not drawn" if lay.hidden_arcs
              else "")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{escape(title(plan, problem))}</title>
<style>
body {{ font-family: sans-serif; margin: 16px; }}
#tip {{ position: absolute; display: none; background: #fff; border: 1px solid #888;
        padding: 6px 8px; font-size: 13px; box-shadow: 2px 2px 6px #0003; pointer-events: none; }}
.node:hover rect.bar {{ stroke: #000; stroke-width: 1.5; }}
p {{ margin: 4px 0; font-size: 14px; }}
</style>
</head>
<body>
<h3>{escape(title(plan, problem))}</h3>
<p>{escape(summary(plan))}</p>
<p>{legend} &nbsp; <span style="color:{CROSS_REGION}">&#9473;</span> flow crossing regions
(arc width = tokens/s{escape(hidden)}). Hover a node for its details.</p>
{svg(plan, problem, lay)}
<div id="tip"></div>
<script type="application/json" id="details">{data}</script>
<script>{_SCRIPT}</script>
</body>
</html>
"""


def write_html(plan: Plan, problem: PlacementProblem, path: str | Path) -> None:
    """Write :func:`page` to ``path`` (UTF-8)."""
    Path(path).write_text(page(plan, problem), encoding="utf-8")

