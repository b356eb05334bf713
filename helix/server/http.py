"""Run the FastAPI app with uvicorn: blocking (``helix serve``) or in a thread (tests, demo)."""

from __future__ import annotations

import errno
import socket
import threading
import time

import uvicorn
from fastapi import FastAPI

from helix.core.errors import HelixUserError


class HttpThread:
    """uvicorn in a background thread; :meth:`stop` asks it to exit and waits (bounded)."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0,
                 start_timeout_s: float = 30.0) -> None:
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off",
                                timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, name="helix-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + start_timeout_s
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"HTTP server did not start on {host}:{port}")
            time.sleep(0.02)
        sock = self.server.servers[0].sockets[0]
        self.host, self.port = sock.getsockname()[:2]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self, timeout_s: float = 5.0) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=timeout_s)


def bind_http(host: str, port: int, flag: str = "--port") -> socket.socket:
    """The HTTP API's listening socket, bound now: a port in use is a one-line error before any
    worker starts (not after they all loaded), and nobody can take the port in between."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto IPPROTO_TCP, not 0: asyncio turns Nagle off (TCP_NODELAY) only on connections of a
    # socket whose proto says TCP, and with Nagle on every response whose headers and body go out
    # in two writes waited ~40 ms for the client's delayed ACK (GET /v1/models took 44 ms).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as uvicorn: TIME_WAIT is no conflict
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        why = ("already in use" if exc.errno == errno.EADDRINUSE else
               "not an address of this machine" if exc.errno == errno.EADDRNOTAVAIL else exc.strerror)
        raise HelixUserError(f"{flag} {port}: cannot listen on {host}:{port}: {why}") from None
    return sock


def run_blocking(app: FastAPI, sock: socket.socket) -> None:
    """Serve on an already bound socket until interrupted (Ctrl-C / SIGTERM)."""
    config = uvicorn.Config(app, log_level="info", lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])
