"""``helix worker --keys DIR``: a worker outside Ray reads the cluster's keys from its folder,
registers over TLS with the token, and is driven only by callers holding the keys; a worker holding
another cluster's token is refused at once."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import pytest

from coordinator.grpc_api import CLIENT_METHODS, CoordinatorService, Registry
from helix.net.control import WORKER_SERVICE, ControlClient, ControlError, start_server
from helix.net.keys import FILES, ClusterKeys, generate

from tests.builders.cli import helix_env, run_helix

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def test_helix_worker_registers_with_keys_from_its_folder(tmp_path, tiny_model):
    ckpt, _ = tiny_model
    generate(tmp_path / "keys")
    keys = ClusterKeys.load(tmp_path / "keys")
    registry = Registry()
    server = start_server([CoordinatorService(registry, "tiny").handler()], keys=keys,
                          open_methods=CLIENT_METHODS)
    proc = subprocess.Popen([sys.executable, "-m", "helix.cli", "worker", "--coordinator", server.address,
                             "--node", "cpu-1", "--model", str(ckpt), "--keys", str(tmp_path / "keys")],
                            env=helix_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        handle = registry.wait(["cpu-1"], timeout_s=90)[0]
        with pytest.raises(ControlError):   # its control port wants the keys
            ControlClient(handle.control_address, WORKER_SERVICE, 5).call("Stats")
        stats = ControlClient(handle.control_address, WORKER_SERVICE, keys=keys).call("Stats")
        assert stats["node"] == "cpu-1" and not stats["configured"]
        ControlClient(handle.control_address, WORKER_SERVICE, keys=keys).call("Shutdown")
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        server.stop()
    assert proc.returncode == 0, out
    assert "registered with" in out


def test_helix_worker_with_another_token_is_refused_at_once(tmp_path, tiny_model):
    ckpt, _ = tiny_model
    generate(tmp_path / "keys")
    keys = ClusterKeys.load(tmp_path / "keys")
    shutil.copytree(tmp_path / "keys", tmp_path / "forged")
    (tmp_path / "forged" / FILES["token"]).write_text("f" * 43 + "\n")
    registry = Registry()
    server = start_server([CoordinatorService(registry, "tiny").handler()], keys=keys,
                          open_methods=CLIENT_METHODS)
    try:
        t0 = time.monotonic()
        done = run_helix(["worker", "--coordinator", server.address, "--node", "cpu-1", "--model",
                          str(ckpt), "--keys", str(tmp_path / "forged"), "--register-timeout-s", "60"])
        assert time.monotonic() - t0 < 40   # not the 60 s of retries
    finally:
        server.stop()
    assert done.returncode == 2
    err = done.stderr.strip().splitlines()
    assert len(err) == 1 and "cannot register" in err[0] and "cluster's token" in err[0], done.stderr
    assert registry._workers == {}
