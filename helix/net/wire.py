"""The data-plane wire format: one head frame carrying the header and every small tensor, then one raw
frame per large tensor. No pickles.

A message is a ZeroMQ multipart message ``[head, frame_1, frame_2, ...]``. The head frame is

- an 8-byte preamble (``_PREAMBLE``): wire version, header layout, how many frames follow, header length;
- the header, in one of two layouts:

  - *records* (``_RECORDS``): an :class:`InputBatch` whose inputs are all plain -- an int request id,
    token ids or a 2-D ``[num_tokens, hidden]`` hidden state, no new request, no route -- is one
    fixed-size ``struct`` record per input (``_RECORD``). This is every decode-step message between
    stages; a record packs and unpacks in ~0.5 µs here, a one-input MessagePack map in ~3 µs each way;
  - *map* (``_MAP``): anything else is a MessagePack map (``{"kind": ..., ...}``; plain maps, lists,
    strings and numbers only -- MessagePack rather than JSON because it is ~4x faster);

- zero padding to a multiple of ``_ALIGN`` bytes, then the bytes of every tensor (and of the token ids
  of records) smaller than :data:`INLINE_MAX_BYTES`, each starting on a multiple of ``_ALIGN`` bytes.

Each larger tensor travels as its own frame of raw bytes, sent zero-copy. Every tensor is C-contiguous,
described in the header by dtype, shape, frame (0 = inline in the head) and byte offset; it is read back
as a read-only view of the received bytes (no copy on receipt).

Why inline: pyzmq's zero-copy frames have a large fixed cost (a ``zmq.Frame`` object and a tracker per
frame, one ``send``/``recv``/``RCVMORE`` call per part). In one process, sending and receiving a
16 KiB tensor (one decode token of a 4096-wide model) as a header frame plus a zero-copy frame costs
~50 µs on this 2-core machine, as one copied frame ~5 µs; the extra copy of 16 KiB is ~1 µs. The
copies grow with size, so large tensors keep frames of their own; between two processes here a 60 KiB
tensor moved 25-30 % faster inline, a 120 KiB one 35-55 % slower (three copies, and allocations past
glibc's 128 KiB mmap threshold), hence the 64 KiB cut (pyzmq's own ``copy_threshold`` too).

Three kinds of message move between the coordinator and the stages:

- :class:`InputBatch` — stage inputs (token ids for a first stage, hidden states for later ones);
  the first input of a request carries its :class:`~helix.net.io_types.NewRequest` and its :class:`Route`.
- :class:`TokenBatch` — tokens sampled by a last stage (to the coordinator, and as token-id inputs to
  the first stage for the next step).
- :class:`Release` — forget these requests and free their KV (finished elsewhere, or cancelled).
"""

from __future__ import annotations

import dataclasses
import struct
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import msgpack
import numpy as np
import torch

from helix.core.errors import HelixUserError
from helix.net.io_types import NewRequest, StageInput
from helix.net.sampling import INT64_MAX, INT64_MIN, SampledToken, SamplingParams

WIRE_VERSION = 2

INLINE_MAX_BYTES = 64 * 2**10
"""Tensors of fewer bytes ride inside the head frame (copied); larger ones get a zero-copy frame each."""

_PREAMBLE = struct.Struct("<BBHI")   # wire version, header layout, frames after the head, header bytes
_MAP, _RECORDS = 0, 1                # header layouts (see the module docstring)
_RECORD = struct.Struct("<qqBxHQII")
"""A plain input: request id, start position, payload code, frame, byte offset, rows, columns."""
_ALIGN = 16                          # inline tensors start on multiples of this (relative to the frame)
_PAD = bytes(_ALIGN)

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_DTYPE_NAMES = {v: k for k, v in _DTYPES.items()}
# numpy has no bfloat16: its bits travel and are read back as int16 (same bytes), then reinterpreted.
_NP_DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": np.int16}
# Payload codes of a record: a hidden-state dtype, or token ids (int64, ``rows`` of them).
_CODE_NAMES = ("float32", "float16", "bfloat16", "tokens")
_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
_TOKENS = 3

# Received frames are read-only buffers; the engine only reads them (it copies on ``.to``/``cat``).
warnings.filterwarnings("ignore", message="The given buffer is not writable")
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


class WireError(ValueError):
    """A message that does not follow this format (a bug or a foreign sender)."""


@dataclass(frozen=True)
class Hop:
    """One stage of a request's pipeline: ``node`` runs from ``enter_layer`` to its slice end."""

    node: str
    enter_layer: int


@dataclass(frozen=True)
class Route:
    """A request's pipeline as the stages see it: where to forward, where the first stage is."""

    hops: tuple[Hop, ...]

    def next_after(self, node: str) -> Hop | None:
        """The hop after ``node`` (None when ``node`` is the last stage)."""
        for i, hop in enumerate(self.hops):
            if hop.node == node:
                return self.hops[i + 1] if i + 1 < len(self.hops) else None
        raise KeyError(f"{node!r} is not on route {self.hops}")

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(h.node for h in self.hops)


@dataclass(frozen=True)
class WireInput:
    """A stage input plus, on a request's first input, its route."""

    item: StageInput
    route: Route | None = None


@dataclass(frozen=True)
class InputBatch:
    inputs: tuple[WireInput, ...]


@dataclass(frozen=True)
class TokenEvent:
    """Token sampled for position ``position`` of ``request_id`` by the last stage ``node``."""

    request_id: int
    position: int
    token: SampledToken
    finish_reason: str | None
    node: str
    prompt_logprobs: tuple[SampledToken, ...] = ()
    """On a request's first token, when it asked for them (see ``StageOutput.prompt_logprobs``)."""


@dataclass(frozen=True)
class TokenBatch:
    tokens: tuple[TokenEvent, ...]


@dataclass(frozen=True)
class Release:
    request_ids: tuple[int, ...]


@dataclass(frozen=True)
class Failure:
    """Stage ``node`` dropped ``request_id`` (an input it refused, a step that raised) for ``message``."""

    request_id: int
    node: str
    message: str


@dataclass(frozen=True)
class Failures:
    """Sent to the coordinator, which fails these requests and frees them on every stage."""

    failures: tuple[Failure, ...]


Message = InputBatch | TokenBatch | Release | Failures


# --- encoding ---------------------------------------------------------------------------------------
def tensor_frame(t: torch.Tensor) -> np.ndarray:
    """The raw bytes of a tensor as a C-contiguous CPU array, without a copy when it already is one."""
    if not t.is_cpu:
        t = t.cpu()
    if t.requires_grad:
        t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    return (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()


class _Payload:
    """What an encoder collects besides the header: inline bytes and out-of-line frames."""

    __slots__ = ("inline", "inline_bytes", "extra")

    def __init__(self) -> None:
        self.inline: list = []       # buffers (each padded to _ALIGN) after the header, in order
        self.inline_bytes = 0
        self.extra: list = []        # frames 1.. (zero-copy tensor buffers)

    def add(self, arr: np.ndarray) -> tuple[int, int]:
        """Place ``arr``'s bytes; returns (frame, byte offset), relative to the inline area for frame 0."""
        nbytes = arr.nbytes
        if nbytes >= INLINE_MAX_BYTES:
            self.extra.append(arr)
            return len(self.extra), 0
        offset = self.inline_bytes
        self.inline.append(arr)
        if nbytes % _ALIGN:
            self.inline.append(_PAD[nbytes % _ALIGN:])
        self.inline_bytes += nbytes + (-nbytes % _ALIGN)
        return 0, offset

    def frames(self, layout: int, header: bytes) -> list:
        parts = [_PREAMBLE.pack(WIRE_VERSION, layout, len(self.extra), len(header)), header]
        if self.inline:
            parts.append(_PAD[:-(_PREAMBLE.size + len(header)) % _ALIGN])
            parts.extend(self.inline)
        return [b"".join(parts), *self.extra]


def _is_plain(w: WireInput) -> bool:
    """Whether ``w`` fits a record: int id and position, token ids or a 2-D hidden state of a known
    dtype, no route and no new request."""
    it = w.item
    rid, pos = it.request_id, it.start_position
    if w.route is not None or it.new_request is not None or type(rid) is not int \
            or type(pos) is not int or not (INT64_MIN <= rid <= INT64_MAX and 0 <= pos <= INT64_MAX):
        return False
    hs = it.hidden_states
    return it.token_ids is not None or (hs.dtype in _CODES and hs.dim() == 2)


def _records(inputs: Sequence[WireInput], out: _Payload) -> bytes:
    """The records header of a batch of plain inputs (:func:`_is_plain`), payloads added to ``out``."""
    records = []
    for w in inputs:
        it = w.item
        rid, pos = it.request_id, it.start_position
        if it.token_ids is not None:
            f, o = out.add(np.array(it.token_ids, dtype=np.int64))
            records.append(_RECORD.pack(rid, pos, _TOKENS, f, o, len(it.token_ids), 0))
            continue
        hs = it.hidden_states
        f, o = out.add(tensor_frame(hs))
        rows, cols = hs.shape
        records.append(_RECORD.pack(rid, pos, _CODES[hs.dtype], f, o, rows, cols))
    return b"".join(records)


def _new_request_dict(n: NewRequest) -> dict:
    return {"id": n.request_id, "n": n.num_prompt_tokens, "s": dataclasses.asdict(n.sampling),
            "p": list(n.prompt_token_ids), "e": n.enter_layer, "a": n.adapter}


def _input_map(w: WireInput, out: _Payload) -> dict:
    it = w.item
    d: dict = {"id": it.request_id, "pos": it.start_position}
    if it.token_ids is not None:
        d["tok"] = list(it.token_ids)
    else:
        hs = it.hidden_states
        d["dt"] = _DTYPE_NAMES[hs.dtype]
        d["sh"] = list(hs.shape)
        d["f"], d["o"] = out.add(tensor_frame(hs))
    if it.new_request is not None:
        d["new"] = _new_request_dict(it.new_request)
    if w.route is not None:
        d["r"] = [[h.node, h.enter_layer] for h in w.route.hops]
    return d


def _header_map(msg: Message, out: _Payload) -> dict:
    if isinstance(msg, InputBatch):
        return {"kind": "in", "items": [_input_map(w, out) for w in msg.inputs]}
    if isinstance(msg, TokenBatch):
        return {"kind": "tok", "items": [
            {"id": t.request_id, "pos": t.position, "t": t.token.token_id, "lp": t.token.logprob,
             "top": [list(x) for x in t.token.top_logprobs], "fin": t.finish_reason, "node": t.node,
             **({"plp": [[p.token_id, p.logprob, [list(x) for x in p.top_logprobs]]
                         for p in t.prompt_logprobs]} if t.prompt_logprobs else {})}
            for t in msg.tokens]}
    if isinstance(msg, Release):
        return {"kind": "rel", "ids": list(msg.request_ids)}
    if isinstance(msg, Failures):
        return {"kind": "fail", "items": [{"id": f.request_id, "node": f.node, "msg": f.message}
                                          for f in msg.failures]}
    raise TypeError(f"not a wire message: {type(msg).__name__}")


def encode(msg: Message) -> list:
    """Frames of ``msg``: ``[head bytes, large tensor buffers...]`` (see the module docstring)."""
    out = _Payload()
    if type(msg) is InputBatch and all(_is_plain(w) for w in msg.inputs):
        # Checked before any payload is placed: a mixed batch (a new request's first chunk beside
        # decodes) goes straight to the map without copying tensors twice.
        return out.frames(_RECORDS, _records(msg.inputs, out))
    return out.frames(_MAP, _packer.pack(_header_map(msg, out)))


_packer = msgpack.Packer()   # reused: building one per message costs as much as packing a decode header


# --- decoding ---------------------------------------------------------------------------------------
def frames_after(head) -> int | None:
    """How many frames the head frame ``head`` announces after itself; None when it is not a head
    frame of this wire version (the receiver then drains whatever parts follow)."""
    if len(head) < _PREAMBLE.size:
        return None
    version, _, extra, _ = _PREAMBLE.unpack_from(head)
    return extra if version == WIRE_VERSION else None


def _view(frames: Sequence, f: int, offset: int, np_dtype, shape) -> np.ndarray:
    """An array of ``shape`` and ``np_dtype`` at ``offset`` (>= 0) in frame ``f``, without a copy
    (numpy checks that it ends inside the frame)."""
    return np.ndarray(shape, np_dtype, frames[f], offset)


def _hidden(frames: Sequence, f: int, offset: int, dtype_name: str, shape) -> torch.Tensor:
    # numpy's array-over-a-buffer + from_numpy costs half of torch.frombuffer + view here.
    t = torch.from_numpy(_view(frames, f, offset, _NP_DTYPES[dtype_name], shape))
    return t.view(torch.bfloat16) if dtype_name == "bfloat16" else t


def _decode_records(frames: Sequence, start: int, end: int, inline_start: int) -> InputBatch:
    if (end - start) % _RECORD.size:
        raise WireError(f"records header of {end - start} bytes, not a multiple of {_RECORD.size}")
    head, inputs = frames[0], []
    for at in range(start, end, _RECORD.size):
        rid, pos, code, f, o, rows, cols = _RECORD.unpack_from(head, at)
        if f == 0:
            o += inline_start
        if code == _TOKENS:
            item = StageInput(rid, pos, tuple(_view(frames, f, o, np.int64, (rows,)).tolist()))
        else:
            item = StageInput(rid, pos, None, _hidden(frames, f, o, _CODE_NAMES[code], (rows, cols)))
        inputs.append(WireInput(item))
    return InputBatch(tuple(inputs))


def _decode_new(d: dict) -> NewRequest:
    s = dict(d["s"])
    s["stop_token_ids"] = tuple(s.get("stop_token_ids", ()))
    return NewRequest(d["id"], int(d["n"]), SamplingParams(**s), tuple(d["p"]), d["e"], d.get("a"))


def _input_from_map(d: dict, frames: Sequence, inline_start: int) -> WireInput:
    new = _decode_new(d["new"]) if "new" in d else None
    if "tok" in d:
        item = StageInput(d["id"], d["pos"], tuple(d["tok"]), None, new)
    else:
        f, offset = d["f"], d["o"]
        if offset < 0 or f < 0:   # numpy would read before the buffer (records' fields are unsigned)
            raise WireError(f"negative frame or offset: {f}, {offset}")
        hs = _hidden(frames, f, offset + (inline_start if f == 0 else 0), d["dt"], d["sh"])
        item = StageInput(d["id"], d["pos"], None, hs, new)
    route = Route(tuple(Hop(n, int(e)) for n, e in d["r"])) if "r" in d else None
    return WireInput(item, route)


def _decode_map(frames: Sequence, start: int, end: int, inline_start: int) -> Message:
    head = msgpack.unpackb(frames[0][start:end])
    if not isinstance(head, dict):
        raise WireError(f"header is a {type(head).__name__}, not a map")
    kind = head["kind"]
    if kind == "in":
        return InputBatch(tuple(_input_from_map(d, frames, inline_start) for d in head["items"]))
    if kind == "tok":
        events = tuple(
            TokenEvent(d["id"], d["pos"], SampledToken(d["t"], d["lp"], tuple(map(tuple, d["top"]))),
                       d["fin"], d["node"],
                       tuple(SampledToken(t, lp, tuple(map(tuple, top)))
                             for t, lp, top in d.get("plp", ())))
            for d in head["items"])
        if any(e.finish_reason is not None and type(e.finish_reason) is not str for e in events):
            raise WireError("finish reason is neither a string nor null")
        return TokenBatch(events)
    if kind == "rel":
        return Release(tuple(head["ids"]))
    if kind == "fail":
        return Failures(tuple(Failure(d["id"], str(d["node"]), str(d["msg"])) for d in head["items"]))
    raise WireError(f"unknown message kind {kind!r}")


def decode(frames: Sequence) -> Message:
    """The message in ``frames`` (the head as bytes, then bytes or ``zmq.Frame``); tensors view the
    frames' memory (read-only)."""
    head = frames[0]
    if len(head) < _PREAMBLE.size or head[0] != WIRE_VERSION:
        raise WireError(f"not a version-{WIRE_VERSION} head frame ({len(head)} bytes, first "
                        f"{head[0] if len(head) else None!r})")
    _, layout, extra, header_len = _PREAMBLE.unpack_from(head)
    if extra != len(frames) - 1:
        raise WireError(f"head announces {extra} frames after it, got {len(frames) - 1}")
    end = _PREAMBLE.size + header_len
    if end > len(head):
        raise WireError(f"header of {header_len} bytes overruns a {len(head)}-byte head frame")
    inline_start = end + (-end % _ALIGN)
    try:
        if layout == _RECORDS:
            return _decode_records(frames, _PREAMBLE.size, end, inline_start)
        if layout == _MAP:
            return _decode_map(frames, _PREAMBLE.size, end, inline_start)
        raise WireError(f"unknown header layout {layout}")
    except WireError:
        raise
    except (KeyError, TypeError, IndexError, ValueError, OverflowError, struct.error,
            msgpack.UnpackException, HelixUserError) as exc:   # HelixUserError: bad SamplingParams
        raise WireError(f"malformed message: {exc!r}") from None
