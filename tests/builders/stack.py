"""The serving stack in this process, without Ray: three real WorkerServers (ZeroMQ, gRPC control), the
real Coordinator, the coordinator's gRPC service (native client) and the OpenAI app under uvicorn."""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass

from coordinator.grpc_api import CoordinatorService, Registry
from coordinator.runtime import Coordinator, RuntimeConfig, WorkerHandle
from helix.core.plan import Plan
from helix.server.app import create_app
from helix.server.http import HttpThread
from helix.server.metrics import ServingMetrics
from helix.net.control import ControlServer, start_server
from worker.server import WorkerServer

from tests.builders.serving import branching_plan

MODEL_NAME = "tiny"


@dataclass
class LocalStack:
    servers: list[WorkerServer]
    coordinator: Coordinator
    grpc: ControlServer
    http: HttpThread
    metrics: ServingMetrics

    @property
    def url(self) -> str:
        return self.http.url

    def generated_tokens(self) -> int:
        """Output tokens of every request that ended so far (cancelled ones included)."""
        return int(self.metrics.registry.get_sample_value("helix:generation_tokens_total",
                                                           {"model_name": MODEL_NAME}) or 0)

    def kv_blocks_used(self) -> dict[str, int]:
        return {s.node: s.stats().kv_blocks_used for s in self.servers}

    def wait_kv_free(self, timeout_s: float = 10.0) -> None:
        """Poll every worker's real stats until no KV block is in use; fail after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not any(self.kv_blocks_used().values()):
                return
            time.sleep(0.05)
        raise AssertionError(f"KV blocks still used after {timeout_s} s: {self.kv_blocks_used()}")


@contextmanager
def local_stack(ckpt, config: RuntimeConfig | None = None, plan: Plan | None = None):
    """The stack serving ``plan`` (default :func:`branching_plan`) of checkpoint ``ckpt``."""
    plan = plan or branching_plan()
    servers = [WorkerServer(p.node, str(ckpt), torch_threads=1) for p in plan.placements]
    metrics = ServingMetrics(MODEL_NAME)
    coord = grpc = http = None
    try:
        coord = Coordinator(plan, str(ckpt), config or RuntimeConfig(stats_interval_s=0.2),
                            observer=metrics)
        coord.attach([WorkerHandle(s.node, s.control.address, s.data.address) for s in servers])
        service = CoordinatorService(Registry(), MODEL_NAME)
        service.coordinator = coord
        grpc = start_server([service.handler()], "127.0.0.1", 0)
        http = HttpThread(create_app(coord, MODEL_NAME, metrics))
        yield LocalStack(servers, coord, grpc, http, metrics)
    finally:
        if http is not None:
            http.stop()
        if grpc is not None:
            grpc.stop()
        if coord is not None:
            coord.close()
        for s in servers:
            s.shutdown()
