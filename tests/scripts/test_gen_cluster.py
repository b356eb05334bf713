"""scripts/gen_cluster.py: synthetic clusters that helix reads, the same for the same seed."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest

from helix.core.hardware import GPU_CATALOG
from helix.core.spec import load_cluster, parse_cluster
from tests.conftest import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "gen_cluster.py"


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=120, check=check)


def test_writes_a_spec_helix_validate_accepts(tmp_path):
    out = tmp_path / "c.yaml"
    run("--nodes", "60", "--regions", "3", "--seed", "4", "-o", str(out))
    spec = load_cluster(out)
    assert len(spec.nodes) == 60
    assert len(spec.regions) == 3
    assert {n.region for n in spec.nodes} == set(spec.regions)  # every region has nodes
    res = subprocess.run([sys.executable, "-m", "helix.cli", "validate", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr


def test_same_seed_same_bytes_other_seed_other_cluster():
    a = run("--nodes", "200", "--regions", "5", "--seed", "1").stdout
    assert a == run("--nodes", "200", "--regions", "5", "--seed", "1").stdout
    assert a != run("--nodes", "200", "--regions", "5", "--seed", "2").stdout


@pytest.mark.parametrize("nodes,regions", [(1, 1), (7, 7), (100, 1), (1000, 5), (333, 8)])
def test_sizes(nodes, regions):
    from scripts.gen_cluster import generate
    spec = parse_cluster(generate(nodes, regions, seed=3))
    assert len(spec.nodes) == nodes
    per_region = Counter(n.region for n in spec.nodes)
    assert len(per_region) == regions and min(per_region.values()) >= 1
    assert len({n.name for n in spec.nodes}) == nodes
    if regions > 1:  # every pair of regions has its own link, slower than inside a region
        assert len(spec.region_links) == regions * (regions - 1) // 2
        inside = min(r.bandwidth_bytes_per_s for r in spec.regions.values())
        assert all(rl.bandwidth_bytes_per_s < inside for rl in spec.region_links)


def test_mix_comes_from_the_catalog_and_regions_differ():
    from scripts.gen_cluster import generate
    spec = parse_cluster(generate(1000, 5, seed=0))
    assert {n.gpu for n in spec.nodes} <= set(GPU_CATALOG) - {"CPU"}
    assert len({n.label for n in spec.nodes}) >= 8
    mixes = [Counter(n.label for n in spec.nodes if n.region == r) for r in spec.regions]
    shares = [m["T4"] / sum(m.values()) for m in mixes]
    assert max(shares) - min(shares) > 0.05  # regions are not copies of one mix


def test_bad_arguments_are_one_line_errors():
    res = run("--nodes", "3", "--regions", "5", check=False)
    assert res.returncode != 0 and "every region needs a node" in res.stderr
    assert "Traceback" not in res.stderr
    res = run("--nodes", "10", "--model", "no-such-model", check=False)
    assert res.returncode != 0 and "Traceback" not in res.stderr and "no-such-model" in res.stderr
    res = run("--nodes", "10", "--inter-latency-ms", "90-20", check=False)
    assert res.returncode != 0 and "LOW <= HIGH" in res.stderr


def test_a_generated_300_node_cluster_plans_within_the_gap_target():
    """Planning at scale: a 300-node, 5-region cluster from the generator gets a plan
    within 3 % of a proven bound, its flow verified, long before the time limit."""
    from planner import solve
    from planner.build import build_problem
    from scripts.gen_cluster import generate
    problem = build_problem(parse_cluster(generate(300, 5, seed=0)))
    plan = solve(problem, "milp", time_limit_s=300, threads=1, gap=0.03)
    assert plan.extras["status"] in ("gap", "optimal")
    assert plan.upper_bound_tokens_per_s <= plan.max_flow_tokens_per_s * 1.03
    assert len(plan.placements) >= 250
    assert plan.extras["warm_starts_skipped"]   # the gap target stopped the costly ones
    assert plan.solve_seconds < 120   # ~1 s on the shared 2-core machine; ~35 s before
