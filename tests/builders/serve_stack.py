"""``helix serve``'s own stack (:class:`ServeStack`) whose workers all register from outside, as
``helix worker`` does: the nodes a test means to kill (SIGKILL) or freeze (SIGSTOP) run as real
``helix worker`` subprocesses, the others as WorkerServers in this process (cheaper to start)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

from coordinator.runtime import Coordinator, RuntimeConfig
from helix.core.plan import Plan
from helix.net.control import COORDINATOR_SERVICE, ControlClient
from helix.server.stack import ServeOptions, ServeStack
from worker.server import WorkerServer

REGISTER_TIMEOUT_S = 120.0
"""How long the stack waits for every worker to register (a subprocess imports torch first)."""


class ServeCluster:
    """The stack serving ``plan`` of checkpoint ``ckpt``, started when built; :meth:`close` stops
    it and every worker (also on leaving a ``with`` block). ``processes``: the nodes run as
    ``helix worker`` subprocesses; ``host``: the address the coordinator and the in-process workers
    bind; ``process_prefix`` and ``process_host``: a command the worker processes run under (``ip
    netns exec NS``) and the address they bind (None: the worker's default); ``options``: further
    :class:`ServeOptions` fields."""

    def __init__(self, ckpt, plan: Plan, runtime: RuntimeConfig, processes: tuple[str, ...] = ("cpu-2",),
                 host: str = "127.0.0.1", process_prefix: tuple[str, ...] = (),
                 process_host: str | None = None, **options) -> None:
        self.ckpt, self.host = str(ckpt), host
        self.process_prefix, self.process_host = process_prefix, process_host
        nodes = tuple(p.node for p in plan.placements)
        self.stack = ServeStack(plan, self.ckpt, ServeOptions(
            host=host, external_nodes=nodes, register_timeout_s=REGISTER_TIMEOUT_S, runtime=runtime,
            **options))
        self.local: dict[str, WorkerServer] = {}
        self.procs: dict[str, list[subprocess.Popen]] = {}
        """Every process started per node, the newest last."""
        self._logs: dict[int, object] = {}
        """Each process's stderr, by pid."""
        try:
            self._start(nodes, processes)
        except BaseException:
            self.close()
            raise

    def _start(self, nodes: tuple[str, ...], processes: tuple[str, ...]) -> None:
        errors: list[BaseException] = []
        starter = threading.Thread(target=self._start_stack, args=(errors,), daemon=True)
        starter.start()
        deadline = time.monotonic() + 30
        while self.stack.grpc is None and starter.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self.stack.grpc is not None, errors or "the coordinator's gRPC service did not start"
        for node in processes:
            self.start_worker(node)
        self.local = {n: WorkerServer(n, self.ckpt, host=self.host, torch_threads=1)
                      for n in nodes if n not in processes}
        reg = ControlClient(self.stack.grpc.address, COORDINATOR_SERVICE)
        for w in self.local.values():
            reg.call("Register", w.addresses)
        reg.close()
        while starter.is_alive():   # a worker process that dies before it registers fails at once
            starter.join(timeout=0.2)
            for node in processes:
                proc = self.process(node)
                if proc.poll() is not None:
                    raise AssertionError(f"helix worker --node {node} exited with {proc.returncode}:\n"
                                         f"{self._log_tail(proc)}")
        assert not errors, errors

    def _start_stack(self, errors: list[BaseException]) -> None:
        try:
            self.stack.start()
        except BaseException as exc:
            errors.append(exc)

    @property
    def coord(self) -> Coordinator:
        return self.stack.coordinator

    def start_worker(self, node: str) -> subprocess.Popen:
        """A new ``helix worker`` process for ``node``: it registers (or joins again) by itself."""
        command = [*self.process_prefix, sys.executable, "-m", "helix.cli", "worker", "--coordinator",
                   self.stack.grpc.address, "--node", node, "--model", self.ckpt]
        if self.process_host is not None:
            command += ["--host", self.process_host]
        log = tempfile.TemporaryFile()
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
        self._logs[proc.pid] = log
        self.procs.setdefault(node, []).append(proc)
        return proc

    def process(self, node: str) -> subprocess.Popen:
        """``node``'s newest worker process."""
        return self.procs[node][-1]

    def _log_tail(self, proc: subprocess.Popen, chars: int = 3000) -> str:
        log = self._logs[proc.pid]
        log.seek(0)
        return log.read().decode(errors="replace")[-chars:]

    def close(self) -> None:
        for proc in (p for ps in self.procs.values() for p in ps):
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)   # a frozen one must run to die
                proc.kill()
            proc.wait(timeout=30)
        self.stack.close()
        for w in self.local.values():
            w.shutdown()
        for log in self._logs.values():
            log.close()

    def __enter__(self) -> "ServeCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
