"""``Coordinator.healthy`` (``GET /health``) is true only while workers really generate: a recent
successful step on every stage of some pipeline, or a probe that generates a token now. Workers that
are gone, or that cannot step, read unhealthy. Real workers and coordinator in this process (no Ray)."""

from __future__ import annotations

import time

import pytest

from coordinator.health import HealthConfig, NodeState
from coordinator.runtime import Coordinator, RuntimeConfig, WorkerHandle
from helix.net.sampling import SamplingParams
from worker.server import WorkerServer


def _start(tiny_model, plan, **config):
    ckpt, _ = tiny_model
    servers = [WorkerServer(p.node, str(ckpt), torch_threads=1) for p in plan.placements]
    coord = Coordinator(plan, str(ckpt), RuntimeConfig(stats_interval_s=0.1, request_timeout_s=20,
                                                       **config))
    coord.attach([WorkerHandle(s.node, s.control.address, s.data.address) for s in servers])
    return coord, servers


def _until(predicate, timeout_s: float) -> float:
    """Seconds until ``predicate()`` held; AssertionError after ``timeout_s``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if predicate():
            return time.monotonic() - t0
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout_s} s")


def _generate(coord, n=3):
    handle = coord.submit([1, 5, 6], SamplingParams(temperature=0, max_tokens=n))
    return list(handle.events(timeout_s=20))[-1]


def test_healthy_while_stepping_unhealthy_soon_after_every_worker_is_gone(tiny_model, plan3):
    coord, servers = _start(tiny_model, plan3)   # 30 s health window
    try:
        assert coord.healthy()   # idle since start: the probe generates a token
        assert _generate(coord).error is None
        _until(lambda: coord.healthy(probe_timeout_s=0.01), 5)   # the steps count, no probe needed
        for s in servers:
            s.shutdown()
        # A token was produced a moment ago, but nobody answers: unhealthy within a few polls.
        assert _until(lambda: not coord.healthy(probe_timeout_s=1), 10) < 5
    finally:
        coord.close()
        for s in servers:
            s.shutdown()


def test_unhealthy_when_the_probe_cannot_generate(tiny_model, plan3, monkeypatch):
    coord, servers = _start(tiny_model, plan3, health_window_s=0.3)
    try:
        assert _generate(coord).error is None
        time.sleep(0.5)   # the last step is now older than the window: only a probe can tell
        for s in servers:   # the workers answer stats but every model step fails
            def broken(*_a, **_k):
                raise RuntimeError("device lost")
            monkeypatch.setattr(s.engine.model, "forward", broken)
        t0 = time.monotonic()
        assert not coord.healthy(probe_timeout_s=10)
        assert time.monotonic() - t0 < 5   # the failed probe is reported, not waited out
        monkeypatch.undo()
        assert coord.healthy()
    finally:
        coord.close()
        for s in servers:
            s.shutdown()


def test_unhealthy_when_a_loop_stops_stepping(tiny_model, plan3):
    """Stats still answer but the data loop is gone: the probe times out."""
    coord, servers = _start(tiny_model, plan3, health_window_s=0.3)
    try:
        time.sleep(0.5)
        for s in servers:
            s._stop.set()   # ends the data loop only; the control service keeps answering
            s._thread.join(timeout=5)
        assert not coord.healthy(probe_timeout_s=1.5)
    finally:
        coord.close()
        for s in servers:
            s.shutdown()


@pytest.mark.parametrize("path", ["/health"])
def test_health_endpoint_reports_503(tiny_model, plan3, path):
    pytest.importorskip("fastapi")
    from starlette.testclient import TestClient

    from helix.server.app import create_app
    coord, servers = _start(tiny_model, plan3)
    try:
        http = TestClient(create_app(coord, "tiny"))
        assert http.get(path).status_code == 200
        for s in servers:
            s.shutdown()
        _until(lambda: http.get(path).status_code == 503, 10)
    finally:
        coord.close()
        for s in servers:
            s.shutdown()


def test_a_long_step_is_busy_not_dead(tiny_model, plan3):
    """A step that runs for seconds (a long prompt on a loaded machine) holds the worker's engine
    lock; its stats polls still answer (the last figures, this moment's counters), so the node
    stays ok and no request is moved. Before, the polls waited for the step: suspect after 1 s,
    dead after 2, and its requests moved elsewhere (or failed with every worker 'dead')."""
    coord, servers = _start(tiny_model, plan3,
                            health=HealthConfig(suspect_after_s=1.0, dead_after_s=2.0))
    try:
        assert _generate(coord).error is None
        busy = servers[0]
        steps = busy.stats().steps_total
        with busy._lock:   # the step in progress, as the step loop holds it
            t0 = time.monotonic()
            states = []
            while time.monotonic() - t0 < 3.5:
                states.append(coord.health.state(busy.node))
                time.sleep(0.1)
        assert set(states) == {NodeState.OK}, states
        assert busy.stats().steps_total == steps   # answered from the snapshot meanwhile
        assert _generate(coord).error is None
    finally:
        coord.close()
        for s in servers:
            s.shutdown()
