"""Ray worker processes run at the coordinator's CPU priority (Ray would start them 15 nice levels
lower), unless ``--worker-niceness`` asks for less: real actors on a local Ray started here, their
priority read from the kernel by PID."""

from __future__ import annotations

import os

import pytest

from helix.server.launcher import LaunchConfig, RayLauncher, node_resource

ray = pytest.importorskip("ray")

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(300)]


def _niceness(pid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, pid)


def test_workers_run_at_the_drivers_priority_unless_asked(tiny_model):
    ckpt, _ = tiny_model
    os.environ["RAY_AUTH_MODE"] = "disabled"
    ray.init(resources={node_resource("same"): 1, node_resource("lower"): 1}, num_cpus=1,
             include_dashboard=False, logging_level="WARNING")
    launchers = [RayLauncher(LaunchConfig(node_timeout_s=30)),
                 RayLauncher(LaunchConfig(node_timeout_s=30, worker_niceness=15))]
    try:
        launchers[0].start(["same"], str(ckpt))
        launchers[1].start(["lower"], str(ckpt))
        driver = _niceness(0)
        assert driver < 19   # else no lower priority exists to tell the two apart
        assert _niceness(launchers[0].worker_pid("same")) == driver
        assert _niceness(launchers[1].worker_pid("lower")) == min(19, driver + 15)
    finally:
        for launcher in launchers:
            launcher.shutdown()
        ray.shutdown()


def test_niceness_out_of_range_is_refused():
    from helix.core.errors import HelixUserError
    with pytest.raises(HelixUserError, match=r"--worker-niceness must be in \[0, 19\], got 20"):
        LaunchConfig(worker_niceness=20)
