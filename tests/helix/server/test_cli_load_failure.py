"""``helix serve`` as a user runs it (a subprocess, local Ray): a worker that cannot load its slice stops
the command with a non-zero exit and one error line naming the node and the reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.builders.cli import run_helix
from tests.builders.serving import branching_plan

pytest.importorskip("ray")
safetensors_torch = pytest.importorskip("safetensors.torch")

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(240)]

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
    result = run_helix(["serve", str(plan), "--model", str(ckpt), "--port", "0", "--grpc-port", "0"],
                       CLI_TIMEOUT_S)
    out, err = result.stdout, result.stderr
    assert result.returncode == 2, (out, err)   # helix's exit code for a user error
    assert "Traceback" not in err, err
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, err
    assert "worker 'cpu-0' failed to load its slice [0, 4)" in errors[0]
    assert missing in errors[0]   # the reason: the shard file that is not there
    assert "workers ready" not in out
