"""The control plane's error guard keeps a status a handler chose with ``context.abort``."""

from __future__ import annotations

import grpc
import pytest

from helix.core.errors import HelixUserError
from helix.net.control import ControlClient, ControlError, service_handler, start_server


def _unary_abort(request, context):
    context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full")


def _unary_bug(request, context):
    raise KeyError("oops")


def _unary_user(request, context):
    raise HelixUserError("bad field")


def _stream_abort(request, context):
    yield {"n": 1}
    context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "too slow")


@pytest.fixture()
def client():
    server = start_server([service_handler("t.S", {"abort": _unary_abort, "bug": _unary_bug,
                                                   "user": _unary_user},
                                           {"stream": _stream_abort})])
    c = ControlClient(server.address, "t.S", default_timeout_s=10.0)
    yield c
    c.close()
    server.stop()


@pytest.mark.parametrize("method, code, text", [
    ("abort", grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full"),
    ("bug", grpc.StatusCode.INTERNAL, "KeyError"),
    ("user", grpc.StatusCode.INVALID_ARGUMENT, "bad field"),
])
def test_unary_status(client, method, code, text):
    with pytest.raises(ControlError) as err:
        client.call(method)
    assert err.value.code == code and text in err.value.details


def test_stream_abort_keeps_its_status(client):
    got = []
    with pytest.raises(ControlError) as err:
        for msg in client.stream("stream", {}, timeout_s=10.0):
            got.append(msg)
    assert got == [{"n": 1}]
    assert err.value.code == grpc.StatusCode.DEADLINE_EXCEEDED and "too slow" in err.value.details


@pytest.mark.parametrize("body", [b"not json", b"[1, 2]", b"\xff\xfe", b'"text"'])
def test_a_body_that_is_not_a_json_object_is_invalid_argument(client, body):
    for method, kind in (("user", "unary_unary"), ("stream", "unary_stream")):
        rpc = getattr(client.channel, kind)(f"/t.S/{method}")   # raw bytes in, raw bytes out
        with pytest.raises(grpc.RpcError) as err:
            result = rpc(body, timeout=10.0)
            list(result) if kind == "unary_stream" else None
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, err.value.details())
        assert "JSON object" in err.value.details()
