"""The coordinator's gRPC service (``helix.Coordinator``): native streaming generate and registration.

- ``Generate`` (server streaming): ``{"prompt": str | "prompt_token_ids": [int], "sampling": {vLLM
  SamplingParams fields}, "stop": str | [str], "adapter": a loaded task's name}`` -> ``{"token_ids",
  "text"}`` messages, then one ``{"finish_reason", "usage"}`` (an unknown task: ``NOT_FOUND``). When
  ``sampling.logprobs`` is set (N >= 0), each token message also has ``"token_logprobs"`` (the sampled
  tokens' logprobs) and ``"top_logprobs"`` (per token, the top N ``[token_id, logprob]`` pairs, best
  first), both parallel to ``token_ids``; the values are the raw model's log-softmax, as on the HTTP API.
  A client that goes away cancels the request. Bad input answers ``INVALID_ARGUMENT`` (the same
  checks as the HTTP API: ``SamplingParams`` and ``Coordinator.submit``), a full queue
  ``RESOURCE_EXHAUSTED``, silence ``DEADLINE_EXCEEDED``, a request that failed on a worker ``INTERNAL``.
- ``Register``: a worker started outside Ray (``helix worker``) announces ``{"node", "control",
  "data"}`` (and ``"gpu"``, ``"region"`` for a node that joins while serving);
  ``helix serve`` waits for the nodes it was told are external. With the cluster's keys
  (``--keys``) it needs the cluster token, as every worker call does (:mod:`helix.net.control`).
- ``Info``: the served model and nodes.
- ``Drain`` ``{"node", "force": bool, "move": bool}``, ``Undrain`` ``{"node"}`` and ``Nodes`` ``{}``
  (:mod:`coordinator.drain`): a node's status after the change, or every node's (``{"nodes": [...]}``).
  An unknown node answers ``NOT_FOUND``, a drain that would leave some layer unserved
  ``FAILED_PRECONDITION``.

``Generate``, ``Info`` and the drain calls (:data:`CLIENT_METHODS`) are the client API:
``--api-key`` guards them (``Info`` excepted), as it guards the HTTP API, not the cluster token.
"""

from __future__ import annotations

import hmac
import logging
import threading
import time
from collections.abc import Iterator, Sequence

import grpc

from coordinator.adapters import UnknownAdapter
from coordinator.drain import ADMIN_NEEDS_KEY, DrainRefused, UnknownNode
from coordinator.requests import Delta, RequestTimeout
from coordinator.runtime import Coordinator, NoPipeline, QueueFull, WorkerHandle
from helix.core.errors import HelixUserError
from helix.net.control import COORDINATOR_SERVICE, service_handler
from helix.net.sampling import SamplingParams

log = logging.getLogger("helix.coordinator")

#: Methods clients call (not cluster members): open to callers without the cluster token.
CLIENT_METHODS = ("Generate", "Info", "Drain", "Undrain", "Nodes")


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


def _sampling(d) -> SamplingParams:
    """vLLM ``SamplingParams`` fields from JSON; the values are checked by ``SamplingParams``."""
    if d is None:
        return SamplingParams()
    if not isinstance(d, dict):
        raise HelixUserError(f"'sampling' must be an object of SamplingParams fields, got {d!r}")
    known = set(SamplingParams.__dataclass_fields__)
    unknown = sorted(set(d) - known)
    if unknown:
        raise HelixUserError(f"unknown sampling option(s) {unknown}; known: {sorted(known)}")
    if d.get("stop_token_ids", ()) is None:   # vLLM takes null for "none"
        d = {k: v for k, v in d.items() if k != "stop_token_ids"}
    return SamplingParams(**d)


def _prompt_ids(req: dict, coord: Coordinator) -> list:
    """Token ids as given (``Coordinator.submit`` checks them against the vocabulary)."""
    if "prompt_token_ids" in req:
        ids = req["prompt_token_ids"]
        if not isinstance(ids, list):
            raise HelixUserError(f"'prompt_token_ids' must be a list of token ids, got {ids!r}")
        return ids
    if isinstance(req.get("prompt"), str):
        return coord.codec.encode(req["prompt"])
    raise HelixUserError("Generate needs 'prompt' (a string) or 'prompt_token_ids'")


def _stop(req: dict) -> tuple:
    stop = req.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    if not isinstance(stop, list):
        raise HelixUserError(f"'stop' must be a string or a list of strings, got {stop!r}")
    return tuple(stop)


def _delta(ev: Delta, with_logprobs: bool) -> dict:
    msg = {"token_ids": list(ev.token_ids), "text": ev.text}
    if with_logprobs:   # without them the sampler's logprobs are NaN placeholders: send nothing
        msg["token_logprobs"] = [t.logprob for t in ev.tokens]
        msg["top_logprobs"] = [[[i, lp] for i, lp in t.top_logprobs] for t in ev.tokens]
    return msg


def _node(req: dict) -> str:
    node = req.get("node")
    if not isinstance(node, str) or not node:
        raise HelixUserError(f"'node' must be a node name, got {node!r}")
    return node


def _fail(context: grpc.ServicerContext, code: grpc.StatusCode, details: str) -> None:
    context.set_code(code)
    context.set_details(details)


class CoordinatorService:
    """Handlers of ``helix.Coordinator``; ``coordinator`` may be attached after the server starts."""

    def __init__(self, registry: Registry, model_name: str, api_key: str | None = None,
                 admin_open: bool = True) -> None:
        """``api_key``: what ``Generate`` callers must send as ``authorization: Bearer KEY`` (the
        HTTP API's ``--api-key``; the native client's ``api_key=``). ``admin_open`` False: without
        an API key, ``Drain`` / ``Undrain`` are refused (``helix serve`` off loopback)."""
        self.admin_open = admin_open or api_key is not None
        self.registry = registry
        self.model_name = model_name
        self.coordinator: Coordinator | None = None
        self._expected = f"Bearer {api_key}".encode() if api_key else None
        self.on_join = None
        """``on_join(handle, register_request) -> reply`` for a worker of a node the plan lacks
        (``helix.server.elastic``: checks it, raising one-line errors, and places it); None:
        refused."""

    def _authorized(self, context: grpc.ServicerContext) -> bool:
        if self._expected is None:
            return True
        given = dict(context.invocation_metadata() or ()).get("authorization", "")
        return hmac.compare_digest(given.encode(), self._expected)

    def generate(self, req: dict, context: grpc.ServicerContext) -> Iterator[dict]:
        # Statuses other than INVALID_ARGUMENT are set and the stream ended, not context.abort():
        # abort raises, and the service guard (helix.net.control) would rewrite the status to INTERNAL.
        if not self._authorized(context):
            _fail(context, grpc.StatusCode.UNAUTHENTICATED, "invalid or missing API key (send "
                  "metadata 'authorization: Bearer <key>', helix.Client(api_key=...))")
            return
        coord = self.coordinator
        if coord is None:
            _fail(context, grpc.StatusCode.UNAVAILABLE, "the coordinator is still starting")
            return
        ids = _prompt_ids(req, coord)
        params = _sampling(req.get("sampling"))
        with_logprobs = params.logprobs is not None
        adapter = req.get("adapter")
        if adapter is not None and not isinstance(adapter, str):
            raise HelixUserError(f"adapter must be a task's name, got {adapter!r}")
        try:
            handle = coord.submit(ids, params, _stop(req), adapter=adapter)
        except UnknownAdapter as exc:
            _fail(context, grpc.StatusCode.NOT_FOUND, str(exc))
            return
        except QueueFull as exc:
            context.set_trailing_metadata((("retry-after", str(exc.retry_after_s)),))
            _fail(context, grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
            return
        except NoPipeline as exc:
            context.set_trailing_metadata((("retry-after", str(exc.retry_after_s)),))
            _fail(context, grpc.StatusCode.UNAVAILABLE, str(exc))
            return
        context.add_callback(handle.cancel)   # client gone -> free KV everywhere
        try:
            for ev in handle.events(timeout_s=coord.config.request_timeout_s):
                if isinstance(ev, Delta):
                    yield _delta(ev, with_logprobs)
                elif ev.error is not None:
                    unavailable = ev.retry_after_s is not None   # no pipeline left: retry later
                    if unavailable:
                        context.set_trailing_metadata((("retry-after", str(ev.retry_after_s)),))
                    _fail(context, grpc.StatusCode.UNAVAILABLE if unavailable else
                          grpc.StatusCode.INVALID_ARGUMENT if ev.user_error else grpc.StatusCode.INTERNAL,
                          ev.error)
                    return
                else:
                    yield {"finish_reason": ev.finish_reason,
                           "usage": {"prompt_tokens": ev.prompt_tokens,
                                     "completion_tokens": ev.completion_tokens}}
        except RequestTimeout as exc:
            _fail(context, grpc.StatusCode.DEADLINE_EXCEEDED, str(exc))

    def _changes_allowed(self, context: grpc.ServicerContext) -> None:
        if not self.admin_open:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, ADMIN_NEEDS_KEY)

    def _admin(self, context: grpc.ServicerContext, action) -> dict:
        """``action(coordinator)`` for an authorized caller; its errors as gRPC statuses."""
        if not self._authorized(context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "invalid or missing API key (send metadata "
                          "'authorization: Bearer <key>')")
        coord = self.coordinator
        if coord is None:
            context.abort(grpc.StatusCode.UNAVAILABLE, "the coordinator is still starting")
        try:
            return action(coord)
        except UnknownNode as exc:
            context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        except DrainRefused as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))

    def drain(self, req: dict, context: grpc.ServicerContext) -> dict:
        node = _node(req)
        self._changes_allowed(context)
        force, move = bool(req.get("force", False)), bool(req.get("move", False))
        return self._admin(context, lambda c: c.drain(node, force=force, move=move).to_dict())

    def undrain(self, req: dict, context: grpc.ServicerContext) -> dict:
        node = _node(req)
        self._changes_allowed(context)
        return self._admin(context, lambda c: c.undrain(node).to_dict())

    def nodes(self, _req: dict, context: grpc.ServicerContext) -> dict:
        return self._admin(context, lambda c: {"nodes": [s.to_dict() for s in c.nodes_status()]})

    def info(self, _req: dict, _ctx) -> dict:
        coord = self.coordinator
        return {"model": self.model_name,
                "nodes": sorted(coord.workers) if coord is not None else [],
                "ready": coord is not None}

    def register(self, req: dict, ctx=None) -> dict:
        """A worker says where it listens: before serving starts the registry collects it; after,
        the node rejoins (a restarted worker), loading its slice in the background, or, for a node
        the plan lacks, joins (:attr:`on_join`; ``gpu`` and ``region`` may come with it)."""
        reply = self.registry.register(req, ctx)
        coord = self.coordinator
        if coord is not None:
            handle = WorkerHandle(str(req["node"]), str(req["control"]), str(req["data"]))
            if handle.node not in coord.workers:
                if self.on_join is None:
                    raise HelixUserError(f"node {handle.node!r} is not in the plan; nodes: "
                                         f"{sorted(coord.workers)}")
                return self.on_join(handle, req)
            threading.Thread(target=self._rejoin, args=(coord, handle), daemon=True,
                             name=f"helix-rejoin-{handle.node}").start()
        return reply

    @staticmethod
    def _rejoin(coord: Coordinator, handle: WorkerHandle) -> None:
        try:
            coord.rejoin(handle)
        except Exception:   # the node stays dead; it may register again
            log.exception("coordinator: node %s could not rejoin", handle.node)

    def handler(self) -> grpc.GenericRpcHandler:
        return service_handler(COORDINATOR_SERVICE,
                               {"Register": self.register, "Info": self.info, "Drain": self.drain,
                                "Undrain": self.undrain, "Nodes": self.nodes},
                               {"Generate": self.generate})
