"""Both planes with a cluster's keys: ZeroMQ CURVE on the data plane, TLS + bearer token on gRPC.
A peer without the keys gets nothing through, and the refusal is logged."""

from __future__ import annotations

import dataclasses
import logging
import socket
import threading
import time

import grpc
import pytest
import torch
import zmq

from helix.net.control import (ControlClient, ControlError, service_handler, start_server,
                               tls_channel_options, to_json, from_json)
from helix.net.data_plane import DataPlane
from helix.net.io_types import StageInput
from helix.net.keys import ClusterKeys, generate
from helix.net.wire import InputBatch, WireInput, encode

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> ClusterKeys:
    folder = tmp_path_factory.mktemp("keys") / "k"
    generate(folder)
    return ClusterKeys.load(folder)


@pytest.fixture(scope="module")
def other(tmp_path_factory) -> ClusterKeys:
    """Another cluster's keys (a stranger with keys of its own)."""
    folder = tmp_path_factory.mktemp("keys") / "k"
    generate(folder)
    return ClusterKeys.load(folder)


def _batch(i: int, hs: torch.Tensor) -> InputBatch:
    return InputBatch((WireInput(StageInput(i, i, hidden_states=hs)),))


class _Tap:
    """A TCP relay that records what the sender writes (what a wire-tapper on the link would see)."""

    def __init__(self, target: str) -> None:
        host, port = target.removeprefix("tcp://").rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"tcp://127.0.0.1:{self.listener.getsockname()[1]}"
        self.seen = bytearray()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        upstream = socket.create_connection(self.target)
        threading.Thread(target=self._pump, args=(upstream, conn, False), daemon=True).start()
        self._pump(conn, upstream, True)

    def _pump(self, src, dst, record: bool) -> None:
        while data := src.recv(1 << 16):
            if record:
                self.seen += data
            dst.sendall(data)


@pytest.mark.parametrize("secured", [False, True])
def test_what_crosses_the_link_is_encrypted_with_keys(secured, keys):
    pattern = torch.arange(1, 1025, dtype=torch.float32)   # 4 KiB anyone can recognise
    a, b = DataPlane(keys=keys if secured else None), DataPlane(keys=keys if secured else None)
    tap = _Tap(b.address)
    try:
        a.set_peers({"b": tap.address})
        for i, hs in enumerate([pattern.view(1, -1), torch.randn(256, 1024)]):   # inline, zero-copy
            a.send("b", _batch(i, hs))
            msg = b.recv(timeout_s=10.0)
            assert msg is not None and torch.equal(msg.inputs[0].item.hidden_states, hs)
        in_clear = pattern.numpy().tobytes()[:256] in bytes(tap.seen)
        assert in_clear is not secured
    finally:
        a.close()
        b.close()


def _wait(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("stranger", ["plain zmq", "no keys", "another server key", "another sender key"])
def test_a_sender_without_the_keys_gets_nothing_through(stranger, keys, other, caplog):
    caplog.set_level(logging.WARNING, logger="helix.net")
    receiver = DataPlane(keys=keys)
    msg = encode(_batch(1, torch.ones(1, 8)))
    raw = None
    if stranger == "plain zmq":
        raw = zmq.Context.instance().socket(zmq.PUSH)
        raw.connect(receiver.address)
        raw.send_multipart(msg)
    else:
        sender_keys = {"no keys": None,
                       "another server key": dataclasses.replace(
                           keys, curve_server_public=other.curve_server_public),
                       "another sender key": dataclasses.replace(
                           keys, curve_client_public=other.curve_client_public,
                           curve_client_secret=other.curve_client_secret)}[stranger]
        sender = DataPlane(keys=sender_keys)
        sender.set_peers({"r": receiver.address})
        sender.send_frames("r", msg)
    try:
        assert _wait(lambda: receiver._gate.refused >= 1, 10.0), "no refusal seen"
        assert receiver.recv(timeout_s=1.0) is None
        assert _wait(lambda: any("refused" in r.getMessage() for r in caplog.records), 5.0)
        # The receiver still serves the cluster.
        friend = DataPlane(keys=keys)
        friend.set_peers({"r": receiver.address})
        friend.send("r", _batch(2, torch.zeros(1, 8)))
        got = receiver.recv(timeout_s=10.0)
        assert got is not None and got.inputs[0].item.request_id == 2
        assert receiver.recv(timeout_s=0.5) is None   # and still nothing from the stranger
        friend.close()
    finally:
        if raw is not None:
            raw.close(linger=0)
        else:
            sender.close()
        receiver.close()


# --- control plane --------------------------------------------------------------------------------
@pytest.fixture
def echo(keys):
    calls = []

    def echo_fn(request, _ctx):
        calls.append(request)
        return request

    def stream_fn(request, _ctx):
        calls.append(request)
        yield request

    server = start_server([service_handler("t.S", {"Echo": echo_fn, "Open": echo_fn},
                                           {"Stream": stream_fn})],
                          keys=keys, open_methods=("Open",))
    yield server, calls
    server.stop()


def _raw_call(channel, method: str, streaming: bool = False):
    if streaming:
        return list(channel.unary_stream(f"/t.S/{method}", request_serializer=to_json,
                                         response_deserializer=from_json)({"x": 1}, timeout=5))
    return channel.unary_unary(f"/t.S/{method}", request_serializer=to_json,
                               response_deserializer=from_json)({"x": 1}, timeout=5)


def test_control_plane_needs_tls_and_the_token(echo, keys, other, caplog):
    caplog.set_level(logging.WARNING, logger="helix.net")
    server, calls = echo
    assert ControlClient(server.address, "t.S", keys=keys).call("Echo", {"x": 1}) == {"x": 1}
    assert len(calls) == 1

    with pytest.raises(ControlError) as plain:   # no TLS: the handshake fails
        ControlClient(server.address, "t.S", default_timeout_s=5).call("Echo", {"x": 1})
    assert plain.value.code == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(ControlError) as stranger:   # another cluster's certificate is not trusted
        ControlClient(server.address, "t.S", default_timeout_s=5, keys=other).call("Echo", {"x": 1})
    assert stranger.value.code == grpc.StatusCode.UNAVAILABLE

    tls, options = tls_channel_options(keys.tls_cert_pem)
    no_token = grpc.secure_channel(server.address, tls, options=options)
    for streaming, method in ((False, "Echo"), (True, "Stream")):
        with pytest.raises(grpc.RpcError) as missing:
            _raw_call(no_token, method, streaming)
        assert missing.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(ControlError) as wrong:
        ControlClient(server.address, "t.S", keys=dataclasses.replace(keys, token="x" * 43)).call("Echo")
    assert wrong.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert len(calls) == 1   # no refused call reached a handler
    refused = [r.getMessage() for r in caplog.records if "refused gRPC" in r.getMessage()]
    assert any("/t.S/Echo" in m and "no cluster token" in m for m in refused)
    assert any("/t.S/Stream" in m for m in refused) and any("a wrong cluster token" in m for m in refused)
    assert all(keys.token not in m for m in refused)

    assert _raw_call(no_token, "Open") == {"x": 1}   # a method the server names open
    no_token.close()
