"""The live view's pure parts: the frame checker, the latency window, the page's text (what it may
fetch, how embedded frames are escaped) and that the page ships as package data. The page in a
browser: tests/helix/server/test_dashboard.py."""

from __future__ import annotations

import copy
import fnmatch
import json
import re

import pytest
import tomllib

from planner.live_view import (
    RecentWindow,
    check_frame,
    embedded_frames,
    pipeline_id,
    quantile,
    render_page,
)
from tests.builders.frames import frame
from tests.conftest import REPO_ROOT


def test_a_well_formed_frame_has_no_problem():
    assert check_frame(frame()) == []
    assert check_frame(json.loads(json.dumps(frame()))) == []


@pytest.mark.parametrize("change, expected", [
    (lambda f: f.pop("links"), "frame.links: missing"),
    (lambda f: f.update(extra=1), "frame.extra: unknown key"),
    (lambda f: f.update(schema="helix.cluster/0"), "frame.schema"),
    (lambda f: f["nodes"][0].update(state="ok"), "nodes[0].state: 'ok'; known: serving"),
    (lambda f: f["nodes"][0].update(layers=[4, 4]), "nodes[0].layers: [4, 4] is not [start, end)"),
    (lambda f: f["nodes"][0].update(requests=1.5), "nodes[0].requests: 1.5 is not int"),
    (lambda f: f["nodes"][0].update(name=None), "nodes[0].name: null"),
    (lambda f: f["nodes"][0].update(busy=True), "nodes[0].busy: True is not"),
    (lambda f: f["pipelines"][0].update(nodes=["a", "z"]), "pipelines[0].nodes: ['z'] are not in nodes"),
    (lambda f: f["events"][0].update(kind="boom"), "events[0].kind: 'boom'; known:"),
    (lambda f: f["cluster"].pop("window_s"), "cluster.window_s: missing"),
    (lambda f: f["links"][0].update(node_pairs=None), "links[0].node_pairs: null"),
])
def test_the_checker_names_what_is_wrong(change, expected):
    f = copy.deepcopy(frame())
    change(f)
    problems = check_frame(f)
    assert any(p.startswith(expected) for p in problems), problems


def test_quantiles_and_the_window_drop_old_samples_and_rate_over_the_time_seen():
    assert quantile([], 0.5) is None
    assert quantile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert quantile([0.0, 10.0], 0.99) == pytest.approx(9.9)
    w = RecentWindow(start_s=0.0, window_s=60.0)
    for t in range(10):
        w.add(float(t), float(t))
    assert w.rate(10.0) == pytest.approx(1.0)   # 10 samples in the 10 s since the start
    assert w.quantiles(10.0) == [4.5, pytest.approx(8.91)]
    assert w.rate(65.0) == pytest.approx(5 / 60)   # only t = 5..9 are within the minute
    assert w.quantiles(200.0) == [None, None]


def test_pipeline_ids_join_node_names():
    assert pipeline_id(("cpu-0", "cpu-2")) == "cpu-0>cpu-2"


def test_the_live_page_fetches_only_its_own_cluster_endpoint():
    page = render_page(None, "Helix <tiny>")
    assert "<title>Helix &lt;tiny&gt;</title>" in page
    assert 'id="helix-frames"' not in page
    assert re.findall(r"fetch\(([^,)]*)", page) == ['"/v1/cluster"']
    # No address of another origin, no loaded resource: nothing for the browser to fetch.
    assert not re.search(r"https?://|//[a-z]|\bsrc=|<link\b|@import|url\(", page.replace(
        'xmlns="http://www.w3.org/2000/svg"', ""))


def test_embedded_frames_cannot_end_their_script_element():
    frames = [frame(1.0), frame(2.0, state="dead")]
    frames[1]["events"][0]["detail"] = "</script><script>alert(1)</script>"
    # An HTML comment opened in a script's text, then "<script": the parser's "double escaped"
    # state, in which the page's own "</script>" no longer ends the element.
    frames[0]["nodes"][0]["name"] = "a<!--<script>"
    frames[0]["pipelines"][0]["nodes"][0] = "a<!--<script>"
    page = render_page(frames, "replay")
    start = page.index('<script id="helix-frames" type="application/json">') + len(
        '<script id="helix-frames" type="application/json">')
    body = page[start:page.index("</script>", start)]
    assert "<" not in body
    assert embedded_frames(page) == frames
    assert "alert" in body


def test_a_replay_embeds_each_event_once_and_gives_every_frame_back_as_it_was():
    frames = [frame(float(t)) for t in range(10, 60)]
    for i, f in enumerate(frames):   # a growing hour of events, oldest first
        f["events"] = [{"time_s": float(t), "kind": "drain", "detail": f"event number {t}"}
                       for t in range(i)]
    frames[7]["events"] = frames[7]["events"][::-1]   # not a run of the shared list: its own
    page = render_page(frames, "replay")
    assert embedded_frames(page) == frames
    assert page.count("event number 5\"") == 2   # in the shared list, and in frame 7's own
    assert embedded_frames(render_page(None, "live")) == []


def test_the_page_ships_as_package_data():
    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["planner"]
    assert any(fnmatch.fnmatch("live_view.html", p) for p in patterns)
    assert (REPO_ROOT / "planner" / "live_view.html").is_file()
