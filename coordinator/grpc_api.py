"""The coordinator's gRPC service (``helix.Coordinator``): native streaming generate and registration.

- ``Generate`` (server streaming): ``{"prompt": str | "prompt_token_ids": [int], "sampling": {vLLM
  SamplingParams fields}, "stop": [str]}`` -> ``{"token_ids", "text"}`` messages, then one
  ``{"finish_reason", "usage"}``. A client that goes away cancels the request.
- ``Register``: a worker started outside Ray (``helix worker``) announces ``{"node", "control",
  "data"}``; ``helix serve`` waits for the nodes it was told are external.
- ``Info``: the served model and nodes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence

import grpc

from coordinator.requests import Delta, Done, RequestTimeout
from coordinator.runtime import Coordinator, QueueFull, WorkerHandle
from helix.errors import HelixUserError
from worker.control import COORDINATOR_SERVICE, service_handler
from worker.sampling import SamplingParams


class Registry:
    """Workers that registered over gRPC, waited on with a timeout."""

    def __init__(self) -> None:
        self._workers: dict[str, WorkerHandle] = {}
        self._cond = threading.Condition()

    def register(self, req: dict, _ctx=None) -> dict:
        try:
            handle = WorkerHandle(str(req["node"]), str(req["control"]), str(req["data"]))
        except KeyError as exc:
            raise HelixUserError(f"Register needs node, control and data; missing {exc}") from None
        with self._cond:
            self._workers[handle.node] = handle
            self._cond.notify_all()
        return {"ok": True}

    def wait(self, nodes: Sequence[str], timeout_s: float) -> list[WorkerHandle]:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                missing = [n for n in nodes if n not in self._workers]
                if not missing:
                    return [self._workers[n] for n in nodes]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise HelixUserError(f"external worker(s) {missing} did not register within "
                                         f"{timeout_s:.0f} s (start them with: helix worker "
                                         f"--coordinator HOST:PORT --node NAME --model PATH)")
                self._cond.wait(timeout=min(left, 1.0))


def _sampling(d: dict) -> SamplingParams:
    d = dict(d or {})
    if "stop_token_ids" in d:
        d["stop_token_ids"] = tuple(d["stop_token_ids"])
    try:
        return SamplingParams(**d)
    except TypeError as exc:
        raise HelixUserError(f"unknown sampling option: {exc}") from None


class CoordinatorService:
    """Handlers of ``helix.Coordinator``; ``coordinator`` may be attached after the server starts."""

    def __init__(self, registry: Registry, model_name: str) -> None:
        self.registry = registry
        self.model_name = model_name
        self.coordinator: Coordinator | None = None

    def generate(self, req: dict, context: grpc.ServicerContext) -> Iterator[dict]:
        coord = self.coordinator
        if coord is None:
            context.abort(grpc.StatusCode.UNAVAILABLE, "the coordinator is still starting")
        if "prompt_token_ids" in req:
            ids = [int(t) for t in req["prompt_token_ids"]]
        elif isinstance(req.get("prompt"), str):
            ids = coord.codec.encode(req["prompt"])
        else:
            raise HelixUserError("Generate needs 'prompt' (a string) or 'prompt_token_ids'")
        try:
            handle = coord.submit(ids, _sampling(req.get("sampling")), tuple(req.get("stop") or ()))
        except QueueFull as exc:
            context.set_trailing_metadata((("retry-after", str(exc.retry_after_s)),))
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        context.add_callback(handle.cancel)   # client gone -> free KV everywhere
        try:
            for ev in handle.events(timeout_s=coord.config.request_timeout_s):
                if isinstance(ev, Delta):
                    yield {"token_ids": list(ev.token_ids), "text": ev.text}
                elif isinstance(ev, Done):
                    yield {"finish_reason": ev.finish_reason,
                           "usage": {"prompt_tokens": ev.prompt_tokens,
                                     "completion_tokens": ev.completion_tokens}}
        except RequestTimeout as exc:
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc))

    def info(self, _req: dict, _ctx) -> dict:
        coord = self.coordinator
        return {"model": self.model_name,
                "nodes": sorted(coord.workers) if coord is not None else [],
                "ready": coord is not None}

    def handler(self) -> grpc.GenericRpcHandler:
        return service_handler(COORDINATOR_SERVICE,
                               {"Register": self.registry.register, "Info": self.info},
                               {"Generate": self.generate})
