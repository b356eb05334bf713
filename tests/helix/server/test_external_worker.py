"""Workers outside Ray: ``helix worker`` registers over gRPC and serves like an actor would."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from helix.client import Client
from helix.server.stack import ServeOptions, ServeStack
from helix.net.control import COORDINATOR_SERVICE, ControlClient
from worker.server import WorkerServer

from tests.builders.serving import PROMPTS, hf_greedy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def test_helix_worker_process_registers_and_serves(tiny_model, plan3):
    ckpt, model = tiny_model
    stack = ServeStack(plan3, str(ckpt), ServeOptions(external_nodes=("cpu-0", "cpu-1", "cpu-2"),
                                                      register_timeout_s=120))
    errors: list[BaseException] = []
    starter = threading.Thread(target=lambda: _start(stack, errors), daemon=True)
    starter.start()
    deadline = time.monotonic() + 30
    while stack.grpc is None and time.monotonic() < deadline:
        time.sleep(0.02)
    coord_addr = stack.grpc.address
    proc = subprocess.Popen([sys.executable, "-m", "helix.cli", "worker", "--coordinator", coord_addr,
                             "--node", "cpu-2", "--model", str(ckpt)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    local = [WorkerServer(n, str(ckpt)) for n in ("cpu-0", "cpu-1")]
    try:
        reg = ControlClient(coord_addr, COORDINATOR_SERVICE)
        for w in local:
            reg.call("Register", w.addresses)
        starter.join(timeout=150)
        assert not starter.is_alive() and not errors, errors
        ids = stack.coordinator.codec.encode(PROMPTS[3])
        with Client(coord_addr) as c:
            outs = [c.generate(ids, temperature=0, max_tokens=6) for _ in range(3)]
        want = hf_greedy(model, ids, 6)
        assert all(list(o.token_ids) == want for o in outs)
        assert stack.coordinator.pipeline_counts[("cpu-0", "cpu-2")] >= 1   # through the subprocess
    finally:
        stack.close()   # tells every worker to shut down, the external process included
        for w in local:
            w.shutdown()
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
    assert proc.returncode == 0, out
    assert "registered with" in out


def _start(stack: ServeStack, errors: list) -> None:
    try:
        stack.start()
    except BaseException as exc:  # reported by the test thread
        errors.append(exc)
