"""``helix serve --max-model-len N``: the served context is capped at N (requests, ``/v1/models``,
``/tokenize``); more than the checkpoint's ``max_position_embeddings`` is a one-line error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from coordinator.runtime import RuntimeConfig
from coordinator.textcodec import TextCodec

from tests.builders.serving import PROMPTS, branching_plan
from tests.builders.stack import MODEL_NAME, local_stack

httpx = pytest.importorskip("httpx")

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[3]
CAP = 40


def test_the_cap_is_what_the_api_serves(tiny_model):
    checkpoint = TextCodec(tiny_model[0]).checkpoint_context_tokens
    assert CAP < checkpoint
    with local_stack(tiny_model[0], RuntimeConfig(stats_interval_s=0.2, max_model_len=CAP)) as s:
        assert httpx.get(s.url + "/v1/models", timeout=10).json()["data"][0]["max_model_len"] == CAP
        tok = httpx.post(s.url + "/tokenize", json={"prompt": PROMPTS[0]}, timeout=10).json()
        assert tok["max_model_len"] == CAP
        body = {"model": MODEL_NAME, "prompt": PROMPTS[0], "temperature": 0, "ignore_eos": True}
        ok = httpx.post(s.url + "/v1/completions", timeout=60,
                        json={**body, "max_tokens": CAP - tok["count"]})
        assert ok.status_code == 200, ok.text
        assert ok.json()["usage"]["total_tokens"] == CAP
        over = httpx.post(s.url + "/v1/completions", timeout=60,
                          json={**body, "max_tokens": CAP - tok["count"] + 1})
        assert over.status_code == 400 and f"context of {CAP} tokens" in over.json()["error"]["message"]


def test_a_cap_past_the_checkpoint_is_one_line(tiny_model, tmp_path):
    checkpoint = TextCodec(tiny_model[0]).checkpoint_context_tokens
    plan = tmp_path / "plan.yaml"
    branching_plan().save(plan)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_AUTH_MODE"] = "disabled"
    proc = subprocess.run([sys.executable, "-m", "helix.cli", "serve", str(plan), "--model",
                           str(tiny_model[0]), "--port", "0", "--grpc-port", "0",
                           "--max-model-len", str(checkpoint + 1)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=100)
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "--max-model-len" in lines[0] and str(checkpoint) in lines[0], \
        proc.stderr
    assert "Traceback" not in proc.stderr
