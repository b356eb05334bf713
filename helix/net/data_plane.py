"""The ZeroMQ data plane: each endpoint binds one PULL socket; senders keep one PUSH socket per peer.

PUSH/PULL keeps the order of messages from one sender to one receiver, which is all a pipeline needs
(a request's inputs at a stage all come from one upstream stage, or from the coordinator and the last
stage in causal order). Messages are :mod:`helix.net.wire` frames: a head frame, copied into ZeroMQ when it
is small (it then holds every small tensor too), and zero-copy frames for large tensors, which go from
the engine's output to the socket without a Python-side copy.

Sockets are not thread-safe: receiving belongs to the thread that calls :meth:`DataPlane.recv`;
sending takes a lock, so several threads may send.

With :class:`~helix.net.keys.ClusterKeys` every socket speaks CURVE (encrypted; the receiver admits
only the cluster's senders, see :mod:`helix.net.curve`); without, plain TCP, for loopback.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Mapping

import zmq

from helix.net.curve import CurveGate, secure_sender
from helix.net.keys import ClusterKeys
from helix.net.wire import INLINE_MAX_BYTES, Message, decode, encode, frames_after


#: Peer name -> ``tcp://host:port``.
PeerBook = Mapping[str, str]


def advertised_host(bind_host: str) -> str:
    """The address others should dial: ``bind_host`` itself, or this machine's address when binding
    every interface (``0.0.0.0``): the host name's address unless that is a loopback one (Debian
    maps the host name to 127.0.1.1, containers often to 127.0.0.1), else the address of the
    interface that routes outward (found as Ray finds a node's address; no packet is sent)."""
    if bind_host not in ("0.0.0.0", "", "*"):
        return bind_host
    try:
        named = socket.gethostbyname(socket.gethostname())
    except OSError:
        named = "127.0.0.1"
    if not named.startswith("127."):
        return named
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("8.8.8.8", 80))   # UDP connect only picks the route
            return probe.getsockname()[0]
    except OSError:   # no route out: this machine is all there is
        return named


class DataPlane:
    """One endpoint of the data plane: a bound PULL socket and PUSH sockets to named peers."""

    def __init__(self, host: str = "127.0.0.1", port: int | None = None,
                 context: zmq.Context | None = None, keys: ClusterKeys | None = None) -> None:
        """``keys``: CURVE on every socket (the plane then has a context of its own, since a
        context has one ZAP handler); None: plain TCP."""
        if keys is not None and context is not None:
            raise ValueError("a DataPlane with keys makes its own context (one ZAP handler each)")
        self.keys = keys
        self._own_ctx = keys is not None
        self._ctx = zmq.Context() if self._own_ctx else (context or zmq.Context.instance())
        self._gate = CurveGate(self._ctx, keys) if keys is not None else None
        self._pull = self._ctx.socket(zmq.PULL)
        self._pull.setsockopt(zmq.RCVHWM, 0)
        self._pull.setsockopt(zmq.LINGER, 0)
        if self._gate is not None:
            self._gate.secure(self._pull)
        if port is None or port == 0:
            port = self._pull.bind_to_random_port(f"tcp://{host}")
        else:
            self._pull.bind(f"tcp://{host}:{port}")
        self.address = f"tcp://{advertised_host(host)}:{port}"
        self._peers: dict[str, str] = {}
        self._push: dict[str, zmq.Socket] = {}
        self._send_lock = threading.Lock()
        self.bytes_sent = 0
        self.messages_sent = 0
        self._bytes_to: dict[str, int] = {}

    def set_peers(self, peers: PeerBook) -> None:
        """Add or change peer addresses (a changed address gets a new socket)."""
        with self._send_lock:
            for name, addr in peers.items():
                if self._peers.get(name) != addr and name in self._push:
                    self._push.pop(name).close(linger=0)
                self._peers[name] = addr

    def forget_queued(self, peer: str) -> None:
        """Drop what waits to go to ``peer`` (a dead node: a process restarted at its address must
        not receive the old one's traffic); the next send opens a fresh socket."""
        with self._send_lock:
            sock = self._push.pop(peer, None)
            if sock is not None:
                sock.close(linger=0)

    def bytes_sent_to(self) -> dict[str, int]:
        """Bytes sent to each peer since start (a copy)."""
        with self._send_lock:
            return dict(self._bytes_to)

    @property
    def peers(self) -> dict[str, str]:
        return dict(self._peers)

    def _socket(self, peer: str) -> zmq.Socket:
        sock = self._push.get(peer)
        if sock is None:
            if peer not in self._peers:
                raise KeyError(f"unknown data-plane peer {peer!r}; known: {sorted(self._peers)}")
            sock = self._ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.setsockopt(zmq.LINGER, 1000)
            if self.keys is not None:
                secure_sender(sock, self.keys)
            sock.connect(self._peers[peer])
            self._push[peer] = sock
        return sock

    def send(self, peer: str, msg: Message) -> None:
        self.send_frames(peer, encode(msg))

    def send_frames(self, peer: str, frames: list) -> None:
        head = frames[0]
        nbytes = len(head)
        with self._send_lock:
            sock = self._push.get(peer) or self._socket(peer)
            if len(frames) == 1:   # the common decode-step message: one copied frame
                sock.send(head, copy=nbytes < INLINE_MAX_BYTES)
            else:
                nbytes += sum(f.nbytes for f in frames[1:])
                sock.send_multipart(frames, copy=False)
            self.messages_sent += 1
            self.bytes_sent += nbytes
            self._bytes_to[peer] = self._bytes_to.get(peer, 0) + nbytes

    def _recv_frames(self, flags: int) -> list:
        """One whole message's parts: the head as bytes, the large-tensor frames zero-copy. Parts after
        a head that announces none are not asked for (saves a ``RCVMORE`` query per small message);
        after a head that is not ours every part is drained, so a bad message leaves nothing behind."""
        sock = self._pull
        frames = [sock.recv(flags)]
        if frames_after(frames[0]) != 0:
            while sock.getsockopt(zmq.RCVMORE):
                frames.append(sock.recv(copy=False))
        return frames

    def recv(self, timeout_s: float) -> Message | None:
        """The next message, or None when none arrives within ``timeout_s``."""
        try:   # a backlog is the common case under load: skip the poll
            return decode(self._recv_frames(zmq.NOBLOCK))
        except zmq.Again:
            pass
        if timeout_s <= 0 or not self._pull.poll(int(timeout_s * 1000)):
            return None
        return decode(self._recv_frames(0))

    def close(self, linger_s: float = 0.0) -> None:
        """Close every socket; queued outgoing messages get ``linger_s`` to leave."""
        with self._send_lock:
            for sock in self._push.values():
                sock.close(linger=int(linger_s * 1000))
            self._push.clear()
        if self._gate is not None:
            self._gate.close()
        self._pull.close(linger=0)
        if self._own_ctx:   # waits for what the PUSH sockets still hold, up to their linger
            self._ctx.term()
