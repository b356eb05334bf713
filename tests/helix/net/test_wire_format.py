"""The wire format without sockets: which layout and frames a message gets, and bit-exact round trips
through both header layouts (fixed-size records for plain inputs, a MessagePack map otherwise) and both
tensor paths (inline below ``INLINE_MAX_BYTES``, a frame of its own from there up)."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from helix.net import wire
from helix.net.io_types import NewRequest, StageInput
from helix.net.wire import (INLINE_MAX_BYTES, Failure, Failures, Hop, InputBatch, Release, Route, WireError,
                         WireInput, decode, encode)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _layout(frames) -> int:
    return wire._PREAMBLE.unpack_from(frames[0])[1]


def _hidden(rid, hs, pos=0, **kw):
    return WireInput(StageInput(rid, pos, hidden_states=hs, **kw))


def _round_trip(msg):
    """Decode ``msg`` as a receiver sees it: the head as bytes, the other frames as fresh buffers."""
    frames = encode(msg)
    return decode([bytes(frames[0])] + [bytearray(memoryview(f).cast("B")) for f in frames[1:]])


def _assert_same(got: InputBatch, sent: InputBatch) -> None:
    assert len(got.inputs) == len(sent.inputs)
    for g, s in zip(got.inputs, sent.inputs):
        a, b = g.item, s.item
        assert (a.request_id, a.start_position, a.token_ids, a.new_request, g.route) == \
               (b.request_id, b.start_position, b.token_ids, b.new_request, s.route)
        if b.hidden_states is not None:
            assert a.hidden_states.dtype == b.hidden_states.dtype
            assert a.hidden_states.shape == b.hidden_states.shape
            bits = lambda t: t.reshape(-1).view(torch.uint8)   # bit for bit, NaNs and -0.0 included
            assert torch.equal(bits(a.hidden_states), bits(b.hidden_states))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 64])            # one decode token (inline) / a prefill chunk (own frame)
def test_plain_hidden_states_use_records_and_round_trip(dtype, rows):
    hs = torch.randn(rows, 512).to(dtype)
    msg = InputBatch((_hidden(3, hs, 17),))
    frames = encode(msg)
    assert _layout(frames) == wire._RECORDS
    assert len(frames) == (1 if hs.nbytes < INLINE_MAX_BYTES else 2)
    _assert_same(_round_trip(msg), msg)


def test_inline_threshold_is_exact():
    """A tensor one element under the threshold is copied into the head frame; one at it gets its own
    frame. Both arrive bit for bit."""
    cols = INLINE_MAX_BYTES // 4
    under, at = torch.randn(1, cols - 1), torch.randn(1, cols)
    assert under.nbytes == INLINE_MAX_BYTES - 4 and at.nbytes == INLINE_MAX_BYTES
    msg = InputBatch((_hidden(1, under), _hidden(2, at)))
    frames = encode(msg)
    assert len(frames) == 2 and memoryview(frames[1]).nbytes == at.nbytes
    assert len(frames[0]) > under.nbytes
    _assert_same(_round_trip(msg), msg)


def test_many_inputs_mixing_tokens_dtypes_and_sizes():
    msg = InputBatch((_hidden(1, torch.randn(1, 4096)),
                      WireInput(StageInput(2, 40, token_ids=(5,))),
                      _hidden(3, torch.randn(3, 7).half()),          # 42 bytes: padded to 16
                      _hidden(4, torch.randn(40, 512)),              # 80 KiB: own frame
                      WireInput(StageInput(5, 0, token_ids=tuple(range(300)))),
                      _hidden(6, torch.randn(2, 33).bfloat16()),
                      WireInput(StageInput(7, 3, token_ids=())),
                      _hidden(8, torch.randn(0, 64))))
    frames = encode(msg)
    assert _layout(frames) == wire._RECORDS and len(frames) == 2
    got = _round_trip(msg)
    _assert_same(got, msg)
    assert all(type(t) is int for t in got.inputs[4].item.token_ids)


def test_inline_tensors_are_aligned():
    msg = InputBatch(tuple(_hidden(i, torch.randn(1, 3 + i).half()) for i in range(5)))
    head = encode(msg)[0]
    base = np.frombuffer(head, np.uint8).ctypes.data
    for w in decode([head]).inputs:
        assert (w.item.hidden_states.data_ptr() - base) % wire._ALIGN == 0


def _new(rid=7):
    from helix.net.sampling import SamplingParams
    return NewRequest(rid, 3, SamplingParams(temperature=0.5, seed=11, stop_token_ids=(5, 6), max_tokens=9),
                      (1, 2, 3), enter_layer=4, adapter="task-a")


@pytest.mark.parametrize("item", [
    StageInput(7, 0, hidden_states=torch.randn(2, 8), new_request=_new()),       # a request's first input
    StageInput("req-a", 0, hidden_states=torch.randn(2, 8)),                      # not an int id
    StageInput(2**63, 0, token_ids=(1, 2)),                                       # beyond int64
    StageInput(1, 0, hidden_states=torch.randn(2, 3, 4)),                          # not 2-D
    StageInput(1, 0, hidden_states=torch.randn(8, 600).t()),                       # not contiguous: copied
], ids=["new-request", "str-id", "huge-id", "3-d", "transposed"])
def test_inputs_that_are_not_plain_use_the_map_and_round_trip(item):
    route = Route((Hop("a", 0), Hop("b", 4))) if item.new_request is not None else None
    msg = InputBatch((WireInput(item, route), WireInput(StageInput(8, 12, token_ids=(4,)))))
    frames = encode(msg)
    if item.hidden_states is None or item.hidden_states.is_contiguous():
        assert _layout(frames) == wire._MAP
    _assert_same(_round_trip(msg), msg)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(-2**63, 2**63 - 1), st.integers(0, 2**40),
                          st.sampled_from(DTYPES + [None]), st.integers(0, 9), st.integers(0, 40)),
                min_size=1, max_size=6))
def test_plain_batches_round_trip(spec):
    gen = torch.Generator().manual_seed(len(spec))
    msg = InputBatch(tuple(
        WireInput(StageInput(rid, pos, token_ids=tuple(range(rows)))) if dtype is None else
        _hidden(rid, torch.randn(rows, cols, generator=gen).to(dtype), pos)
        for rid, pos, dtype, rows, cols in spec))
    assert _layout(encode(msg)) == wire._RECORDS
    _assert_same(_round_trip(msg), msg)


def _head(layout: int, extra: int, header: bytes, tail: bytes = b"") -> bytes:
    return wire._PREAMBLE.pack(wire.WIRE_VERSION, layout, extra, len(header)) + header + tail


def _record(code=0, frame=0, offset=0, rows=1, cols=4):
    return wire._RECORD.pack(1, 0, code, frame, offset, rows, cols)


@pytest.mark.parametrize("frames", [
    [msgpack.packb({"v": 1, "kind": "in", "items": []})],                   # the version-1 format
    [b""],
    [_head(wire._MAP, 0, msgpack.packb({"kind": "nope"}))],
    [_head(wire._MAP, 0, msgpack.packb([1, 2]))],
    [_head(wire._MAP, 0, b"\xc1")],
    [_head(wire._MAP, 1, msgpack.packb({"kind": "rel", "ids": []}))],       # announces a frame it lacks
    [_head(wire._MAP, 0, msgpack.packb({"kind": "in", "items": [
        {"id": 1, "pos": 0, "dt": "float32", "sh": [2, 8], "f": 1, "o": 0}]}))],
    [_head(wire._MAP, 0, msgpack.packb({"kind": "in", "items": [               # before the buffer
        {"id": 1, "pos": 0, "dt": "float32", "sh": [1, 4], "f": 0, "o": -64}]}), bytes(64))],
    [_head(wire._MAP, 0, msgpack.packb({"kind": "in", "items": [
        {"id": 1, "pos": 0, "dt": "float32", "sh": [-1, 4], "f": 0, "o": 0}]}), bytes(64))],
    [_head(wire._MAP, 0, msgpack.packb({"kind": "in", "items": [
        {"id": 1, "pos": 0, "dt": "int8", "sh": [1, 4], "f": 0, "o": 0}]}), bytes(64))],
    [_head(7, 0, b"")],
    [_head(wire._RECORDS, 0, _record()[:-1])],                              # a partial record
    [_head(wire._RECORDS, 0, _record(rows=2), bytes(16))],                  # data shorter than its shape
    [_head(wire._RECORDS, 0, _record(offset=2**40))],
    [_head(wire._RECORDS, 0, _record(code=9), bytes(16))],
    [_head(wire._RECORDS, 0, _record(frame=1))],
    [wire._PREAMBLE.pack(wire.WIRE_VERSION, wire._MAP, 0, 100) + b"\x80"],   # header overruns the frame
], ids=lambda f: f[0][:12].hex())
def test_malformed_heads_are_wire_errors(frames):
    with pytest.raises(WireError):
        decode(frames)


def test_release_and_empty_batch_round_trip():
    assert _round_trip(Release((1, 2))) == Release((1, 2))
    assert _round_trip(InputBatch(())) == InputBatch(())


def test_failures_round_trip():
    msg = Failures((Failure(7, "cpu-1", "input of width 32, expected 64"), Failure(-3, "cpu-2", "")))
    assert _round_trip(msg) == msg


@pytest.mark.parametrize("fin", [5, 1.5, ["stop"]])
def test_token_event_finish_reason_must_be_text_or_null(fin):
    item = {"id": 1, "pos": 3, "t": 7, "lp": -0.5, "top": [], "fin": fin, "node": "cpu-2"}
    with pytest.raises(WireError, match="finish reason"):
        decode([_head(wire._MAP, 0, msgpack.packb({"kind": "tok", "items": [item]}))])


@pytest.mark.parametrize("offset", [2**64 - 1, 2**63])
def test_offsets_beyond_int64_are_wire_errors(offset):
    item = {"id": 1, "pos": 0, "dt": "float32", "sh": [1, 4], "f": 0, "o": offset}
    with pytest.raises(WireError):
        decode([_head(wire._MAP, 0, msgpack.packb({"kind": "in", "items": [item]}))])


def test_logit_bias_prompt_logprobs_and_scored_prompts_round_trip():
    from helix.net.sampling import SampledToken, SamplingParams
    from helix.net.wire import TokenBatch, TokenEvent
    params = SamplingParams(max_tokens=5, logit_bias={9: -100, 3: 2.5}, prompt_logprobs=2)
    assert params.logit_bias == ((3, 2.5), (9, -100.0))
    new = NewRequest(4, 3, params, (1, 2, 3))
    msg = InputBatch((WireInput(StageInput(4, 0, token_ids=(1, 2, 3), new_request=new),
                                Route((Hop("a", 0),))),))
    _assert_same(_round_trip(msg), msg)
    scored = (SampledToken(2, -1.5, ((2, -1.5), (7, -2.0))), SampledToken(3, -0.25, ()))
    events = TokenBatch((TokenEvent(4, 3, SampledToken(8, -0.1), None, "b", scored),
                         TokenEvent(5, 9, SampledToken(1, -0.2), "stop", "b")))
    assert _round_trip(events) == events
