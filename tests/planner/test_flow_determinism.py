"""The arc flows of a plan must not depend on the process's string-hash seed."""

import os
import subprocess
import sys

from tests.conftest import CLUSTER_SPECS, REPO_ROOT

SCRIPT = f"""
from helix.core.spec import load_cluster
from planner.build import build_problem
from planner.solve import solve
plan = solve(build_problem(load_cluster({str(CLUSTER_SPECS / 'single24.yaml')!r})), method='separate')
print(sorted((a.src, a.dst, round(a.flow_tokens_per_s, 6)) for a in plan.arc_flows))
"""


def test_arc_flows_identical_across_hash_seeds():
    outputs = set()
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                              env=env, cwd=REPO_ROOT, timeout=120, check=True)
        outputs.add(proc.stdout)
    assert len(outputs) == 1
