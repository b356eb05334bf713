"""Draining a node of a live stack: real HTTP, gRPC, ZeroMQ and workers in this
process (tests.builders.stack), the tiny model, greedy outputs checked against ``transformers``.

The branching plan: cpu-0 [0,4) -> cpu-1 [2,8) or cpu-2 [4,8). cpu-0 alone holds layers 0-1 (it
may never be drained unforced); cpu-1 or cpu-2 may, but not both."""

from __future__ import annotations

import pytest

httpx = pytest.importorskip("httpx")

from coordinator.grpc_api import CLIENT_METHODS, CoordinatorService, Registry
from coordinator.runtime import RuntimeConfig
from helix.cli import main
from helix.client import Client, ClientError
from helix.net.control import start_server
from helix.server.app import create_app
from helix.server.guard import HttpOptions
from helix.server.http import HttpThread

from tests.builders.serving import PROMPTS, branching_plan, hf_greedy, with_capacities
from tests.builders.stack import MODEL_NAME, local_stack
from tests.builders.traffic import (VIA_2, finish, in_flight_on, join_streams, stream_all,
                                    submit_all, until)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

MAX_TOKENS = 48
VIA_1 = ("cpu-0", "cpu-1")


@pytest.fixture(scope="module")
def stack(tiny_model):
    with local_stack(tiny_model[0], RuntimeConfig(stats_interval_s=0.1, request_timeout_s=60)) as s:
        yield s


@pytest.fixture(scope="module")
def reference(tiny_model, stack):
    model = tiny_model[1]
    ids = [tuple(stack.coordinator.codec.encode(p)) for p in PROMPTS]
    return {i: hf_greedy(model, i, MAX_TOKENS) for i in ids}


def _admin(stack, method, path, body=None, **kw):
    return httpx.request(method, stack.url + path, json=body, timeout=30, **kw)


def _state(stack, node):
    return _admin(stack, "GET", f"/admin/nodes/{node}").json()


def test_drain_under_load_loses_nothing_reports_empty_and_undrain_brings_traffic_back(stack, reference):
    coord = stack.coordinator
    prompts = list(reference)
    texts = {p: coord.codec.decode(reference[p]) for p in prompts}
    streams = stream_all(stack.url, MODEL_NAME, prompts, 16, MAX_TOKENS)
    until(lambda: in_flight_on(coord, "cpu-2"), 60, "a request generating through cpu-2")
    r = _admin(stack, "POST", "/admin/drain", {"node": "cpu-2"})
    assert r.status_code == 200, r.text
    drained_at = dict(coord.pipeline_counts)
    status = r.json()
    assert status["node"] == "cpu-2" and status["state"] in ("draining", "drained")
    seen = {status["state"]}
    if status["requests"] > 0:   # requests left on it: it says so until they finish
        assert status["state"] == "draining"
    # New requests while it drains avoid it (HTTP and direct), the drained one's finish where they are.
    more = submit_all(coord, prompts, 8)
    for k, (text, finish_reason) in enumerate(join_streams(streams)):
        assert finish_reason in ("length", "stop") and text == texts[prompts[k % len(prompts)]], (k, text)
    finish(more, prompts, {p: reference[p][:24] for p in prompts})
    until(lambda: seen.add(_state(stack, "cpu-2")["state"]) or "drained" in seen, 20, "cpu-2 drained")
    empty = _state(stack, "cpu-2")
    assert empty["requests"] == 0 and empty["worker_requests"] == 0 and empty["kv_blocks_used"] == 0
    assert coord.pipeline_counts[VIA_2] == drained_at.get(VIA_2, 0)   # nothing new through cpu-2
    assert coord.requests_moved == 0                                  # they finished in place
    nodes = {n["node"]: n["state"] for n in _admin(stack, "GET", "/admin/nodes").json()["nodes"]}
    assert nodes == {"cpu-0": "ok", "cpu-1": "ok", "cpu-2": "drained"}
    assert httpx.get(stack.url + "/health", timeout=30).json()["nodes"]["cpu-2"] == "drained"
    assert 'helix:node_state{model_name="tiny",node="cpu-2",state="drained"} 1.0' in \
        httpx.get(stack.url + "/metrics", timeout=30).text
    # The other last stage is now the only one: draining it too is refused, one line, 409.
    r = _admin(stack, "POST", "/admin/drain", {"node": "cpu-1"})
    assert r.status_code == 409 and "layer(s) [4, 8)" in r.json()["error"]["message"]
    # Undrain: cpu-2 gets traffic again.
    r = _admin(stack, "POST", "/admin/undrain", {"node": "cpu-2"})
    assert r.status_code == 200 and r.json()["state"] == "ok"
    finish(submit_all(coord, prompts, 24), prompts, {p: reference[p][:24] for p in prompts})
    assert coord.pipeline_counts[VIA_2] > drained_at.get(VIA_2, 0)
    stack.wait_kv_free()


def test_drain_with_move_restarts_its_requests_elsewhere(stack, reference):
    coord = stack.coordinator
    prompts = list(reference)
    pending = submit_all(coord, prompts, 16)
    until(lambda: in_flight_on(coord, "cpu-2"), 60, "a request generating through cpu-2")
    moved_before = coord.requests_moved
    status = coord.drain("cpu-2", move=True)
    assert status.requests == 0          # none left on it at once: they moved
    finish(pending, prompts, {p: reference[p][:24] for p in prompts})   # greedy unchanged by a move
    assert coord.requests_moved > moved_before
    until(lambda: coord.node_status("cpu-2").state == "drained", 10, "cpu-2 drained")
    coord.undrain("cpu-2")
    stack.wait_kv_free()


def test_undrain_records_an_event_only_when_the_node_was_draining(stack):
    coord = stack.coordinator
    before = coord.events.counts()["undrain"]
    coord.undrain("cpu-1")   # it takes requests: nothing changes, nothing to log
    assert coord.events.counts()["undrain"] == before
    coord.drain("cpu-2")
    coord.undrain("cpu-2")
    assert coord.events.counts()["undrain"] == before + 1
    assert coord.events.recent()[-1].detail == "cpu-2 takes requests again"
    stack.wait_kv_free()


def test_refusals_and_unknown_nodes(stack):
    r = _admin(stack, "POST", "/admin/drain", {"node": "cpu-0"})
    assert r.status_code == 409
    message = r.json()["error"]["message"]
    assert "\n" not in message and "layer(s) [0, 2)" in message and "--force" in message
    assert _state(stack, "cpu-0")["state"] == "ok"                          # nothing changed
    for path, body in (("/admin/drain", {"node": "gpu-9"}), ("/admin/undrain", {"node": "gpu-9"})):
        r = _admin(stack, "POST", path, body)
        assert r.status_code == 404 and "no node 'gpu-9'" in r.json()["error"]["message"]
    assert _admin(stack, "GET", "/admin/nodes/gpu-9").status_code == 404
    assert _admin(stack, "POST", "/admin/drain", {"nodes": "cpu-2"}).status_code == 400
    assert _admin(stack, "POST", "/admin/drain", {"node": 3}).status_code == 400
    # --force drains even the only first stage; undrain puts it back and it serves again.
    r = _admin(stack, "POST", "/admin/drain", {"node": "cpu-0", "force": True})
    assert r.status_code == 200 and r.json()["state"] == "drained"
    # Meanwhile no pipeline takes requests: a request gets a one-line 503 with Retry-After, a
    # state to retry from, not a server error (it was a 500).
    r = httpx.post(stack.url + "/v1/completions", timeout=60,
                   json={"model": MODEL_NAME, "prompt": "hi", "max_tokens": 2})
    assert r.status_code == 503 and "Retry-After" in r.headers, (r.status_code, r.text)
    assert "draining" in r.json()["error"]["message"]
    assert _admin(stack, "POST", "/admin/undrain", {"node": "cpu-0"}).json()["state"] == "ok"
    r = httpx.post(stack.url + "/v1/completions", timeout=60,
                   json={"model": MODEL_NAME, "prompt": "hi", "max_tokens": 2})
    assert r.status_code == 200, r.text


def test_api_key_guards_the_admin_routes_over_http_and_grpc(stack):
    coord = stack.coordinator
    http = HttpThread(create_app(coord, MODEL_NAME, http=HttpOptions(api_key="sesame")))
    service = CoordinatorService(Registry(), MODEL_NAME, api_key="sesame")
    service.coordinator = coord
    grpc = start_server([service.handler()], "127.0.0.1", 0, open_methods=CLIENT_METHODS)
    try:
        for method, path, body in (("GET", "/admin/nodes", None), ("POST", "/admin/drain", {"node": "cpu-2"}),
                                   ("POST", "/admin/undrain", {"node": "cpu-2"})):
            assert httpx.request(method, http.url + path, json=body, timeout=30).status_code == 401
        assert coord.node_status("cpu-2").state == "ok"   # the refused drain did nothing
        ok = httpx.get(http.url + "/admin/nodes", timeout=30, headers={"Authorization": "Bearer sesame"})
        assert ok.status_code == 200 and len(ok.json()["nodes"]) == 3
        with Client(grpc.address) as plain, pytest.raises(ClientError, match="UNAUTHENTICATED"):
            plain.drain("cpu-2")
        with Client(grpc.address, api_key="sesame") as keyed:
            assert keyed.drain("cpu-2")["state"] in ("draining", "drained")
            with pytest.raises(ClientError, match="NOT_FOUND"):
                keyed.drain("gpu-9")
            with pytest.raises(ClientError, match="FAILED_PRECONDITION"):
                keyed.drain("cpu-1")
            assert {n["node"]: n["state"] for n in keyed.nodes()}["cpu-2"] in ("draining", "drained")
            assert keyed.undrain("cpu-2")["state"] == "ok"
    finally:
        grpc.stop()
        http.stop()


def test_off_loopback_without_an_api_key_draining_is_refused(stack):
    """helix serve off loopback without --api-key (admin_open False): drain and undrain are refused
    over HTTP (403) and gRPC (PERMISSION_DENIED) whatever --keys says; reading nodes still works."""
    coord = stack.coordinator
    http = HttpThread(create_app(coord, MODEL_NAME, http=HttpOptions(admin_open=False)))
    service = CoordinatorService(Registry(), MODEL_NAME, admin_open=False)
    service.coordinator = coord
    grpc = start_server([service.handler()], "127.0.0.1", 0, open_methods=CLIENT_METHODS)
    try:
        for path in ("/admin/drain", "/admin/undrain"):
            r = httpx.post(http.url + path, json={"node": "cpu-2"}, timeout=30)
            assert r.status_code == 403 and "--api-key" in r.json()["error"]["message"], r.text
        assert httpx.get(http.url + "/admin/nodes", timeout=30).status_code == 200
        with Client(grpc.address) as plain:
            with pytest.raises(ClientError, match="PERMISSION_DENIED"):
                plain.drain("cpu-2")
            assert len(plain.nodes()) == 3
        assert coord.node_status("cpu-2").state == "ok"   # nothing was drained
        # With a key the same routes work again (admin_open only matters without one).
        keyed = HttpThread(create_app(coord, MODEL_NAME, http=HttpOptions(api_key="k", admin_open=False)))
        try:
            r = httpx.post(keyed.url + "/admin/undrain", json={"node": "cpu-2"}, timeout=30,
                           headers={"Authorization": "Bearer k"})
            assert r.status_code == 200, r.text
        finally:
            keyed.stop()
    finally:
        grpc.stop()
        http.stop()


def test_off_loopback_without_an_api_key_adapters_are_not_loaded_or_unloaded(stack, tmp_path):
    """The same gate for /v1/load_lora_adapter and /v1/unload_lora_adapter: anyone reaching the
    port could unload a task its users need, or have every worker open a path of its choosing."""
    http = HttpThread(create_app(stack.coordinator, MODEL_NAME, http=HttpOptions(admin_open=False)))
    try:
        for path, body in (("/v1/load_lora_adapter", {"lora_name": "t", "lora_path": str(tmp_path)}),
                           ("/v1/unload_lora_adapter", {"lora_name": "t"})):
            r = httpx.post(http.url + path, json=body, timeout=30)
            assert r.status_code == 403 and "--api-key" in r.json()["error"]["message"], r.text
        assert stack.coordinator.adapters() == []
    finally:
        http.stop()


def test_cli_drain_wait_and_undrain(stack, reference, capsys):
    prompts = list(reference)
    streams = stream_all(stack.url, MODEL_NAME, prompts, 8, MAX_TOKENS)
    until(lambda: in_flight_on(stack.coordinator, "cpu-1"), 60, "a request generating through cpu-1")
    assert main(["drain", "cpu-1", "--server", stack.url, "--wait", "--timeout", "60"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("cpu-1 [2, 8): drain") and "cpu-1 is drained after" in out, out
    assert all(f in ("length", "stop") for _, f in join_streams(streams))
    assert main(["undrain", "cpu-1", "--server", stack.url]) == 0
    assert "cpu-1 [2, 8): ok, 0 request(s) left" in capsys.readouterr().out
    # One-line errors: an unknown node, a refused drain, a server that is not there.
    assert main(["drain", "gpu-9", "--server", stack.url]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no node 'gpu-9' in the plan" in err
    assert main(["drain", "cpu-0", "--server", stack.url]) == 2
    assert "refusing to drain cpu-0" in capsys.readouterr().err
    assert main(["drain", "cpu-2", "--server", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot reach the server at http://127.0.0.1:9" in err
    stack.wait_kv_free()


def test_drain_re_solves_the_max_flow_without_the_node(tiny_model):
    """With the flow graph's capacities in the plan (as helix plan writes them), routing follows the
    max flow of the nodes that stay, and the plan's own flows again after undrain; ``/metrics``
    counts the drain, the undrain and both re-routings."""
    plan = with_capacities(branching_plan())
    with local_stack(tiny_model[0], RuntimeConfig(stats_interval_s=0.1), plan=plan) as s:
        coord = s.coordinator
        coord.drain("cpu-2")
        assert not any("cpu-2" in (a.src, a.dst) for a in coord._flows)
        assert sum(a.flow_tokens_per_s for a in coord._flows if a.src == "coordinator") == 250.0
        coord.undrain("cpu-2")
        assert coord._flows == plan.arc_flows
        text = httpx.get(s.url + "/metrics", timeout=30).text
    for kind, n in (("drain", 1), ("undrain", 1), ("reroute", 2), ("failure", 0)):
        assert f'helix:cluster_events_total{{kind="{kind}",model_name="tiny"}} {n}.0' in text, kind


def test_serving_off_loopback_without_an_api_key_warns_and_refuses_draining(tmp_path, capsys):
    assert main(["serve", str(tmp_path / "none.yaml"), "--model", str(tmp_path), "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert "without --api-key: anyone who reaches the HTTP or gRPC port can generate (draining and " \
           "loading adapters are refused until you set --api-key)" in err
    assert main(["serve", str(tmp_path / "none.yaml"), "--model", str(tmp_path), "--host", "0.0.0.0",
                 "--api-key", "k"]) == 2
    assert "without --api-key" not in capsys.readouterr().err
