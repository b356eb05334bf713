"""``helix drain`` / ``helix undrain``: take a node of a running server out of routing (and back) over
its admin HTTP routes (:mod:`helix.server.admin`)."""

from __future__ import annotations

import time
from typing import Optional

import typer

from helix.core.errors import HelixUserError

_SERVER_HELP = "the server's root URL (helix serve --host/--port)"
_KEY_HELP = "the server's --api-key (env HELIX_API_KEY)"


class AdminClient:
    """The admin routes of one server; every failure is one :class:`HelixUserError` line."""

    def __init__(self, server: str, api_key: str | None, timeout_s: float = 30.0) -> None:
        import httpx
        self.server = server.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=self.server, headers=headers, timeout=timeout_s)

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        import httpx
        try:
            r = self._http.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise HelixUserError(f"cannot reach the server at {self.server}: {exc or type(exc).__name__} "
                                 f"(is helix serve running there? --server URL)") from None
        if r.status_code == 200:
            return r.json()
        try:
            message = r.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = r.text.strip()[:200] or r.reason_phrase
        if r.status_code == 401:
            message += " (--api-key KEY or HELIX_API_KEY)"
        raise HelixUserError(f"{self.server}: {message}")

    def close(self) -> None:
        self._http.close()


def _line(s: dict) -> str:
    """One node's status; a node that does not answer counts the coordinator's view of its
    requests (its worker's last report is stale)."""
    theirs = s.get("worker_requests")
    left = s["requests"] if theirs is None else max(s["requests"], theirs)
    line = f"{s['node']} [{s['start']}, {s['end']}): {s['state']}, {left} request(s) left"
    if s.get("down_for_s") is not None:
        line += f", down for {s['down_for_s']:.0f} s"
    if s.get("restarts"):
        line += f", restarted {s['restarts']} time(s)"
    return line + (f": {s['reason']}" if s.get("reason") else "")


def drain(node: str = typer.Argument(..., help="the plan node to drain"),
          server: str = typer.Option("http://127.0.0.1:8000", "--server", help=_SERVER_HELP),
          api_key: Optional[str] = typer.Option(None, "--api-key", envvar="HELIX_API_KEY", help=_KEY_HELP),
          wait: bool = typer.Option(False, "--wait", help="poll until the node is empty, printing "
                                    "the requests left as they change"),
          timeout: float = typer.Option(600.0, "--timeout", min=0.0, help="with --wait: give up after "
                                        "this many seconds (exit 1; the node stays draining)"),
          move: bool = typer.Option(False, "--move", help="move the node's requests to other pipelines "
                                    "now (prefilled again there) instead of letting them finish"),
          force: bool = typer.Option(False, "--force", help="drain even the last node holding some "
                                     "layer: new requests then wait, and fail with 503 after 10 s")) -> int:
    """Take NODE out of routing: it gets no new requests, its requests finish where they are (or
    move with --move), and it reports when it is empty and may be stopped. `helix undrain NODE`
    puts it back."""
    client = AdminClient(server, api_key)
    try:
        status = client.call("POST", "/admin/drain", {"node": node, "force": force, "move": move})
        typer.echo(_line(status))
        if not wait:
            return 0
        return _wait(client, node, status, timeout)
    finally:
        client.close()


def _wait(client: AdminClient, node: str, status: dict, timeout_s: float) -> int:
    t0 = time.monotonic()
    last = _line(status)
    while status["state"] == "draining":
        if time.monotonic() - t0 > timeout_s:
            typer.echo(f"error: {node} still has requests after {timeout_s:g} s; it keeps draining",
                       err=True)
            return 1
        time.sleep(0.5)
        status = client.call("GET", f"/admin/nodes/{node}")
        if _line(status) != last:
            last = _line(status)
            typer.echo(f"{last} ({time.monotonic() - t0:.1f} s)")
    took = f"{time.monotonic() - t0:.1f} s"
    if status["state"] == "drained":
        typer.echo(f"{node} is drained after {took}: it may be stopped")
        return 0
    typer.echo(f"{node} is {status['state']} (not draining any more) after {took}", err=True)
    return 0 if status["state"] == "dead" else 1


def undrain(node: str = typer.Argument(..., help="the drained plan node to put back"),
            server: str = typer.Option("http://127.0.0.1:8000", "--server", help=_SERVER_HELP),
            api_key: Optional[str] = typer.Option(None, "--api-key", envvar="HELIX_API_KEY",
                                                  help=_KEY_HELP)) -> None:
    """Put a draining or drained NODE back into routing."""
    client = AdminClient(server, api_key)
    try:
        typer.echo(_line(client.call("POST", "/admin/undrain", {"node": node})))
    finally:
        client.close()


def register(app: typer.Typer) -> None:
    app.command("drain")(drain)
    app.command("undrain")(undrain)
