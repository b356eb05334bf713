"""A simulated run as the live view's frames (``helix.sim.live_frames``, ``helix simulate --html``):
well-formed ``helix.cluster/1`` frames, one per sample time, a failed node dead in the frames after
it was declared so, a drained one draining, figures that add up to the run's, and a run that
samples gives the same numbers as one that does not."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from helix.cli import main
from helix.core.spec import load_cluster
from helix.sim import run as simrun
from helix.sim.engine import SimConfig
from helix.sim.failures import NodeFailure
from helix.sim.live_frames import FrameRecorder
from planner.live_view import check_frame, embedded_frames
from tests.builders.sims import single24_plan

REPO = Path(__file__).resolve().parents[3]
SINGLE24 = REPO / "cluster_specs" / "single24.yaml"
EMBEDDED = re.compile(r'<script id="helix-frames" type="application/json">(.*?)</script>', re.DOTALL)


@pytest.fixture(scope="module")
def spec():
    return load_cluster(SINGLE24)


@pytest.fixture(scope="module")
def plan(spec):
    return single24_plan(spec)


@pytest.fixture(scope="module")
def plan_file(plan, tmp_path_factory):
    path = tmp_path_factory.mktemp("plan") / "plan.yaml"
    plan.save(path)
    return path


def _frames_of(page: Path) -> list[dict]:
    text = page.read_text()
    assert len(EMBEDDED.findall(text)) == 1, "the page embeds its frames once"
    return embedded_frames(text)


def _node(frame: dict, name: str) -> dict:
    return next(n for n in frame["nodes"] if n["name"] == name)


def _sim(spec, plan, duration_s: float, **config):
    workload = simrun.make_workload(simrun.WorkloadOptions(), "offline", plan, 0, duration_s)
    return simrun.build_simulator(spec, plan, workload, SimConfig(duration_s=duration_s, **config))


def test_html_page_embeds_well_formed_frames_and_shows_a_failed_node_dead(plan_file, tmp_path):
    page = tmp_path / "run.html"
    rc = main(["simulate", str(SINGLE24), "--plan", str(plan_file), "--duration", "20",
               "--fail", "l4-3@8", "--html", str(page)])
    assert rc == 0
    text = page.read_text()
    assert "<title>single24: hand+helix (offline), simulated</title>" in text
    assert "http://" not in text and "https://" not in text   # nothing to fetch: works offline
    frames = _frames_of(page)
    assert [f["time_s"] for f in frames] == [float(t) for t in range(21)]
    for f in frames:
        assert check_frame(f) == [], f["time_s"]
    assert {_node(f, "l4-3")["state"] for f in frames if f["time_s"] <= 8} == {"serving"}
    later = [f for f in frames if f["time_s"] >= 9]
    assert {_node(f, "l4-3")["state"] for f in later} == {"dead"}
    assert all(_node(f, "l4-3")["kv_used_tokens"] is None for f in later)   # it does not answer
    assert all(any(e["kind"] == "failure" and "l4-3" in e["detail"] for e in f["events"])
               for f in later)
    assert not any(f["events"] for f in frames if f["time_s"] <= 8)
    # Its pipeline carries nothing once it is dead; the requests went elsewhere.
    dead_path = [p for p in frames[-1]["pipelines"] if "l4-3" in p["nodes"]]
    assert dead_path and all(p["in_flight"] == 0 and p["decode_tokens_per_s"] == 0
                             for p in dead_path)
    assert sum(p["in_flight"] for p in frames[-1]["pipelines"]) > 0


def test_a_drained_node_reads_draining_and_a_late_one_joining(plan_file, tmp_path):
    page = tmp_path / "drain.html"
    assert main(["simulate", str(SINGLE24), "--plan", str(plan_file), "--duration", "12",
                 "--drain", "a100-1@5", "--join", "l4-6@3", "--html", str(page),
                 "--html-every", "2"]) == 0
    frames = _frames_of(page)
    assert [f["time_s"] for f in frames] == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0]
    assert [_node(f, "a100-1")["state"] for f in frames] == ["serving"] * 3 + ["draining"] * 4
    assert [_node(f, "l4-6")["state"] for f in frames] == ["joining"] * 2 + ["serving"] * 5
    assert [e["kind"] for e in frames[-1]["events"]] == ["join", "drain"]


@pytest.mark.parametrize("args, message", [
    (["--compare"], "--html shows one run"),
    (["--html-every", "0"], "--html-every must be >= 0.1"),
    (["--html-every", "0.05"], "--html-every must be >= 0.1"),
    (["--html-every", "0.1", "--duration", "1000"],
     "--html-every 0.1 over --duration 1000 makes 10001 frames; a page holds at most 5000: use "
     "--html-every 0.21 or more"),
])
def test_bad_html_options_are_one_line_errors(plan_file, tmp_path, capsys, args, message):
    rc = main(["simulate", str(SINGLE24), "--plan", str(plan_file), "--duration", "1",
               "--html", str(tmp_path / "x.html"), *args])   # a later --duration wins
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_sampling_leaves_the_run_unchanged(spec, plan):
    failures = (NodeFailure("l4-5", 4.0, 3.0),)
    plain = _sim(spec, plan, 10, failures=failures).run().to_dict()
    sim = _sim(spec, plan, 10, failures=failures)
    recorder = FrameRecorder(sim, spec, plan, period_s=0.5)
    sampled = sim.run().to_dict()
    for d in (plain, sampled):
        del d["wall_s"], d["sim_s_per_wall_s"]
    assert sampled == plain
    assert len(recorder.frames) == 21
    states = [_node(f, "l4-5")["state"] for f in recorder.frames]
    assert states[8] == "serving" and states[9] == "dead" and states[-1] == "serving"   # back at 7 s
    assert [e["kind"] for e in recorder.frames[-1]["events"]] == ["failure", "return"]


def test_figures_add_up_to_the_run(spec, plan):
    sim = _sim(spec, plan, 30)
    recorder = FrameRecorder(sim, spec, plan)
    result = sim.run()
    frames = recorder.frames
    streamed = sum(p["decode_tokens_per_s"] for f in frames for p in f["pipelines"])   # 1 s apart
    # Requests that start and finish between two frames are in no pipeline's figure.
    assert 0.9 * result.tokens_generated <= streamed <= result.tokens_generated
    steps = sum(n["steps_per_s"] for f in frames for n in f["nodes"])
    assert steps == pytest.approx(sum(w.num_steps for w in sim.workers.values()))
    last = frames[-1]
    for n in last["nodes"]:
        w = sim.workers[n["name"]]
        assert n["requests"] == len(w.requests)
        assert 0 <= n["kv_used_tokens"] <= n["kv_capacity_tokens"] == w.kv_capacity_tokens
        assert 0 <= n["busy"] <= 1
    assert last["cluster"]["requests_per_s"] == pytest.approx(result.requests_completed / 30, abs=1e-3)
    assert last["cluster"]["ttft_p50_s"] <= last["cluster"]["ttft_p99_s"]
    assert last["links"] == []   # one region


def test_links_between_regions_carry_bytes_against_the_region_bandwidth():
    geo = load_cluster(REPO / "cluster_specs" / "geo24.yaml")
    geo_plan = simrun.make_plan(geo, "petals")
    sim = _sim(geo, geo_plan, 5)
    recorder = FrameRecorder(sim, geo, geo_plan)
    sim.run()
    pairs = [(link["from_region"], link["to_region"]) for link in recorder.frames[-1]["links"]]
    assert pairs and all(a != b for a, b in pairs) and len(set(pairs)) == len(pairs)
    assert [len(f["links"]) for f in recorder.frames] == [len(pairs)] * 6   # from the first frame
    assert all(link["bandwidth_bytes_per_s"] == 100e6 / 8 for link in recorder.frames[-1]["links"])
    sent = sum(link["bytes_per_s"] for f in recorder.frames for link in f["links"])
    crossing = sum(b for (src, dst), (_, b) in sim.network.link_stats().items()
                   if geo.region_of(src) != geo.region_of(dst))
    assert sent == pytest.approx(crossing, rel=1e-3) and sent > 0
    # Each link's bytes are over the node pairs the plan joins across it (each its own link) or that
    # sent across it: never over one pair's bandwidth when several share the regions.
    region = geo.region_of
    planned = {(region(a.src), region(a.dst)): set() for a in geo_plan.arc_flows}
    for a in geo_plan.arc_flows:
        if a.flow_tokens_per_s > 0:
            planned[region(a.src), region(a.dst)].add((a.src, a.dst))
    for link in recorder.frames[-1]["links"]:
        assert link["node_pairs"] >= len(planned[link["from_region"], link["to_region"]]) >= 1
    assert max(link["node_pairs"] for link in recorder.frames[-1]["links"]) > 1


def test_frame_times_are_multiples_of_the_period_without_drift(spec, plan):
    sim = _sim(spec, plan, 3)
    recorder = FrameRecorder(sim, spec, plan, period_s=0.1)
    sim.run()
    # A running sum drifts: ten additions of 0.1 make 0.9999999999999999, not 1.0.
    assert [f["time_s"] for f in recorder.frames] == [k * 0.1 for k in range(31)]


def test_past_max_frames_every_other_frame_goes_and_the_period_doubles(spec, plan):
    sim = _sim(spec, plan, 10)
    recorder = FrameRecorder(sim, spec, plan, period_s=0.5, max_frames=8)
    sim.run()
    assert recorder.period_s == 2.0
    assert [f["time_s"] for f in recorder.frames] == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    assert all(check_frame(f) == [] for f in recorder.frames)
