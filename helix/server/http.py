"""Run the FastAPI app with uvicorn: blocking (``helix serve``) or in a thread (tests, demo)."""

from __future__ import annotations

import threading
import time

import uvicorn
from fastapi import FastAPI


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


def run_blocking(app: FastAPI, host: str, port: int) -> None:
    """Serve until interrupted (Ctrl-C / SIGTERM)."""
    uvicorn.run(app, host=host, port=port, log_level="info", lifespan="off")
