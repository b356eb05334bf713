"""Fixtures for serving tests: the demo's tiny checkpoint (with its HF model as the oracle), a plan
with overlapping slices and two pipelines, and greedy reference outputs from ``transformers``."""

from __future__ import annotations

import pytest

from helix.plan import Plan
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
