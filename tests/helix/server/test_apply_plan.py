"""Applying a new plan to a live stack: drain-first per node, routing switched at
once, requests in flight finish on their pipelines. Real workers, ZeroMQ, gRPC and HTTP in this
process (tests.builders.stack), the tiny model, greedy outputs checked against ``transformers``."""

from __future__ import annotations

import dataclasses
import threading

import pytest

httpx = pytest.importorskip("httpx")

from coordinator.reshape import mixed_plan, next_move
from coordinator.runtime import RuntimeConfig
from helix.core.plan import ArcFlow
from helix.core.slices import LayerSlice, as_placement

from tests.builders.serving import PROMPTS, branching_plan, hf_greedy, with_kv
from tests.builders.stack import local_stack
from tests.builders.traffic import finish, in_flight_on, submit_all, until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

MAX_TOKENS = 24


def moved_plan():
    """The branching plan with every slice moved: cpu-0 [0,4) -> [0,5), cpu-1 [2,8) -> [5,8),
    cpu-2 [4,8) -> [3,8) (cpu-0 stays the only first stage: its move is forced)."""
    plan = branching_plan()
    plan = dataclasses.replace(
        plan, placements=(LayerSlice("cpu-0", 0, 5), LayerSlice("cpu-1", 5, 8),
                          LayerSlice("cpu-2", 3, 8)),
        arc_flows=(ArcFlow("coordinator", "cpu-0", 300.0), ArcFlow("cpu-0", "cpu-1", 100.0),
                   ArcFlow("cpu-0", "cpu-2", 200.0), ArcFlow("cpu-1", "coordinator", 100.0),
                   ArcFlow("cpu-2", "coordinator", 200.0)))
    return with_kv(plan, 8192)


@pytest.fixture(scope="module")
def stack(tiny_model):
    with local_stack(tiny_model[0], RuntimeConfig(stats_interval_s=0.1, request_timeout_s=60)) as s:
        yield s


@pytest.fixture(scope="module")
def reference(tiny_model, stack):
    ids = [tuple(stack.coordinator.codec.encode(p)) for p in PROMPTS]
    return {i: hf_greedy(tiny_model[1], i, MAX_TOKENS) for i in ids}


def test_next_move_keeps_a_pipeline_and_forces_only_the_last_holder():
    ranges = {"cpu-0": (0, 4), "cpu-1": (2, 8), "cpu-2": (4, 8)}
    every = set(ranges)
    assert next_move(8, ranges, ["cpu-1", "cpu-2"], every) == ("cpu-1", False)
    assert next_move(8, ranges, ["cpu-2"], every - {"cpu-1"}) == ("cpu-2", True)   # last [4,8)
    assert next_move(8, ranges, ["cpu-0", "cpu-2"], every) == ("cpu-2", False)    # cpu-0 holds 0-1
    assert next_move(8, ranges, ["cpu-0"], every) == ("cpu-0", True)


def test_next_move_prefers_a_move_after_which_the_placement_still_has_a_pipeline():
    """Seen live: cpu-9 joined [4, 8) beside cpu-1 [0, 1) -> cpu-0 [1, 8); the new plan wants
    cpu-0 [0, 4) and cpu-1 [4, 8). Both drains are forced; moving cpu-1 first leaves no node with
    layer 0 (nothing to route on), moving cpu-0 first leaves cpu-0 -> cpu-9."""
    ranges = {"cpu-1": (0, 1), "cpu-0": (1, 8), "cpu-9": (4, 8)}
    target = {"cpu-0": (0, 4), "cpu-1": (4, 8), "cpu-9": (4, 8)}
    every = set(ranges)
    assert next_move(8, ranges, ["cpu-1", "cpu-0"], every) == ("cpu-1", True)
    assert next_move(8, ranges, ["cpu-1", "cpu-0"], every, target=target) == ("cpu-0", True)


def test_mixed_plan_routes_moved_nodes_on_the_new_flows():
    old, new = branching_plan(), moved_plan()
    ranges = {"cpu-0": (0, 4), "cpu-1": (5, 8), "cpu-2": (4, 8)}
    mixed = mixed_plan(old, new, ranges, {"cpu-1"})
    assert {(p.node, p.start, p.end) for p in mixed.placements} == \
        {("cpu-0", 0, 4), ("cpu-1", 5, 8), ("cpu-2", 4, 8)}
    arcs = {(a.src, a.dst): a.flow_tokens_per_s for a in mixed.arc_flows}
    assert arcs[("cpu-0", "cpu-2")] == 100.0 and arcs[("cpu-0", "cpu-1")] == 100.0   # old, new
    assert ("cpu-1", "coordinator") in arcs and not mixed.extras


def test_a_forced_replan_moves_every_slice_under_load_and_outputs_stay_greedy(stack, reference):
    coord = stack.coordinator
    prompts = list(reference)
    before = submit_all(coord, prompts, 16)
    until(lambda: in_flight_on(coord, "cpu-2") and in_flight_on(coord, "cpu-1"), 60,
          "requests generating through both pipelines")
    report, during = {}, []
    applier = threading.Thread(target=lambda: report.update(r=coord.apply_plan(moved_plan(), timeout_s=120)))
    applier.start()
    while applier.is_alive():   # requests keep coming while slices move
        during.append(submit_all(coord, prompts, 2))
        applier.join(timeout=0.3)
    after = submit_all(coord, prompts, 16)
    for pending in (before, *during, after):
        finish(pending, prompts, reference)   # every request, whichever plan it ran on
    steps = {s.node: s for s in report["r"].steps}
    assert set(steps) == {"cpu-0", "cpu-1", "cpu-2"}
    assert steps["cpu-0"].forced and not steps["cpu-1"].forced
    real = as_placement(s.stats().layers for s in stack.servers)   # the workers' own word
    assert real == {"cpu-0": (0, 5), "cpu-1": (5, 8), "cpu-2": (3, 8)}
    assert as_placement(coord.plan.placements) == real
    assert coord.requests_moved == 0           # in-flight requests finished where they were
    nodes = {n["node"]: (n["state"], n["start"], n["end"])
             for n in httpx.get(stack.url + "/admin/nodes", timeout=30).json()["nodes"]}
    assert nodes == {"cpu-0": ("ok", 0, 5), "cpu-1": ("ok", 5, 8), "cpu-2": ("ok", 3, 8)}
    stack.wait_kv_free()


def test_helix_replan_applies_over_http_and_refuses_a_plan_that_does_not_fit(stack, reference, tmp_path,
                                                                        capsys):
    from helix.cli import main
    coord = stack.coordinator
    prompts = list(reference)
    back = tmp_path / "back.yaml"
    branching_plan().save(back)
    # Dry run: the changes, nothing applied; --save-running writes what runs.
    assert main(["replan", str(back), "--server", stack.url, "--save-running",
                 str(tmp_path / "running.yaml")]) in (0, None)
    out = capsys.readouterr().out
    assert "3 node(s) change" in out and "cpu-1: [5, 8) -> [2, 8)" in out and "dry run" in out
    assert (tmp_path / "running.yaml").is_file()
    assert {(p.node, p.start, p.end) for p in coord.plan.placements} >= {("cpu-1", 5, 8)}
    pending = submit_all(coord, prompts, 8)
    assert main(["replan", str(back), "--server", stack.url, "--apply"]) in (0, None)
    out = capsys.readouterr().out
    assert "applied in" in out and "cpu-0: [0, 5) -> [0, 4)" in out
    assert main(["nodes", "--server", stack.url]) in (0, None)   # a stack without /admin/joins
    listed = capsys.readouterr().out.splitlines()
    assert [line.rsplit(", ", 1)[0] for line in listed] == [
        "cpu-0 [0, 4): ok", "cpu-1 [2, 8): ok", "cpu-2 [4, 8): ok"], listed
    finish(pending, prompts, reference)
    assert as_placement(coord.plan.placements) == \
        {"cpu-0": (0, 4), "cpu-1": (2, 8), "cpu-2": (4, 8)}
    # A plan that does not fit: 400, one line, nothing changed.
    plan = branching_plan()
    stranger = dataclasses.replace(plan, placements=(*plan.placements, LayerSlice("gpu-7", 4, 8)))
    for bad, words in ((stranger, "no worker for the new plan's node(s) ['gpu-7']"),):
        r = httpx.post(stack.url + "/admin/plan", json={"plan": with_kv(bad, 8192).to_dict()}, timeout=30)
        assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
        assert "\n" not in r.json()["error"]["message"]
    r = httpx.post(stack.url + "/admin/plan", json={"plan": {"schema_version": 99}}, timeout=30)
    assert r.status_code == 400 and "schema_version" in r.json()["error"]["message"]
    assert as_placement(coord.plan.placements)["cpu-2"] == (4, 8)
    stack.wait_kv_free()


def test_a_plan_that_drops_a_node_retires_it_once_empty_and_it_can_join_again(stack, reference):
    from coordinator.runtime import WorkerHandle
    coord = stack.coordinator
    prompts = list(reference)
    plan = branching_plan()
    without = with_kv(dataclasses.replace(
        plan, placements=plan.placements[:2],
        arc_flows=tuple(a for a in plan.arc_flows if "cpu-2" not in (a.src, a.dst))), 8192)
    pending = submit_all(coord, prompts, 16)
    until(lambda: in_flight_on(coord, "cpu-2"), 60, "a request generating through cpu-2")
    report = coord.apply_plan(without, timeout_s=120)
    finish(pending, prompts, reference)                      # cpu-2's requests finished there
    assert [(s.node, s.new) for s in report.steps] == [("cpu-2", None)]
    assert "cpu-2" not in coord.workers and coord.requests_moved == 0
    listed = [n["node"] for n in httpx.get(stack.url + "/admin/nodes", timeout=30).json()["nodes"]]
    assert listed == ["cpu-0", "cpu-1"]
    routed = dict(coord.pipeline_counts)
    finish(submit_all(coord, prompts, 8), prompts, reference)
    assert dict(coord.pipeline_counts).get(("cpu-0", "cpu-2"), 0) == routed.get(("cpu-0", "cpu-2"), 0)
    # Its worker stayed up: it joins again with the branching plan.
    server = next(s for s in stack.servers if s.node == "cpu-2")
    coord.apply_plan(branching_plan(), joining=[WorkerHandle("cpu-2", server.control.address,
                                                             server.data.address)])
    finish(submit_all(coord, prompts, 16), prompts, reference)
    assert coord.pipeline_counts[("cpu-0", "cpu-2")] > routed.get(("cpu-0", "cpu-2"), 0)
    stack.wait_kv_free()


def test_a_slice_that_fails_to_load_stops_the_change_and_the_node_serves_on(stack, reference):
    import coordinator.reshape as reshape
    from helix.core.errors import HelixUserError
    coord = stack.coordinator
    prompts = list(reference)
    before = as_placement(coord.plan.placements)
    # cpu-1's new slice asks for a KV pool no machine has: its worker refuses the Configure.
    huge = with_kv(moved_plan(), {"cpu-0": 8192, "cpu-1": 10 ** 13, "cpu-2": 8192})
    with pytest.raises(HelixUserError, match="cpu-1.*failed to load its new slice"):
        coord.apply_plan(huge, timeout_s=60)
    assert not coord.reshaping and not reshape.Reshaping._apply_lock.locked()
    assert coord.node_status("cpu-1").state == "ok"            # back in routing, old slice
    assert as_placement(coord.plan.placements)["cpu-1"] == before["cpu-1"]
    finish(submit_all(coord, prompts, 8), prompts, reference)
    stack.wait_kv_free()
