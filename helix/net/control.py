"""The control plane: real gRPC (HTTP/2) with generic handlers and compact JSON messages.

No protoc step: a service is a name plus a table of methods, each ``fn(request: dict, context) ->
dict`` (unary) or ``-> Iterator[dict]`` (server streaming); requests and replies are JSON objects.
A handler that raises :class:`~helix.core.errors.HelixUserError` answers ``INVALID_ARGUMENT`` with the
message; any other exception answers ``INTERNAL`` with its text (and is a bug on the serving side).

Two services use it: ``helix.Worker`` (configure slice and peers, health, stats, drain, shutdown;
:mod:`worker.server`) and ``helix.Coordinator`` (worker registration and the native streaming
generate API; :mod:`coordinator.grpc_api`).

With :class:`~helix.net.keys.ClusterKeys`, servers speak TLS with the cluster's certificate and every
call must carry ``authorization: Bearer TOKEN`` (compared in constant time; otherwise
``UNAUTHENTICATED`` and a log line naming the method and the peer), except the methods a server
names open (the coordinator's client API, which ``--api-key`` guards); clients trust only that
certificate and send the token. Without keys: plain HTTP/2, for loopback.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Callable, Iterator, Mapping
from concurrent import futures
from dataclasses import dataclass

import grpc

from helix.core.errors import HelixUserError
from helix.net.data_plane import advertised_host
from helix.net.keys import TLS_SERVER_NAME, ClusterKeys

log = logging.getLogger("helix.net")

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


class _TokenCheck(grpc.ServerInterceptor):
    """Refuses every call without the cluster's bearer token, except ``open_methods``."""

    def __init__(self, token: str, open_methods: frozenset[str]) -> None:
        self._expected = f"Bearer {token}".encode()
        self._open = open_methods

    def intercept_service(self, continuation, details):
        handler = continuation(details)
        if handler is None or details.method.rsplit("/", 1)[-1] in self._open:
            return handler
        given = dict(details.invocation_metadata or ()).get("authorization", "")
        if hmac.compare_digest(given.encode(), self._expected):
            return handler
        method = details.method

        def refuse(_request, context):
            log.warning("refused gRPC %s from %s: %s cluster token", method, context.peer(),
                        "a wrong" if given else "no")
            context.abort(grpc.StatusCode.UNAUTHENTICATED,
                          "this call needs the cluster's token (helix keys; --keys DIR)")

        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(refuse)
        return grpc.unary_unary_rpc_method_handler(refuse)


def start_server(handlers: list[grpc.GenericRpcHandler], host: str = "127.0.0.1", port: int = 0,
                 max_workers: int = 16, keys: ClusterKeys | None = None,
                 open_methods: tuple[str, ...] = ()) -> ControlServer:
    """Start a gRPC server on ``host:port`` (0 = any free port). With ``keys``: TLS, and the cluster
    token on every method but ``open_methods`` (names without the service)."""
    interceptors = [_TokenCheck(keys.token, frozenset(open_methods))] if keys is not None else []
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers), options=_OPTIONS,
                         interceptors=interceptors)
    for h in handlers:
        server.add_generic_rpc_handlers((h,))
    try:
        if keys is None:
            bound = server.add_insecure_port(f"{host}:{port}")
        else:
            credentials = grpc.ssl_server_credentials([(keys.tls_key_pem, keys.tls_cert_pem)])
            bound = server.add_secure_port(f"{host}:{port}", credentials)
    except RuntimeError:   # grpcio >= 1.5x raises where older versions returned 0
        bound = 0
    if bound == 0:
        raise HelixUserError(f"cannot listen for gRPC on {host}:{port}: the address is in use or "
                             f"not this machine's")
    server.start()
    return ControlServer(server, f"{advertised_host(host)}:{bound}")


def tls_channel_options(cert_pem: bytes) -> tuple[grpc.ChannelCredentials, list]:
    """TLS trusting only ``cert_pem``, checked against :data:`TLS_SERVER_NAME` whatever address is
    dialled; (credentials, channel options)."""
    return (grpc.ssl_channel_credentials(root_certificates=cert_pem),
            [("grpc.ssl_target_name_override", TLS_SERVER_NAME),
             ("grpc.default_authority", TLS_SERVER_NAME)])


def open_channel(address: str, keys: ClusterKeys | None) -> grpc.Channel:
    """A channel to a cluster member: plain without ``keys``; with them, TLS (the cluster's
    certificate) and the token on every call."""
    if keys is None:
        return grpc.insecure_channel(address, options=_OPTIONS)
    tls, options = tls_channel_options(keys.tls_cert_pem)
    credentials = grpc.composite_channel_credentials(tls, grpc.access_token_call_credentials(keys.token))
    return grpc.secure_channel(address, credentials, options=_OPTIONS + options)


class ControlClient:
    """Calls one gRPC service at ``address`` with JSON messages; every call has a deadline. With
    ``keys``: over TLS, with the cluster token."""

    def __init__(self, address: str, service: str, default_timeout_s: float = 10.0,
                 keys: ClusterKeys | None = None) -> None:
        self.address = address
        self.service = service
        self.default_timeout_s = default_timeout_s
        self.channel = open_channel(address, keys)

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
