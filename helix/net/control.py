"""The control plane: real gRPC (HTTP/2) with generic handlers and compact JSON messages.

No protoc step: a service is a name plus a table of methods, each ``fn(request: dict, context) ->
dict`` (unary) or ``-> Iterator[dict]`` (server streaming); requests and replies are JSON objects.
A handler that raises :class:`~helix.errors.HelixUserError` answers ``INVALID_ARGUMENT`` with the
message; any other exception answers ``INTERNAL`` with its text (and is a bug on the serving side).

Two services use it: ``helix.Worker`` (configure slice and peers, health, stats, drain, shutdown;
:mod:`worker.server`) and ``helix.Coordinator`` (worker registration and the native streaming
generate API; :mod:`coordinator.grpc_api`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from concurrent import futures
from dataclasses import dataclass

import grpc

from helix.errors import HelixUserError
from helix.net.data_plane import advertised_host

WORKER_SERVICE = "helix.Worker"
COORDINATOR_SERVICE = "helix.Coordinator"

Unary = Callable[[dict, grpc.ServicerContext], dict]
Streaming = Callable[[dict, grpc.ServicerContext], Iterator[dict]]

_OPTIONS = [("grpc.max_send_message_length", 64 * 2**20),
            ("grpc.max_receive_message_length", 64 * 2**20),
            ("grpc.so_reuseport", 0)]


def to_json(obj: dict) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def from_json(data: bytes) -> dict:
    obj = json.loads(data) if data else {}
    if not isinstance(obj, dict):
        raise ValueError("control message must be a JSON object")
    return obj


class ControlError(RuntimeError):
    """A control call failed: ``code`` is the gRPC status, ``details`` the peer's message."""

    def __init__(self, method: str, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{method}: {code.name}: {details}")
        self.code = code
        self.details = details


def _parse(raw: bytes, context: grpc.ServicerContext) -> dict:
    """The request object; a body that is not a JSON object answers INVALID_ARGUMENT (parsed here,
    not by gRPC's deserializer, which would answer INTERNAL)."""
    try:
        return from_json(raw)
    except ValueError as exc:   # JSONDecodeError and UnicodeDecodeError are ValueErrors
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"request is not a JSON object: {exc}")


def _guard_unary(fn: Unary) -> Unary:
    def call(raw: bytes, context: grpc.ServicerContext) -> dict:
        request = _parse(raw, context)
        try:
            return fn(request, context)
        except HelixUserError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except Exception as exc:  # a bug here must still reach the caller as text
            _abort_internal(context, exc)
    return call


def _guard_stream(fn: Streaming) -> Streaming:
    def call(raw: bytes, context: grpc.ServicerContext) -> Iterator[dict]:
        request = _parse(raw, context)
        try:
            yield from fn(request, context)
        except HelixUserError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except Exception as exc:
            _abort_internal(context, exc)
    return call


def _abort_internal(context: grpc.ServicerContext, exc: Exception) -> None:
    """Answer INTERNAL with the exception's text, unless the handler already chose a status with
    ``context.abort`` (which raises): then that status stands (e.g. RESOURCE_EXHAUSTED)."""
    if context.code() not in (None, grpc.StatusCode.OK):
        raise exc
    context.abort(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")


def service_handler(service: str, unary: Mapping[str, Unary],
                    streaming: Mapping[str, Streaming] = {}) -> grpc.GenericRpcHandler:
    handlers = {name: grpc.unary_unary_rpc_method_handler(
        _guard_unary(fn), request_deserializer=None, response_serializer=to_json)
        for name, fn in unary.items()}
    handlers.update({name: grpc.unary_stream_rpc_method_handler(
        _guard_stream(fn), request_deserializer=None, response_serializer=to_json)
        for name, fn in streaming.items()})
    return grpc.method_handlers_generic_handler(service, handlers)


@dataclass
class ControlServer:
    """A running gRPC server and the address it listens on."""

    server: grpc.Server
    address: str

    def stop(self, grace_s: float = 0.5) -> None:
        self.server.stop(grace_s).wait(timeout=grace_s + 2.0)


def start_server(handlers: list[grpc.GenericRpcHandler], host: str = "127.0.0.1", port: int = 0,
                 max_workers: int = 16) -> ControlServer:
    """Start a gRPC server on ``host:port`` (0 = any free port)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers), options=_OPTIONS)
    for h in handlers:
        server.add_generic_rpc_handlers((h,))
    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError:   # grpcio >= 1.5x raises where older versions returned 0
        bound = 0
    if bound == 0:
        raise HelixUserError(f"cannot listen for gRPC on {host}:{port}: the address is in use or "
                             f"not this machine's")
    server.start()
    return ControlServer(server, f"{advertised_host(host)}:{bound}")


class ControlClient:
    """Calls one gRPC service at ``address`` with JSON messages; every call has a deadline."""

    def __init__(self, address: str, service: str, default_timeout_s: float = 10.0) -> None:
        self.address = address
        self.service = service
        self.default_timeout_s = default_timeout_s
        self.channel = grpc.insecure_channel(address, options=_OPTIONS)

    def call(self, method: str, request: dict | None = None, timeout_s: float | None = None) -> dict:
        rpc = self.channel.unary_unary(f"/{self.service}/{method}", request_serializer=to_json,
                                       response_deserializer=from_json)
        try:
            return rpc(request or {}, timeout=timeout_s or self.default_timeout_s)
        except grpc.RpcError as exc:
            raise ControlError(f"{self.address} {method}", exc.code(), exc.details() or "") from None

    def stream(self, method: str, request: dict, timeout_s: float) -> Iterator[dict]:
        rpc = self.channel.unary_stream(f"/{self.service}/{method}", request_serializer=to_json,
                                        response_deserializer=from_json)
        try:
            yield from rpc(request, timeout=timeout_s)
        except grpc.RpcError as exc:
            raise ControlError(f"{self.address} {method}", exc.code(), exc.details() or "") from None

    def close(self) -> None:
        self.channel.close()
