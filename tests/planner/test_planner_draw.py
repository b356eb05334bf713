"""--draw: a Gantt chart of layer ranges grouped by region, of a bounded size, with no text covering
another (measured on the figure's own artists), and an interactive HTML variant."""

import itertools

import pytest
from matplotlib.text import Text
from PIL import Image

from planner import solve
from planner.draw import MIN_SHARE, draw_plan, layout, plan_figure
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
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts]
    overlaps = [(a, b) for (a, ba), (b, bb) in itertools.combinations(boxes, 2) if ba.overlaps(bb)]
    assert not overlaps, overlaps[:5]


def test_summary_line_says_what_users_get(plan_and_problem):
    plan, p = plan_and_problem
    fig = plan_figure(plan, p)
    texts = " ".join(t.get_text() for t in fig.findobj(Text))
    assert f"{plan.max_flow_tokens_per_s:,.0f} tokens/s" in texts
