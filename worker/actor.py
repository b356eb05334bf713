"""The Ray actor around :class:`worker.server.WorkerServer` (thin on purpose).

The launcher wraps this class with ``ray.remote`` (this module does not import Ray). The actor only
starts the worker's servers and reports their addresses; everything else (slice, peers, stats,
drain, shutdown) goes over the worker's own gRPC control service, the same way a worker started
outside Ray with ``helix worker`` is driven.
"""

from __future__ import annotations


class WorkerActor:
    """One worker process: binds its data plane and control service on ``host``."""

    def __init__(self, node: str, model_path: str, host: str = "127.0.0.1",
                 torch_threads: int | None = 1) -> None:
        from worker.server import WorkerServer
        self.server = WorkerServer(node, model_path, host=host, torch_threads=torch_threads)

    def addresses(self) -> dict[str, str]:
        """``{"node", "control", "data"}``: where the coordinator reaches this worker."""
        return self.server.addresses

    def stop(self) -> None:
        self.server.shutdown()
