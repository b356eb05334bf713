"""Elastic-cluster builders: ``helix plan``'s plan of a spec less some node, so that the
node can join the running stack."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import REPO_ROOT

LOCAL3 = REPO_ROOT / "cluster_specs" / "local3.yaml"


def plan_without(spec, node: str | None, base_dir: Path = LOCAL3.parent):
    """``helix plan``'s plan (serving limits, flow capacities) of ``spec`` less ``node`` (None:
    every node)."""
    from helix.core.spec import parse_cluster
    from planner import PlanOptions, plan
    data = spec.to_dict()
    data["nodes"] = [n for n in data["nodes"] if n["name"] != node]
    less = parse_cluster(data, base_dir=base_dir)
    return plan(less, PlanOptions(time_limit_s=10, threads=1, seed=0))
