"""--draw: a Gantt chart of layer ranges grouped by region, of a bounded size, with no text covering
another (measured on the figure's own artists), and an interactive HTML variant."""

import dataclasses
import itertools
import json
import re
from html.parser import HTMLParser
from xml.etree import ElementTree

import pytest
from matplotlib.text import Text
from PIL import Image

from helix.core.serving import ServingLimits
from planner import solve
from planner.draw import draw_plan, plan_figure
from planner.draw_layout import MIN_SHARE, layout
from tests.builders.problems import make_node, make_problem


@pytest.fixture(scope="module")
def plan_and_problem():
    nodes = [make_node(f"a{i}", (100, 90, 80), region="ra", gpu="A100") for i in range(3)] + \
        [make_node(f"b{i}", (300, 200, 100), region="rb", gpu="L4") for i in range(5)] + \
        [make_node("slow", (1,), region="rb", max_layers=0, first=0, last=0, both=0)]
    p = make_problem(nodes, 3, inter_region_cap=50.0)
    return solve(p, "milp", threads=1, time_limit_s=10), p


@pytest.fixture(scope="module")
def plan_42():
    """42 nodes in three regions of mixed GPUs (hetero42's size), slow links between regions."""
    gpus = ("A100", "L4", "T4", "V100")
    nodes = [make_node(f"{r}-{gpus[i % 4].lower()}-{i}", (400 - 40 * (i % 4), 300, 200, 150, 120),
                       region=r, gpu=gpus[i % 4])
             for r in ("us-east", "us-west", "eu") for i in range(14)]
    p = make_problem(nodes, 40, inter_region_cap=500.0)
    return solve(p, "swarm", threads=1, time_limit_s=5, seed=0), p


def test_rows_group_nodes_by_region_used_ones_first(plan_and_problem):
    plan, p = plan_and_problem
    lay = layout(plan, p)
    assert {r.name for r in lay.node_rows} == {n.name for n in p.nodes}
    assert [r.y for r in lay.rows] == list(range(len(lay.rows)))
    header = None
    for r in lay.rows[1:]:
        if r.kind == "region":
            header = r.name
        else:
            assert r.region == header == p.node(r.name).region, r
    used = {q.node: q for q in plan.placements}
    rb = [r for r in lay.node_rows if r.region == "rb"]
    assert rb[-1].name == "slow" and rb[-1].start is None
    assert all((r.start, r.end) == (used[r.name].start, used[r.name].end) for r in rb[:-1])
    total = plan.max_flow_tokens_per_s
    assert all(a.flow_tokens_per_s >= MIN_SHARE * total for a in lay.arcs)
    assert any(a.cross_region for a in lay.arcs) or not any(
        p.node(a.src).region != p.node(a.dst).region for a in plan.arc_flows
        if "coordinator" not in (a.src, a.dst) and a.flow_tokens_per_s > 0)


def test_42_nodes_fit_a_screen_sized_png(plan_42, tmp_path):
    plan, p = plan_42
    path = tmp_path / "plan.png"
    draw_plan(plan, p, path)
    w, h = Image.open(path).size
    # The old drawing of hetero42 was a 945 x 2414 strip.
    assert 900 <= w <= 1600 and 600 <= h <= 1700, (w, h)


def test_100_nodes_stay_legible(tmp_path):
    """A row per node at a fixed height: 100 nodes make a taller page, not smaller letters."""
    nodes = [make_node(f"{r}-{i}", (300, 200, 150, 120), region=r, gpu=("A100", "T4")[i % 2])
             for r in ("ra", "rb", "rc", "rd") for i in range(25)]
    p = make_problem(nodes, 80, inter_region_cap=500.0)
    plan = solve(p, "swarm", threads=1, time_limit_s=5, seed=0)
    path = tmp_path / "plan.png"
    draw_plan(plan, p, path)
    w, h = Image.open(path).size
    assert w <= 1600 and 2400 <= h <= 3300, (w, h)   # about 27 px a row at 130 dpi


@pytest.mark.parametrize("which", ["small", "42"])
def test_no_text_covers_another(which, plan_and_problem, plan_42):
    plan, p = plan_and_problem if which == "small" else plan_42
    fig = plan_figure(plan, p)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = list({id(t): t for t in fig.findobj(lambda a: isinstance(a, Text) and a.get_visible())
                  if t.get_text().strip()}.values())
    names = " ".join(t.get_text() for t in texts)
    assert all(n.name in names for n in p.nodes)
    assert sum("tok/s" not in t.get_text() and t.get_text().replace(",", "").replace(".", "")
               .rstrip("k").isdigit() for t in texts) >= 1   # some flow carries its number
    assert min(t.get_fontsize() for t in texts if t.get_text().startswith(p.nodes[0].name)) >= 7
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts]
    overlaps = [(a, b) for (a, ba), (b, bb) in itertools.combinations(boxes, 2) if ba.overlaps(bb)]
    assert not overlaps, overlaps[:5]


def test_summary_line_says_what_users_get(plan_and_problem):
    plan, p = plan_and_problem
    fig = plan_figure(plan, p)
    texts = " ".join(t.get_text() for t in fig.findobj(Text))
    assert f"{plan.max_flow_tokens_per_s:,.0f} tokens/s" in texts


def test_html_is_self_contained_with_every_node_and_its_kv(plan_42, tmp_path):
    plan, p = plan_42
    kv = {n.name: 1000 + i for i, n in enumerate(p.nodes)}
    plan = dataclasses.replace(plan, serving=ServingLimits(
        dtype="float16", gpu_memory_utilization=0.9, max_batch_seqs=8, kv_high_water=0.9,
        block_size_tokens=16, kv_capacity_tokens=kv))
    path = tmp_path / "plan.html"
    draw_plan(plan, p, path)
    text = path.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    svg = ElementTree.fromstring(re.search(r"<svg.*?</svg>", text, re.S).group(0))  # well-formed
    ns = "{http://www.w3.org/2000/svg}"
    rows = {g.get("data-node") for g in svg.iter(f"{ns}g") if g.get("class") == "node"}
    assert rows == {n.name for n in p.nodes}
    assert len([e for e in svg.iter(f"{ns}path") if e.get("class") == "arc"]) == \
        len(layout(plan, p).arcs)
    details = json.loads(re.search(r'<script type="application/json" id="details">(.*?)</script>',
                                   text, re.S).group(1))
    assert set(details) == rows
    name = p.nodes[5].name
    assert details[name]["KV capacity"] == f"{kv[name]:,} tokens"
    assert details[name]["gpu"] == p.nodes[5].gpu and details[name]["layers"].startswith("[")
    # Nothing fetched: no external script, stylesheet or image.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)
    _balanced(text)


def _balanced(text: str) -> None:
    """Every opened element is closed in order (void elements aside)."""
    void = {"meta", "br", "img", "input", "link", "hr"}

    class Checker(HTMLParser):
        stack: list = []

        def handle_starttag(self, tag, attrs):
            if tag not in void:
                self.stack.append(tag)

        def handle_startendtag(self, tag, attrs):
            pass

        def handle_endtag(self, tag):
            assert self.stack and self.stack[-1] == tag, (tag, self.stack[-3:])
            self.stack.pop()

    checker = Checker()
    checker.feed(text)
    assert checker.stack == []
