import pytest

import helix.sim.engine


@pytest.fixture(autouse=True)
def _check_skipped_steps(monkeypatch):
    """Every schedule() the simulator skips as idle must really have had nothing to run."""
    monkeypatch.setattr(helix.sim.engine, "CHECK_SKIPPED_STEPS", True)
