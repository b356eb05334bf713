"""What the HTTP API checks before a route runs: the API key, the body's size and how long it takes.

Two plain ASGI middlewares, outermost first:

- :class:`ApiKeyGuard` (``helix serve --api-key``, as vLLM's ``--api-key``): every ``/v1`` route,
  ``/tokenize`` / ``/detokenize`` and the ``/admin`` routes (draining nodes) need
  ``Authorization: Bearer <key>`` (compared in constant time);
  ``/health`` and ``/metrics`` too when asked. A missing or wrong key is 401, before the body is read.
- :class:`BodyGuard`: a body is read whole, with a byte limit (413 as soon as ``Content-Length`` or
  the bytes received pass it) and a deadline for the whole body (408: a client that announces more
  bytes than it sends no longer holds a connection and a task forever). The route then gets the
  buffered body, and later ``receive`` calls go to the client (a streaming response still notices
  a disconnect).

Both answer with the API's OpenAI-style error body.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from dataclasses import dataclass, field

#: Default most bytes of one request body (a 128k-token prompt as ids is ~1 MB of JSON).
DEFAULT_MAX_BODY_BYTES = 16 * 2**20
#: Default seconds a client may take to send a whole request body.
DEFAULT_BODY_TIMEOUT_S = 30.0



@dataclass(frozen=True)
class HttpOptions:
    """How the HTTP API guards itself (``helix serve --api-key ... --max-request-bytes ...``)."""

    api_key: str | None = field(default=None, repr=False)
    """Bearer token every ``/v1`` route (and ``/tokenize``, ``/detokenize``, ``/admin``) requires;
    None = open."""
    protect_health: bool = False
    """With a key: ``/health``, ``/metrics`` and ``/ping`` need it too (vLLM leaves them open)."""
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    strict: bool = False
    """Refuse unknown request fields (HTTP 400) instead of ignoring them with a warning."""
    admin_open: bool = True
    """Without an API key: whether ``/admin/drain`` and ``/admin/undrain`` (and gRPC ``Drain`` /
    ``Undrain``), ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` answer anyone. ``helix serve`` keeps them open only when it listens on loopback;
    off loopback they need ``--api-key`` (403 otherwise), whatever ``--keys`` says (the cluster
    token guards the workers' planes, not the client API)."""

    def __post_init__(self) -> None:
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("--api-key must not be empty")
        if self.max_body_bytes < 1 or not self.body_timeout_s > 0:
            raise ValueError("the body limit and timeout must be positive")


def install(app, options: HttpOptions) -> None:
    """Wrap ``app`` (a Starlette/FastAPI app, before it starts) in the guards ``options`` ask for."""
    app.add_middleware(BodyGuard, max_body_bytes=options.max_body_bytes,
                       body_timeout_s=options.body_timeout_s)
    if options.api_key is not None:   # added last = outermost: a bad key never gets its body read
        app.add_middleware(ApiKeyGuard, api_key=options.api_key, protect_health=options.protect_health)


_PROTECTED_PREFIXES = ("/v1/", "/tokenize", "/detokenize", "/admin")
_HEALTH_PATHS = ("/health", "/metrics", "/ping")


async def _send_error(send, status: int, message: str, err_type: str, code: str | None = None,
                      headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    body = json.dumps({"error": {"message": message, "type": err_type, "param": None,
                                 "code": code}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"), *headers]})
    await send({"type": "http.response.body", "body": body})


class ApiKeyGuard:
    """401 unless ``Authorization: Bearer <api_key>`` on the protected paths."""

    def __init__(self, app, api_key: str, protect_health: bool = False) -> None:
        if not api_key:
            raise ValueError("ApiKeyGuard needs a non-empty key")
        self.app = app
        self._expected = f"Bearer {api_key}".encode()
        self._prefixes = _PROTECTED_PREFIXES + (_HEALTH_PATHS if protect_health else ())

    def protects(self, path: str) -> bool:
        return path.startswith(self._prefixes) or path.rstrip("/") in ("/v1",)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope.get("method") != "OPTIONS" and self.protects(scope["path"]):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self._expected):
                await _send_error(send, 401, "invalid or missing API key (send 'Authorization: Bearer "
                                  "<key>')", "authentication_error", "invalid_api_key",
                                  headers=((b"www-authenticate", b"Bearer"),))
                return
        await self.app(scope, receive, send)


class BodyGuard:
    """Reads a request's body whole, bounded in bytes and time, then hands it to the app."""

    def __init__(self, app, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            try:
                n = int(declared)
                if n < 0:
                    raise ValueError
            except ValueError:
                await _send_error(send, 400, f"invalid Content-Length {declared[:40]!r}",
                                  "invalid_request_error")
                return
            if n > self.max_body_bytes:
                await self._too_large(send, n)
                return
        chunks, size, deadline = [], 0, time.monotonic() + self.body_timeout_s
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                await _send_error(send, 408, f"request body not received within {self.body_timeout_s:g} s "
                                  f"({size} bytes arrived)", "invalid_request_error", "body_timeout")
                return
            if message["type"] == "http.disconnect":
                return   # the client left before sending its body: nobody to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                await self._too_large(send, size)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, send, size: int) -> None:
        await _send_error(send, 413, f"request body of {size} bytes or more exceeds the limit of "
                          f"{self.max_body_bytes} bytes", "invalid_request_error", "body_too_large")
