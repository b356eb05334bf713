"""Running the real ``helix`` CLI as a user does: a subprocess in its own session with a local Ray of
its own, ended with everything it started if it hangs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT


def helix_env() -> dict:
    """This environment without ``RAY_ADDRESS`` (a local Ray of its own) and with Ray's auth off."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_AUTH_MODE"] = "disabled"
    return env


def run_helix(args: list[str], timeout_s: float = 120.0) -> subprocess.CompletedProcess:
    """``helix ARGS`` to its exit; fails the test (and kills its session) after ``timeout_s``."""
    cmd = [sys.executable, "-m", "helix.cli", *args]
    # Its own session, so a hang can be ended with Ray's processes it started, and nothing else.
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=helix_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"helix {' '.join(args[:2])} still running after {timeout_s} s:\n{out}\n{err}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
