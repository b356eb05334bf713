"""Wire format round trips and the ZeroMQ data plane between two real endpoints on loopback."""

from __future__ import annotations

import msgpack
import pytest
import torch

from helix.net.io_types import NewRequest, StageInput
from helix.net.sampling import SampledToken, SamplingParams
from helix.net.data_plane import DataPlane
from helix.net.wire import (Hop, InputBatch, Release, Route, TokenBatch, TokenEvent, WireError, WireInput,
                         decode, encode)


def _new(rid=7):
    return NewRequest(rid, 3, SamplingParams(temperature=0.5, seed=11, stop_token_ids=(5, 6), max_tokens=9),
                      (1, 2, 3), enter_layer=4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_hidden_states_round_trip_bit_exact(dtype):
    hs = torch.randn(5, 64).to(dtype)
    route = Route((Hop("a", 0), Hop("b", 4)))
    msg = InputBatch((WireInput(StageInput(7, 0, hidden_states=hs, new_request=_new()), route),
                      WireInput(StageInput(8, 12, token_ids=(4,)))))
    frames = encode(msg)
    assert len(frames) == 1 and len(frames[0]) > hs.nbytes   # small: inline in the head frame
    got = decode(frames)
    a, b = got.inputs
    assert torch.equal(a.item.hidden_states, hs) and a.item.hidden_states.dtype == dtype
    assert a.item.new_request == _new() and a.route == route and a.item.start_position == 0
    assert b.item.token_ids == (4,) and b.route is None and b.item.new_request is None


def test_tokens_and_release_round_trip():
    tok = TokenBatch((TokenEvent(3, 10, SampledToken(42, -0.5, ((42, -0.5), (7, -1.5))), "length", "n2"),))
    assert decode(encode(tok)) == tok
    assert decode(encode(Release((1, 2)))) == Release((1, 2))


def test_garbage_is_a_wire_error():
    with pytest.raises(WireError):
        decode([msgpack.packb({"v": 1, "kind": "nope"})])
    with pytest.raises(WireError):
        decode([b"\xc1 not msgpack"])


def test_two_endpoints_carry_frames_in_order():
    a, b = DataPlane(), DataPlane()
    try:
        a.set_peers({"b": b.address})
        assert b.address.startswith("tcp://127.0.0.1:")
        sent = [torch.randn(1 + i, 64) for i in range(20)]
        for i, hs in enumerate(sent):
            a.send("b", InputBatch((WireInput(StageInput(i, 0, hidden_states=hs)),)))
        got = []
        for _ in range(200):
            msg = b.recv(timeout_s=0.05)
            if msg is not None:
                got.append(msg.inputs[0].item)
            if len(got) == len(sent):
                break
        assert [g.request_id for g in got] == list(range(20))
        assert all(torch.equal(g.hidden_states, s) for g, s in zip(got, sent))
        assert b.recv(timeout_s=0.01) is None
        with pytest.raises(KeyError):
            a.send("nobody", Release((1,)))
    finally:
        a.close()
        b.close()


def test_small_and_large_frames_in_one_message_bit_exact():
    """One-token tensors ride inline in the head frame, prefill chunks get zero-copy frames; a message
    may mix both, every tensor arrives bit for bit, and the byte counter counts what was sent."""
    a, b = DataPlane(), DataPlane()
    try:
        a.set_peers({"b": b.address})
        small = torch.randn(1, 256)                                   # 1 KiB
        large = torch.randn(65, 256)                                  # 65 KiB
        msg = InputBatch((WireInput(StageInput(1, 0, hidden_states=large)),
                          WireInput(StageInput(2, 5, hidden_states=small)),
                          WireInput(StageInput(3, 9, token_ids=(7, 8)))))
        for _ in range(3):
            a.send("b", msg)
        for _ in range(3):
            got = b.recv(timeout_s=5.0)
            assert got is not None
            x, y, z = got.inputs
            assert torch.equal(x.item.hidden_states, large) and torch.equal(y.item.hidden_states, small)
            assert z.item.token_ids == (7, 8) and y.item.start_position == 5
        frames = encode(msg)
        assert len(frames) == 2 and len(frames[0]) > small.nbytes
        assert a.bytes_sent == 3 * (len(frames[0]) + large.nbytes)
    finally:
        a.close()
        b.close()


def test_malformed_messages_raise_and_leave_no_parts_behind():
    import zmq
    from helix.net import wire
    b = DataPlane()
    push = zmq.Context.instance().socket(zmq.PUSH)
    try:
        push.connect(b.address)
        good = encode(InputBatch((WireInput(StageInput(5, 0, hidden_states=torch.ones(2, 8))),)))
        header = msgpack.packb({"kind": "in", "items": [
            {"id": 1, "pos": 0, "dt": "float32", "sh": [2, 8], "f": 1, "o": 0},
            {"id": 2, "pos": 0, "dt": "float32", "sh": [2, 8], "f": 2, "o": 0}]})
        short = wire._PREAMBLE.pack(wire.WIRE_VERSION, wire._MAP, 2, len(header)) + header
        push.send_multipart([b"\xc1 not msgpack", b"x" * 10, b"y"])   # garbage head, 3 parts
        push.send_multipart([short, bytes(64)])                       # announces 2 frames, has 1
        push.send_multipart([msgpack.packb({"v": 9, "kind": "rel", "ids": []}), b"z"])
        push.send_multipart(good)
        for _ in range(3):
            with pytest.raises(WireError):
                b.recv(timeout_s=5.0)
        got = b.recv(timeout_s=5.0)
        assert got.inputs[0].item.request_id == 5
        assert torch.equal(got.inputs[0].item.hidden_states, torch.ones(2, 8))
    finally:
        push.close(linger=0)
        b.close()


def test_parts_after_a_head_that_announces_none_are_rejected_not_merged():
    """The receiver does not ask for more parts after a head that announces none (one ``RCVMORE`` query
    less per small message). A foreign sender's extra part then arrives as a message of its own and is
    rejected; the next good message still arrives whole."""
    import zmq
    b = DataPlane()
    push = zmq.Context.instance().socket(zmq.PUSH)
    try:
        push.connect(b.address)
        push.send_multipart([encode(Release((1,)))[0], b"stray part"])
        push.send_multipart(encode(Release((2,))))
        assert b.recv(timeout_s=5.0) == Release((1,))
        with pytest.raises(WireError):
            b.recv(timeout_s=5.0)
        assert b.recv(timeout_s=5.0) == Release((2,))
    finally:
        push.close(linger=0)
        b.close()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 300])
def test_plain_batches_cross_the_socket(dtype, rows):
    """Plain batches (the records header) of small and large tensors and token ids, through real
    sockets."""
    a, b = DataPlane(), DataPlane()
    try:
        a.set_peers({"b": b.address})
        sent = [InputBatch((WireInput(StageInput(i, i, hidden_states=torch.randn(rows, 128).to(dtype))),
                            WireInput(StageInput(100 + i, i, token_ids=(i, i + 1)))))
                for i in range(5)]
        for msg in sent:
            a.send("b", msg)
        got = [b.recv(timeout_s=5.0) for _ in sent]
        assert None not in got
        for g, s in zip(got, sent):
            (gh, gt), (sh, st) = g.inputs, s.inputs
            assert gh.item.request_id == sh.item.request_id and gh.item.hidden_states.dtype == dtype
            assert torch.equal(gh.item.hidden_states, sh.item.hidden_states)
            assert gt.item == st.item
    finally:
        a.close()
        b.close()
