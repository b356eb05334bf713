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
