"""``helix serve --keys`` on a local Ray: the launcher hands the cluster's keys to the worker actors
(as an argument; no Ray log holds a secret), the pipeline answers as ``transformers`` does, and the
workers' ports refuse callers without the keys."""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import pytest

from helix.client import Client
from helix.net.control import WORKER_SERVICE, ControlClient, ControlError
from helix.net.keys import ClusterKeys, generate
from helix.server.launcher import LaunchConfig
from helix.server.stack import ServeOptions, ServeStack

from tests.builders.serving import PROMPTS, hf_greedy, two_stage_plan

ray = pytest.importorskip("ray")

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(300)]


def test_ray_workers_get_the_keys_and_serve_securely(tiny_model, tmp_path):
    ckpt, model = tiny_model
    os.environ["RAY_AUTH_MODE"] = "disabled"
    generate(tmp_path / "keys")
    keys = ClusterKeys.load(tmp_path / "keys")
    stack = ServeStack(two_stage_plan(), str(ckpt),
                       ServeOptions(keys=keys, launch=LaunchConfig(start_timeout_s=150))).start()
    try:
        ids = stack.coordinator.codec.encode(PROMPTS[2])
        with Client(stack.grpc_address, tls_cert=tmp_path / "keys" / "grpc.crt") as c:
            out = c.generate(ids, temperature=0, max_tokens=8)
        assert list(out.token_ids) == hf_greedy(model, ids, 8)
        for w in stack.coordinator.workers.values():
            with pytest.raises(ControlError) as plain:
                ControlClient(w.control_address, WORKER_SERVICE, 5).call("Stats")
            assert plain.value.code == grpc.StatusCode.UNAVAILABLE
            assert ControlClient(w.control_address, WORKER_SERVICE, keys=keys).call("Stats")["configured"]
        session = Path(ray._private.worker._global_node.get_session_dir_path())
    finally:
        stack.close()
    secrets = [keys.token.encode(), keys.curve_server_secret, keys.curve_client_secret,
               keys.tls_key_pem.splitlines()[1]]
    for path in (session / "logs").rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert not any(s in data for s in secrets), f"a secret key is in {path}"
