"""``helix serve`` as a user runs it (a subprocess, local Ray): a worker that cannot load its slice stops
the command with a non-zero exit and one error line naming the node and the reason."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.builders.serving import branching_plan

pytest.importorskip("ray")
safetensors_torch = pytest.importorskip("safetensors.torch")

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[3]
CLI_TIMEOUT_S = 180


def _checkpoint_missing_a_shard(src: Path, dst: Path) -> str:
    """``src`` resharded in two, with the shard holding the embedding and layers 0-1 deleted: of
    :func:`branching_plan`'s slices only cpu-0 [0, 4) needs it. Returns the missing shard's name."""
    dst.mkdir()
    for f in src.iterdir():
        if f.name != "model.safetensors":
            (dst / f.name).write_bytes(f.read_bytes())
    tensors = safetensors_torch.load_file(src / "model.safetensors")
    missing, kept = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    first = {k for k in tensors if k == "model.embed_tokens.weight"
             or k.startswith(("model.layers.0.", "model.layers.1."))}
    safetensors_torch.save_file({k: v for k, v in tensors.items() if k not in first}, dst / kept)
    weight_map = {k: missing if k in first else kept for k in tensors}
    (dst / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return missing


def test_serve_stops_with_node_and_reason_when_a_worker_cannot_load(tiny_model, tmp_path):
    ckpt = tmp_path / "ckpt"
    missing = _checkpoint_missing_a_shard(Path(tiny_model[0]), ckpt)
    plan = tmp_path / "plan.yaml"
    branching_plan().save(plan)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}   # a local Ray of its own
    env["RAY_AUTH_MODE"] = "disabled"
    cmd = [sys.executable, "-m", "helix.cli", "serve", str(plan), "--model", str(ckpt),
           "--port", "0", "--grpc-port", "0"]
    # Its own session, so a hang can be ended with Ray's processes it started, and nothing else.
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=CLI_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"helix serve still running after {CLI_TIMEOUT_S} s:\n{out}\n{err}")
    assert proc.returncode == 2, (out, err)   # helix's exit code for a user error
    assert "Traceback" not in err, err
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, err
    assert "worker 'cpu-0' failed to load its slice [0, 4)" in errors[0]
    assert missing in errors[0]   # the reason: the shard file that is not there
    assert "workers ready" not in out
