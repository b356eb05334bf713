"""scripts/bench_fidelity.py reads the offline protocol from helix.sim: the stationary mix that
``helix simulate`` replays by default, and its steady state after the fill
(tests/helix/sim/test_offline_replay.py tests both)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from tests.conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "scripts"))
import bench_fidelity  # noqa: E402


def test_the_bench_reads_the_simulators_steady_state():
    run = SimpleNamespace(label="x", duration_s=600.0, steady_decode_throughput_tokens_per_s=712.5)
    assert bench_fidelity.steady_of(run) == 712.5
    with pytest.raises(ValueError, match="no steady state"):
        bench_fidelity.steady_of(SimpleNamespace(label="x", duration_s=1.0,
                                                 steady_decode_throughput_tokens_per_s=None))

