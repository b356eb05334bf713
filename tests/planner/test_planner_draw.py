"""--draw: every node drawn inside its region's box, unused ones too, legend outside the drawing."""

import pytest

from planner import solve
from planner.draw import draw_plan, layout
from tests.builders.problems import make_node, make_problem


@pytest.fixture(scope="module")
def plan_and_problem():
    nodes = [make_node(f"a{i}", (100, 90, 80), region="ra") for i in range(3)] + \
        [make_node(f"b{i}", (300, 200, 100), region="rb") for i in range(5)] + \
        [make_node("slow", (1,), region="rb", max_layers=0, first=0, last=0, both=0)]
    p = make_problem(nodes, 3, inter_region_cap=50.0)
    return solve(p, "milp", threads=1, time_limit_s=10), p


def test_every_node_box_lies_inside_its_region_box(plan_and_problem):
    plan, p = plan_and_problem
    lay = layout(plan, p)
    assert set(lay.centres) == {n.name for n in p.nodes} | {"coordinator"}
    for n in p.nodes:
        x0, y0, x1, y1 = lay.node_box(n.name)
        rx0, ry0, rx1, ry1 = lay.region_boxes[n.region]
        assert rx0 < x0 and x1 < rx1 and ry0 < y0 and y1 < ry1, n.name
    boxes = sorted(lay.node_box(n.name) for n in p.nodes)
    assert all(a[2] <= b[0] or a[3] <= b[1] for a, b in zip(boxes, boxes[1:]))  # no overlaps


def test_unused_nodes_are_drawn_below_the_used_ones(plan_and_problem, tmp_path):
    plan, p = plan_and_problem
    lay = layout(plan, p)
    used = {q.node for q in plan.placements}
    assert lay.unused == {n.name for n in p.nodes} - used and "slow" in lay.unused
    lowest_used = min(lay.centres[n][1] for n in used if p.node(n).region == "rb")
    assert all(lay.centres[n][1] < lowest_used for n in lay.unused if p.node(n).region == "rb")
    path = tmp_path / "plan.png"
    draw_plan(plan, p, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
