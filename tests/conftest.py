"""Shared test setup: Ray must never ask for auth in tests; paths to the repo and shared data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
CLUSTER_SPECS = REPO_ROOT / "cluster_specs"


@pytest.fixture
def shared_data() -> Path:
    """The read-only reference data folder (traces, measured profiles) beside the repo."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA
