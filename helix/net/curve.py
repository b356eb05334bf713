"""ZeroMQ CURVE on the data plane: encrypted, and only the cluster's senders get through.

A secured :class:`~helix.net.data_plane.DataPlane` gets its own ZeroMQ context with a ZAP handler
(``zmq.auth``'s :class:`ThreadAuthenticator`; one per context, so one per plane) that admits only the
cluster's sender key. Its PULL socket serves with the cluster's server keypair; its PUSH sockets
connect with the client keypair and expect the server key. A peer without CURVE, with another server
key or another client key never completes the handshake, so nothing it sends reaches the receiver;
each refusal is logged (at most once per :data:`LOG_EVERY_S` per kind, with a count: a refused peer
reconnects every 100 ms).
"""

from __future__ import annotations

import logging
import threading
import time

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils.monitor import recv_monitor_message

from helix.net.keys import ClusterKeys

log = logging.getLogger("helix.net")

LOG_EVERY_S = 10.0
_DOMAIN = "helix"
_REFUSALS = {zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "handshake failed",
             zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "handshake failed (no CURVE, or not the cluster's "
                                                   "server key)",
             zmq.EVENT_HANDSHAKE_FAILED_AUTH: "sender key not the cluster's"}


def secure_sender(sock: zmq.Socket, keys: ClusterKeys) -> None:
    """Make ``sock`` (before it connects) a CURVE client of the cluster's receivers."""
    sock.curve_secretkey = keys.curve_client_secret
    sock.curve_publickey = keys.curve_client_public
    sock.curve_serverkey = keys.curve_server_public


class _Admit:
    """ZAP credentials check: only the cluster's sender key."""

    def __init__(self, allowed: bytes) -> None:
        self.allowed = allowed

    def callback(self, _domain: str, key: bytes) -> bool:
        return key == self.allowed


class CurveGate:
    """The receiving side: a ZAP handler on ``context`` and a watch on one PULL socket's refusals.

    Build it with the context before binding the socket (:meth:`secure`); :meth:`close` before
    closing the socket."""

    def __init__(self, context: zmq.Context, keys: ClusterKeys) -> None:
        self.keys = keys
        self._auth = ThreadAuthenticator(context, log=logging.getLogger("helix.net.zap"))
        self._auth.start()
        self._auth.configure_curve_callback(_DOMAIN, _Admit(keys.curve_client_public))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sock: zmq.Socket | None = None
        self.refused = 0
        """Connections refused so far (every handshake failure on the socket)."""

    def secure(self, sock: zmq.Socket) -> None:
        """Make ``sock`` (a PULL, before it binds) a CURVE server and start logging its refusals."""
        sock.curve_secretkey = self.keys.curve_server_secret
        sock.curve_publickey = self.keys.curve_server_public
        sock.curve_server = True
        sock.zap_domain = _DOMAIN.encode()
        self._sock = sock
        monitor = sock.get_monitor_socket(sum(_REFUSALS))
        self._thread = threading.Thread(target=self._watch, args=(monitor,), daemon=True,
                                        name="helix-curve-monitor")
        self._thread.start()

    def _watch(self, monitor: zmq.Socket) -> None:
        counts: dict[str, int] = {}
        last_log = 0.0
        try:
            while not self._stop.is_set():
                if monitor.poll(100):
                    event = recv_monitor_message(monitor)
                    why = _REFUSALS.get(event["event"])
                    if why is None:
                        continue
                    self.refused += 1
                    counts[why] = counts.get(why, 0) + 1
                now = time.monotonic()
                if counts and now - last_log >= LOG_EVERY_S:
                    where = self._sock.last_endpoint.decode() if self._sock is not None else "?"
                    log.warning("data plane %s: refused %s", where,
                                "; ".join(f"{n} connection(s): {why}" for why, n in counts.items()))
                    counts.clear()
                    last_log = now
        except zmq.ZMQError:   # the socket or context went away under us: we are closing
            pass
        finally:
            monitor.close(linger=0)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        if self._sock is not None:
            try:
                self._sock.disable_monitor()
            except zmq.ZMQError:
                pass
        self._auth.stop()
