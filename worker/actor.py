"""The Ray actor around :class:`worker.server.WorkerServer` (thin on purpose).

The launcher wraps this class with ``ray.remote`` (this module does not import Ray). The actor only
starts the worker's servers and reports their addresses; everything else (slice, peers, stats,
drain, shutdown) goes over the worker's own gRPC control service, the same way a worker started
outside Ray with ``helix worker`` is driven.
"""

from __future__ import annotations


import logging
import os
import time

log = logging.getLogger("helix.worker")


class WorkerActor:
    """One worker process: binds its data plane and control service on ``host``.

    With ``coordinator_address`` it also registers there (as ``helix worker`` does). At the first
    start the coordinator only notes it (the launcher hands it the addresses anyway); when Ray
    restarts a worker whose process died, the new process's registration makes the node rejoin:
    the coordinator loads its slice and routes to it again."""

    def __init__(self, node: str, model_path: str, host: str = "127.0.0.1",
                 torch_threads: int | None = 1, coordinator_address: str | None = None,
                 keys=None) -> None:
        """``keys``: the cluster's :class:`~helix.net.keys.ClusterKeys` (an actor argument, never
        logged: its repr names no secret); None: plain sockets."""
        from worker.server import WorkerServer
        self.keys = keys
        self.server = WorkerServer(node, model_path, host=host, torch_threads=torch_threads, keys=keys)
        if coordinator_address:
            self._register(coordinator_address)

    def _register(self, address: str, attempts: int = 5) -> None:
        from helix.net.control import COORDINATOR_SERVICE, ControlClient, ControlError
        client = ControlClient(address, COORDINATOR_SERVICE, keys=self.keys)
        try:
            for attempt in range(attempts):
                try:
                    client.call("Register", self.server.addresses, timeout_s=10.0)
                    return
                except ControlError as exc:
                    log.warning("worker %s: registering with %s failed (%s)", self.server.node,
                                address, exc)
                    time.sleep(min(8.0, 0.5 * 2 ** attempt))
        finally:
            client.close()

    def pid(self) -> int:
        return os.getpid()

    def addresses(self) -> dict[str, str]:
        """``{"node", "control", "data"}``: where the coordinator reaches this worker."""
        return self.server.addresses

    def stop(self) -> None:
        self.server.shutdown()
