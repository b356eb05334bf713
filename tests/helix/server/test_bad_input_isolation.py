"""Bad input gets a 4xx (gRPC INVALID_ARGUMENT) with a clear message, and a request that fails on a
worker fails alone: three real workers, the real coordinator, the FastAPI app and the gRPC service in
this process (no Ray)."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
import zmq

from coordinator.grpc_api import CoordinatorService, Registry
from coordinator.requests import Delta
from coordinator.runtime import Coordinator, RuntimeConfig, WorkerHandle
from helix.core.errors import HelixUserError
from helix.net.control import COORDINATOR_SERVICE, ControlClient, ControlError, start_server
from helix.net.sampling import SamplingParams
from worker.server import WorkerServer

from tests.builders.serving import PROMPTS, hf_greedy, with_kv

pytest.importorskip("fastapi")
from starlette.testclient import TestClient  # noqa: E402

from helix.server.app import create_app  # noqa: E402

BASE = {"model": "tiny", "prompt": "Helix serves", "max_tokens": 3, "temperature": 0}


@dataclasses.dataclass
class Stack:
    coord: Coordinator
    servers: list[WorkerServer]
    http: TestClient
    grpc_address: str


def _start(ckpt, plan, config: RuntimeConfig):
    servers = [WorkerServer(p.node, str(ckpt), torch_threads=1) for p in plan.placements]
    coord = Coordinator(plan, str(ckpt), config)
    coord.attach([WorkerHandle(s.node, s.control.address, s.data.address) for s in servers])
    return coord, servers


@pytest.fixture(scope="module")
def stack(tiny_model, plan3):
    ckpt, _ = tiny_model
    coord, servers = _start(ckpt, plan3, RuntimeConfig(request_timeout_s=20, stats_interval_s=0.1))
    svc = CoordinatorService(Registry(), "tiny")
    svc.coordinator = coord
    grpc_server = start_server([svc.handler()], "127.0.0.1", 0)
    http = TestClient(create_app(coord, "tiny"), raise_server_exceptions=False)
    yield Stack(coord, servers, http, grpc_server.address)
    grpc_server.stop()
    coord.close()
    for s in servers:
        s.shutdown()


def _collect(handle, timeout_s=30.0):
    ids, done = [], None
    for ev in handle.events(timeout_s=timeout_s):
        if isinstance(ev, Delta):
            ids.extend(ev.token_ids)
        else:
            done = ev
    return ids, done


def _wait_idle(stack: Stack, timeout_s=10.0):
    """No KV used on any stage, no reservation left in the scheduler, nothing live."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(s.stats().kv_blocks_used == 0 for s in stack.servers) and \
                stack.coord.scheduler.kv.num_reserved() == 0 and not stack.coord._live:
            return
        time.sleep(0.05)
    raise AssertionError({"kv": {s.node: s.stats().kv_blocks_used for s in stack.servers},
                          "reserved": stack.coord.scheduler.kv.num_reserved(),
                          "live": len(stack.coord._live)})


# --- HTTP: 400 with a clear message, nothing reserved -----------------------------------------------
@pytest.mark.parametrize("path,body,match", [
    ("/v1/completions", {**BASE, "seed": 2**64}, "seed"),
    ("/v1/completions", {**BASE, "stop_token_ids": [2**64]}, "stop_token_ids"),
    ("/v1/completions", {**BASE, "stop_token_ids": [100000], "min_tokens": 1}, "stop_token_ids"),
    ("/v1/completions", {**BASE, "stop_token_ids": [-1]}, "stop_token_ids"),
    ("/v1/completions", {**BASE, "prompt": [1, 99999]}, "vocabulary"),
    ("/v1/completions", {**BASE, "max_tokens": True}, "max_tokens"),
    ("/v1/completions", {**BASE, "temperature": "0.5"}, "temperature"),
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                              "max_completion_tokens": 0}, "max_completion_tokens must be >= 1"),
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                              "max_completion_tokens": True}, "max_completion_tokens"),
])
def test_bad_http_input_is_a_400_and_reserves_nothing(stack, path, body, match):
    counts = stack.coord.pipeline_counts.copy()
    r = stack.http.post(path, json=body)
    assert r.status_code == 400, r.text
    assert match in r.json()["error"]["message"]
    assert stack.coord.scheduler.kv.num_reserved() == 0
    assert stack.coord.pipeline_counts == counts
    assert stack.http.post("/v1/completions", json=BASE).status_code == 200


def test_tiny_temperature_is_greedy(stack):
    greedy = stack.http.post("/v1/completions", json={**BASE, "max_tokens": 6, "ignore_eos": True})
    tiny = stack.http.post("/v1/completions", json={**BASE, "max_tokens": 6, "ignore_eos": True,
                                                    "temperature": 1e-45})
    assert tiny.status_code == 200, tiny.text
    assert tiny.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"]


# --- gRPC: the same checks, INVALID_ARGUMENT ---------------------------------------------------------
@pytest.mark.parametrize("request_body,match", [
    ({"prompt_token_ids": [1, 99999]}, "vocabulary"),
    ({"prompt_token_ids": [1, -5]}, "vocabulary"),
    ({"prompt_token_ids": [1, True]}, "vocabulary"),
    ({"prompt_token_ids": [1, "7"]}, "vocabulary"),
    ({"prompt_token_ids": 7}, "prompt_token_ids"),
    ({"prompt": "Helix", "sampling": {"logprobs": 10**6}}, "logprobs"),
    ({"prompt": "Helix", "sampling": {"seed": 2**64}}, "seed"),
    ({"prompt": "Helix", "sampling": {"seed": 1.5}}, "seed"),
    ({"prompt": "Helix", "sampling": {"max_tokens": True}}, "max_tokens"),
    ({"prompt": "Helix", "sampling": {"stop_token_ids": [100000], "min_tokens": 1}}, "stop_token_ids"),
    ({"prompt": "Helix", "sampling": {"stop_token_ids": 5}}, "stop_token_ids"),
    ({"prompt": "Helix", "sampling": {"temprature": 0}}, "unknown sampling option"),
    ({"prompt": "Helix", "sampling": [0]}, "sampling"),
    ({"prompt": "Helix", "stop": [1]}, "stop"),
])
def test_bad_grpc_input_is_invalid_argument(stack, request_body, match):
    client = ControlClient(stack.grpc_address, COORDINATOR_SERVICE)
    try:
        with pytest.raises(ControlError) as exc:
            list(client.stream("Generate", {"sampling": {"max_tokens": 2}} | request_body, timeout_s=20))
        assert exc.value.code.name == "INVALID_ARGUMENT", exc.value
        assert match in exc.value.details
        assert stack.coord.scheduler.kv.num_reserved() == 0
        ok = list(client.stream("Generate", {"prompt": "Helix", "sampling": {"max_tokens": 2}}, 20))
        assert ok[-1]["finish_reason"] in ("stop", "length")
    finally:
        client.close()


# --- a request that fails on a worker fails alone ----------------------------------------------------
def test_request_failing_on_a_worker_fails_alone_and_frees_its_kv(stack, tiny_model):
    """The coordinator's checks are bypassed (a huge vocabulary) so an out-of-vocabulary stop token
    reaches the last stage, where it used to crash the whole step: every request batched with it
    timed out. Now the last stage refuses it at admission and the others finish exactly."""
    coord = stack.coord
    _, model = tiny_model
    real = coord.limits
    coord.limits = dataclasses.replace(real, vocab_size=10**9)
    try:
        prompts = [coord.codec.encode(p) for p in PROMPTS[:4]]
        good = [coord.submit(ids, SamplingParams(temperature=0, max_tokens=12)) for ids in prompts]
        bad = coord.submit(coord.codec.encode(PROMPTS[4]),
                           SamplingParams(temperature=0, max_tokens=40, stop_token_ids=(100000,),
                                          min_tokens=1))
        t0 = time.monotonic()
        ids, done = _collect(bad, timeout_s=15)
        assert time.monotonic() - t0 < 10
        assert done.finish_reason == "error" and "outside the vocabulary" in done.error
        assert "cpu-1" in done.error or "cpu-2" in done.error   # the last stage refused it
        assert done.user_error   # as bad input: HTTP 400, not a server error
        for p, h in zip(prompts, good):
            got, done = _collect(h, timeout_s=15)
            assert done.error is None and got == hf_greedy(model, p, 12)
    finally:
        coord.limits = real
    _wait_idle(stack)


def test_bad_request_beside_good_ones_is_refused_up_front_over_http(stack):
    """The reviewer's probe over HTTP: a poisoned request sent while others run is refused at the
    front door (400) and the good ones get 200. (That a request failing *on a worker* fails alone is
    checked above, with the front-door limits lifted.)"""
    results = {}

    def post(name, body):
        r = stack.http.post("/v1/completions", json=body)
        results[name] = r.status_code

    threads = [threading.Thread(target=post, args=(i, {**BASE, "max_tokens": 20, "ignore_eos": True}))
               for i in range(3)]
    threads.append(threading.Thread(target=post, args=("bad", {**BASE, "max_tokens": 40, "min_tokens": 1,
                                                               "stop_token_ids": [100000]})))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert results == {0: 200, 1: 200, 2: 200, "bad": 400}
    _wait_idle(stack)


def test_failed_dispatch_releases_the_reservation(stack, monkeypatch):
    coord = stack.coord
    counts = coord.pipeline_counts.copy()

    def broken_send(peer, msg):
        raise OverflowError("int too big to convert")
    monkeypatch.setattr(coord.data, "send", broken_send)
    with pytest.raises(OverflowError):
        coord.submit([1, 5, 6], SamplingParams(max_tokens=2))
    assert coord.scheduler.kv.num_reserved() == 0 and coord.pipeline_counts == counts
    assert not coord._live and not coord._waiting
    monkeypatch.undo()
    _, done = _collect(coord.submit([1, 5, 6], SamplingParams(max_tokens=2)))
    assert done.error is None


# --- a malformed data-plane frame costs nothing but itself -------------------------------------------
@pytest.mark.parametrize("frame", [b"garbage", bytes([2, 0, 0, 0, 5, 0, 0, 0]) + b"\xc1\xc1\xc1\xc1\xc1"])
def test_garbage_frame_kills_no_receiver(stack, frame):
    ctx = zmq.Context.instance()
    addresses = [s.data.address for s in stack.servers] + [stack.coord.data.address]
    for addr in addresses:
        sock = ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 1000)
        sock.connect(addr)
        sock.send(frame)
        sock.close()
    time.sleep(0.3)
    assert all(s._thread.is_alive() for s in stack.servers)
    assert all(t.is_alive() for t in stack.coord._threads)
    for p in PROMPTS[:3]:   # over both pipelines
        _, done = _collect(stack.coord.submit(stack.coord.codec.encode(p),
                                              SamplingParams(temperature=0, max_tokens=3)), 15)
        assert done.error is None and done.finish_reason in ("stop", "length")


# --- KV capacity: too big for every pipeline is a 400; masked for now waits ---------------------------
@pytest.fixture(scope="module")
def small_kv(tiny_model, plan3):
    """8 KV blocks of 16 tokens per worker: a pipeline admits at most 0.9 x 128 = 115 tokens."""
    ckpt, _ = tiny_model
    coord, servers = _start(ckpt, with_kv(plan3, 8 * 16),
                            RuntimeConfig(request_timeout_s=20, stats_interval_s=0.1))
    yield Stack(coord, servers, TestClient(create_app(coord, "tiny"), raise_server_exceptions=False), "")
    coord.close()
    for s in servers:
        s.shutdown()


def test_request_too_big_for_every_pipeline_is_refused_up_front(small_kv):
    coord = small_kv.coord
    assert coord.limits.max_kv_tokens == 115
    t0 = time.monotonic()
    r = small_kv.http.post("/v1/completions", json={**BASE, "max_tokens": 200})
    assert r.status_code == 400 and "KV" in r.json()["error"]["message"], r.text
    assert time.monotonic() - t0 < 5
    ids = coord.codec.encode("Helix serves")
    with pytest.raises(HelixUserError, match="no pipeline .* holds more than 115"):
        coord.submit(ids, SamplingParams(max_tokens=116 - len(ids)))
    # The largest request that fits does run, and nothing queued behind it is stuck.
    h = coord.submit(ids, SamplingParams(temperature=0, max_tokens=115 - len(ids), ignore_eos=True))
    small = coord.submit(ids, SamplingParams(temperature=0, max_tokens=3))
    assert _collect(h)[1].finish_reason == "length"
    assert _collect(small)[1].error is None
    _wait_idle(small_kv)


def test_transiently_masked_request_waits_then_runs_without_another_finishing(small_kv):
    coord = small_kv.coord
    with coord._lock:   # every node reads full until the next stats poll
        for n in coord.stats:
            coord.scheduler.kv.observe(n, 10 * coord.stats[n].kv_capacity_token_layers)
        h = coord.submit([1, 5, 6], SamplingParams(temperature=0, max_tokens=2))
        assert coord.num_waiting == 1
    # No request is running, so only the stats poll can let it in.
    ids, done = _collect(h, timeout_s=10)
    assert done.error is None and len(ids) >= 1
    _wait_idle(small_kv)


def test_waiting_head_that_can_never_fit_does_not_block_the_queue(small_kv):
    """Runs last on ``small_kv``: cpu-1 and cpu-2 stay drained."""
    coord, servers = small_kv.coord, small_kv.servers
    with coord._lock:
        for n in coord.stats:
            coord.scheduler.kv.observe(n, 10 * coord.stats[n].kv_capacity_token_layers)
        head = coord.submit([1, 5, 6], SamplingParams(max_tokens=2))
        behind = coord.submit([1, 5, 6], SamplingParams(max_tokens=2))
        assert coord.num_waiting == 2
    for s in servers[1:]:   # no last stage takes requests any more: the queue can never move
        s.drain()
    for h in (head, behind):
        _, done = _collect(h, timeout_s=10)
        assert done.finish_reason == "error" and "draining" in done.error
    assert coord.num_waiting == 0 and coord.scheduler.kv.num_reserved() == 0


# --- gRPC statuses besides INVALID_ARGUMENT survive the service guard --------------------------------
def test_grpc_full_queue_and_failed_request_keep_their_status(stack, monkeypatch):
    coord = stack.coord
    client = ControlClient(stack.grpc_address, COORDINATOR_SERVICE)
    real = coord.limits
    try:
        coord.limits = dataclasses.replace(real, vocab_size=10**9)   # let a bad stop token through
        with pytest.raises(ControlError) as exc:
            list(client.stream("Generate", {"prompt": "Helix", "sampling": {
                "max_tokens": 4, "min_tokens": 1, "stop_token_ids": [100000]}}, timeout_s=20))
        assert exc.value.code.name == "INVALID_ARGUMENT" and "outside the vocabulary" in exc.value.details
        coord.limits = real
        monkeypatch.setattr(coord, "poll_stats", lambda: None)   # no poll may unmask the nodes
        # The bound follows the measured rate, which moves as time passes: pinned here.
        monkeypatch.setattr(coord.waiting_bound, "fixed", 64)
        with coord._lock:   # every node full, the queue (64 places) full
            for n in coord.stats:
                coord.scheduler.kv.observe(n, 10 * coord.stats[n].kv_capacity_token_layers)
            waiting = [coord.submit([1, 5], SamplingParams(max_tokens=2))
                       for _ in range(coord.queue_limit())]
        with pytest.raises(ControlError) as exc:
            list(client.stream("Generate", {"prompt": "Helix"}, timeout_s=20))
        assert exc.value.code.name == "RESOURCE_EXHAUSTED" and "queue is full" in exc.value.details
        for h in waiting:
            h.cancel()
    finally:
        coord.limits = real
        monkeypatch.undo()
        client.close()
    coord.poll_stats()
    _wait_idle(stack)


def test_engine_step_that_raises_fails_the_requests_it_was_given(stack, monkeypatch):
    """A bug outside any one request (the whole engine step raises): its requests get an error at
    once instead of hanging until the request timeout."""
    coord, first = stack.coord, stack.servers[0]   # cpu-0 is every request's first stage
    real = first.engine.step

    def broken(inputs=()):
        if inputs:
            raise RuntimeError("engine bug")
        return real(inputs)
    monkeypatch.setattr(first.engine, "step", broken)
    t0 = time.monotonic()
    _, done = _collect(coord.submit([1, 5, 6], SamplingParams(max_tokens=2)), timeout_s=15)
    assert done.finish_reason == "error" and "cpu-0" in done.error and "engine bug" in done.error
    assert time.monotonic() - t0 < 5
    monkeypatch.undo()
    _, done = _collect(coord.submit([1, 5, 6], SamplingParams(max_tokens=2)))
    assert done.error is None
    _wait_idle(stack)
