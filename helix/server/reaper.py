"""Nothing ``helix serve`` started outlives it, even when it is SIGKILLed.

A SIGTERM (or Ctrl-C) of ``helix serve`` shuts down in order: workers stopped over the control
plane, the actors killed, the local Ray stopped. A SIGKILL runs no code at all, and a local Ray's
own processes (GCS, raylet, dashboard and runtime-env agents, the workers' processes) then stay
behind. So ``helix serve`` starts this small watchdog as a child holding the read end of a pipe
whose write end only the server holds:

- while the server lives, the watchdog records every descendant of the server's process (walking
  ``/proc`` once a second), each with its start time so a recycled PID is never mistaken for it;
- when the pipe reaches end-of-file (the server exited, however it died; the kernel closes its
  descriptors) it sends SIGTERM to every recorded process still alive, waits up to
  ``grace_s``, SIGKILLs what remains, and exits.

So after a SIGKILL everything is gone within about ``1 + grace_s`` seconds. It only acts on processes
it saw descend from the server, never on anything else on the machine. Linux only (``/proc``);
elsewhere the watchdog is not started. Run as ``python -m helix.server.reaper SERVER_PID``.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

GRACE_S = 5.0
SCAN_INTERVAL_S = 1.0


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a live process, or None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = raw[raw.rindex(b")") + 2:].split()   # the command name may hold spaces and ')'
    return int(fields[1]), int(fields[19])


def descendants(root: int) -> dict[int, int]:
    """{pid: start time} of every live descendant of ``root`` (not ``root`` itself)."""
    children: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None:
                children.setdefault(st[0], []).append(int(entry))
                starts[int(entry)] = st[1]
    found, todo = {}, [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found[child] = starts[child]
                todo.append(child)
    return found


def _alive(pid: int, start: int) -> bool:
    st = _stat(pid)
    return st is not None and st[1] == start


def reap(recorded: dict[int, int], grace_s: float = GRACE_S) -> None:
    """SIGTERM every recorded process still alive (same start time), SIGKILL it after ``grace_s``."""
    me = os.getpid()
    targets = {p: s for p, s in recorded.items() if p != me and _alive(p, s)}
    for pid in targets:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(p, s) for p, s in targets.items()):
        time.sleep(0.1)
    for pid, start in targets.items():
        if _alive(pid, start):
            _signal(pid, signal.SIGKILL)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def watch(server_pid: int, pipe_fd: int, grace_s: float = GRACE_S) -> None:
    """Record the server's descendants until ``pipe_fd`` reaches end-of-file, then reap them."""
    recorded: dict[int, int] = {}
    while True:
        recorded.update(descendants(server_pid))
        ready, _, _ = select.select([pipe_fd], [], [], SCAN_INTERVAL_S)
        if ready and not os.read(pipe_fd, 4096):
            break
    recorded.pop(os.getpid(), None)
    reap(recorded, grace_s)


class Watchdog:
    """The server's side: starts the watchdog process and holds the pipe's write end."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        if not Path("/proc/self/stat").exists():
            return
        # stdin is the pipe; the watchdog ignores SIGINT so a Ctrl-C in the terminal reaches only
        # the server, whose orderly shutdown runs first.
        self.proc = subprocess.Popen([sys.executable, "-m", "helix.server.reaper", str(os.getpid())],
                                     stdin=subprocess.PIPE, close_fds=True)

    def close(self) -> None:
        """After an orderly shutdown: let the watchdog sweep up anything left, then exit."""
        if self.proc is not None and self.proc.stdin is not None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=GRACE_S + 5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            self.proc = None


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watch(int(sys.argv[1]), sys.stdin.fileno())
