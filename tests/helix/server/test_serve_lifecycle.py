"""``helix serve`` as a user runs it (a subprocess, a local Ray of its own): start-up errors are one line
and come before any worker starts; nothing it started outlives it, after SIGTERM or SIGKILL."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helix.server.reaper import _alive, descendants
from tests.builders.cli import helix_env, run_helix
from tests.builders.serving import branching_plan

pytest.importorskip("ray")
pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(400),
              pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")]

REPO = Path(__file__).resolve().parents[3]
READY_TIMEOUT_S = 240
GONE_TIMEOUT_S = 30


def _args(plan: Path, ckpt, *extra: str) -> list[str]:
    return ["serve", str(plan), "--model", str(ckpt), "--grpc-port", "0", *extra]


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("lifecycle") / "plan.yaml"
    branching_plan().save(path)
    return path


def _one_error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert "workers ready" not in result.stdout
    return errors[0]


def test_port_in_use_fails_before_any_worker_starts(tiny_model, plan_file):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        t0 = time.monotonic()
        line = _one_error_line(run_helix(_args(plan_file, tiny_model[0], "--port", str(port))))
    assert f"--port {port}" in line and "already in use" in line
    assert time.monotonic() - t0 < 60   # no Ray was started (that alone takes 10-60 s here)


def test_unreachable_ray_address_is_one_line(tiny_model, plan_file):
    line = _one_error_line(run_helix(_args(plan_file, tiny_model[0], "--port", "0",
                                             "--address", "127.0.0.1:1")))
    assert "cannot reach the Ray cluster at 127.0.0.1:1" in line


def _serve_until_ready(plan_file, ckpt) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "helix.cli", *_args(plan_file, ckpt, "--port", "0")],
                            cwd=REPO, env=helix_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    ready = threading.Event()

    def read():
        for line in proc.stdout:
            if "workers ready" in line:
                ready.set()
    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(READY_TIMEOUT_S):
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"helix serve not ready within {READY_TIMEOUT_S} s")
    return proc


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_nothing_outlives_helix_serve(tiny_model, plan_file, sig):
    proc = _serve_until_ready(plan_file, tiny_model[0])
    started = descendants(proc.pid)   # Ray's GCS, raylet, agents, the workers, the watchdog
    assert len(started) >= 4, started
    proc.send_signal(sig)             # the server process only, not its group
    proc.wait(timeout=GONE_TIMEOUT_S + 30)
    deadline = time.monotonic() + GONE_TIMEOUT_S
    while time.monotonic() < deadline and any(_alive(p, s) for p, s in started.items()):
        time.sleep(0.2)
    left = {p: Path(f"/proc/{p}/cmdline").read_bytes()[:80] for p, s in started.items() if _alive(p, s)}
    for pid in left:                  # leave the machine clean even when the test fails
        os.kill(pid, signal.SIGKILL)
    assert not left, f"still running {GONE_TIMEOUT_S} s after {sig.name}: {left}"
