"""scripts/testbed_bench.py: the cluster spec that describes the geo testbed to helix plan / simulate
(runs everywhere; the testbed itself is opt-in, see test_geo_testbed.py)."""

from __future__ import annotations

import sys

import pytest
import yaml

from helix.core.spec import parse_cluster
from tests.conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "scripts"))
from testbed_bench import testbed_spec as spec_yaml  # noqa: E402  (not collected as a test)


def test_the_spec_has_the_testbeds_links_regions_and_coordinator():
    delays = ((0.0, 40.0, 60.0), (40.0, 0.0, 80.0), (60.0, 80.0, 0.0))
    spec = parse_cluster(yaml.safe_load(spec_yaml(("r0", "r1", "r2"), delays, 150.0)))
    assert [n.name for n in spec.nodes] == ["r0-cpu", "r1-cpu", "r2-cpu"]
    assert [spec.region_of(n.name) for n in spec.nodes] == ["r0", "r1", "r2"]
    assert spec.region_of("coordinator") == "r0"
    for i, j in ((0, 1), (0, 2), (1, 2)):
        for a, b in ((i, j), (j, i)):
            link = spec.link(f"r{a}-cpu", f"r{b}-cpu")
            assert link.latency_s == pytest.approx(delays[a][b] / 1e3)
            assert link.bandwidth_bytes_per_s == pytest.approx(150e6 / 8)
    # The coordinator (r0) reaches r2's node over the r0-r2 link.
    assert spec.link("coordinator", "r2-cpu").latency_s == pytest.approx(0.060)
