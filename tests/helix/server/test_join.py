"""A node joins a live stack under load: a real ``helix worker`` process registers
for a node the plan lacks, the cluster spec vouches for it, a re-plan gives it a slice, and traffic
reaches it with no request failed. The stack runs in this process (tests.builders.stack) on a plan
made by the planner for cluster_specs/local3.yaml without cpu-2; greedy outputs are checked against
``transformers``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

httpx = pytest.importorskip("httpx")

from coordinator.grpc_api import CoordinatorService, Registry
from coordinator.runtime import RuntimeConfig
from helix.cli import main
from helix.net.control import COORDINATOR_SERVICE, ControlClient, ControlError, start_server
from helix.server.elastic import Elastic
from helix.core.slices import as_placement
from helix.core.spec import load_cluster

from tests.builders.cli import helix_env
from tests.builders.elastic import LOCAL3, plan_without
from tests.builders.serving import PROMPTS, hf_greedy
from tests.builders.stack import MODEL_NAME, local_stack
from tests.builders.traffic import finish, join_streams, stream_all, submit_all, until
from tests.conftest import REPO_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

MAX_TOKENS = 24


@pytest.fixture(scope="module")
def spec():
    return load_cluster(LOCAL3)


@pytest.fixture(scope="module")
def stack(tiny_model, spec):
    """The stack on local3 less cpu-2, with a registration service whose joins are checked against
    the whole spec."""
    config = RuntimeConfig(stats_interval_s=0.1, request_timeout_s=60)
    with local_stack(tiny_model[0], config, plan=plan_without(spec, "cpu-2")) as s:
        service = CoordinatorService(Registry(), MODEL_NAME)
        service.coordinator = s.coordinator
        s.elastic = Elastic(s.coordinator, spec)
        service.on_join = s.elastic.join
        grpc = start_server([service.handler()], "127.0.0.1", 0)
        s.register_address = grpc.address
        try:
            yield s
        finally:
            grpc.stop()


@pytest.fixture(scope="module")
def reference(tiny_model, stack):
    ids = [tuple(stack.coordinator.codec.encode(p)) for p in PROMPTS]
    return {i: hf_greedy(tiny_model[1], i, MAX_TOKENS) for i in ids}


def _register(address: str, body: dict) -> ControlError:
    client = ControlClient(address, COORDINATOR_SERVICE)
    try:
        client.call("Register", {"control": "127.0.0.1:1", "data": "tcp://127.0.0.1:1", **body},
                    timeout_s=10)
    except ControlError as exc:
        return exc
    finally:
        client.close()
    raise AssertionError(f"Register {body} was accepted")


def test_bad_joins_get_one_line_errors(stack, tiny_model, capsys):
    """(Before the join below: cpu-2 is still a node of the spec that the plan lacks.)"""
    address = stack.register_address
    cases = [({"node": "cpu-9"}, "not in the cluster spec: give its GPU kind"),
             ({"node": "cpu-9", "gpu": "A10O"}, "A10O"),
             ({"node": "cpu-9", "gpu": "CPU", "region": "mars"}, "region 'mars' of node 'cpu-9' is "
                                                                 "not in the cluster spec"),
             ({"node": "cpu-2", "gpu": "T4"}, "node 'cpu-2' is a CPU in the cluster spec, not a T4"),
             ({"node": "cpu-9", "gpu": 4}, "gpu must be a string")]
    for body, words in cases:
        exc = _register(address, body)
        assert exc.code.name == "INVALID_ARGUMENT" and words in exc.details, (body, exc.details)
        assert "\n" not in exc.details
    assert "cpu-9" not in stack.elastic.joins
    # Without a cluster spec no new node can be placed.
    service = CoordinatorService(Registry(), MODEL_NAME)
    service.coordinator = stack.coordinator
    service.on_join = Elastic(stack.coordinator, None).join
    grpc = start_server([service.handler()], "127.0.0.1", 0)
    try:
        exc = _register(grpc.address, {"node": "cpu-9", "gpu": "CPU"})
        assert "without --cluster" in exc.details
    finally:
        grpc.stop()
    # The real CLI: one line, exit 2, at once (not after the registration timeout).
    code = main(["worker", "--coordinator", address, "--node", "cpu-9", "--model", str(tiny_model[0]),
                 "--gpu", "A10O"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "cannot register" in err and "A10O" in err and "\n" not in err, err


def test_a_node_joins_under_load_gets_a_slice_and_traffic_and_nothing_fails(stack, reference, tiny_model):
    coord = stack.coordinator
    assert "cpu-2" not in coord.workers
    prompts = list(reference)
    texts = {p: coord.codec.decode(reference[p]) for p in prompts}
    streams = stream_all(stack.url, MODEL_NAME, prompts, 16, MAX_TOKENS)
    pending = [submit_all(coord, prompts, 8)]
    worker = subprocess.Popen(
        [sys.executable, "-m", "helix.cli", "worker", "--coordinator", stack.register_address,
         "--node", "cpu-2", "--model", str(tiny_model[0]), "--gpu", "CPU"],
        cwd=REPO_ROOT, env=helix_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    try:
        sent = [time.monotonic()]

        def serving():
            if time.monotonic() - sent[-1] > 0.2:   # load all along the join, 5 requests/s (more
                sent.append(time.monotonic())     # would fill the queue of 64 while cpu-0 reloads)
                pending.append(submit_all(coord, prompts, 1))
            status = stack.elastic.joins.get("cpu-2")
            assert status is None or status.state in ("planning", "applying", "serving"), status
            return status is not None and status.state == "serving"
        until(serving, 120, "cpu-2 joined and serving")
        via_new = sum(n for nodes, n in coord.pipeline_counts.items() if "cpu-2" in nodes)
        after = submit_all(coord, prompts, 16)
        for text_reason, p in zip(join_streams(streams), (prompts * 2)[:16]):
            assert text_reason == (texts[p], "length"), text_reason
        for p in (*pending, after):
            finish(p, prompts, reference)
        # Traffic reaches the new node after the re-plan; the node is in the plan and the listing.
        assert sum(n for nodes, n in coord.pipeline_counts.items() if "cpu-2" in nodes) > via_new
        placed = as_placement(coord.plan.placements)
        assert "cpu-2" in placed and placed["cpu-2"][1] > placed["cpu-2"][0]
        listed = {n["node"]: n for n in httpx.get(stack.url + "/admin/nodes", timeout=30).json()["nodes"]}
        assert listed["cpu-2"]["state"] == "ok"
        assert (listed["cpu-2"]["start"], listed["cpu-2"]["end"]) == placed["cpu-2"]
        assert coord.requests_moved == 0
        counts = coord.events.counts()   # registered, decided, switched: each counted
        assert min(counts["join"], counts["replan_decided"], counts["replan_applied"]) >= 1, counts
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        out, _ = worker.communicate(timeout=30)
    assert "registered with" in out and "joining" in out, out


def test_a_drifted_mix_re_plans_through_the_trigger_and_applies_without_failures(stack, spec, reference):
    """After the join: requests shorter in output than the spec's mix (48 / 16 tokens) feed the
    trigger through the coordinator's observer; the next poll re-plans, and serving goes on.
    ``/metrics`` counts the decision, and the switch when it was applied.
    (A mix under which the running placement no longer fits is the trigger's own test:
    tests/planner/test_trigger.py.)"""
    from helix.net.sampling import SamplingParams
    from helix.server.elastic import ObservedMix
    from planner.trigger import TriggerConfig
    coord = stack.coordinator
    elastic = Elastic(coord, spec, TriggerConfig(min_requests=8, window_s=300, drift=0.05,
                                                 min_interval_s=0, time_limit_s=2))
    assert elastic.poll() is None                       # nothing observed: nothing due
    saved, coord.observer = coord.observer, ObservedMix(coord.observer, elastic)
    try:
        prompts = list(reference)
        short = {p: reference[p][:3] for p in prompts}
        finish(submit_all(coord, prompts, 12, SamplingParams(temperature=0, max_tokens=3)),
               prompts, short)
        before = coord.events.counts()
        summary = elastic.poll()
        assert summary is not None and summary["cause"].startswith("drift"), summary
        assert summary["mean_output_tokens"] == 3 and summary["error"] is None, summary
        assert summary["applied"] == summary["adopt"]
        counts = coord.events.counts()
        assert counts["replan_decided"] == before["replan_decided"] + 1
        assert counts["replan_applied"] == before["replan_applied"] + summary["applied"]
        text = httpx.get(stack.url + "/metrics", timeout=30).text
        for kind in ("replan_decided", "replan_applied"):
            assert f'helix:cluster_events_total{{kind="{kind}",model_name="{MODEL_NAME}"}} ' \
                   f'{counts[kind]}.0' in text, kind
        assert elastic.poll() is None                   # the same mix is the reference now
        finish(submit_all(coord, prompts, 8), prompts, reference)   # serving after, either way
    finally:
        coord.observer = saved
