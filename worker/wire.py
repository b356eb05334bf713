"""The data-plane wire format: one small typed header frame, then raw tensor frames. No pickles.

A message is a ZeroMQ multipart message ``[header, frame_0, frame_1, ...]``. The header is a MessagePack
map (``{"v": 1, "kind": ..., ...}``; plain maps, lists, strings and numbers only -- MessagePack rather
than JSON because it encodes and decodes ~4x faster, which matters for one-token decode messages);
each hidden-state tensor travels as its own frame of raw bytes
(C-contiguous, dtype and shape in the header), sent zero-copy and read back with ``torch.frombuffer``
(no copy on receipt either). Token ids are small and ride inside the header.

Three kinds of message move between the coordinator and the stages:

- :class:`InputBatch` — stage inputs (token ids for a first stage, hidden states for later ones);
  the first input of a request carries its :class:`~worker.io_types.NewRequest` and its :class:`Route`.
- :class:`TokenBatch` — tokens sampled by a last stage (to the coordinator, and as token-id inputs to
  the first stage for the next step).
- :class:`Release` — forget these requests and free their KV (finished elsewhere, or cancelled).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import msgpack
import torch

from worker.io_types import NewRequest, StageInput
from worker.sampling import SampledToken, SamplingParams

WIRE_VERSION = 1

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_DTYPE_NAMES = {v: k for k, v in _DTYPES.items()}

# Received frames are read-only buffers; the engine only reads them (it copies on ``.to``/``cat``).
warnings.filterwarnings("ignore", message="The given buffer is not writable")


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


@dataclass(frozen=True)
class TokenBatch:
    tokens: tuple[TokenEvent, ...]


@dataclass(frozen=True)
class Release:
    request_ids: tuple[int, ...]


Message = InputBatch | TokenBatch | Release


# --- encoding ---------------------------------------------------------------------------------------
def tensor_frame(t: torch.Tensor):
    """A buffer over the raw bytes of a CPU tensor, without a copy when it is already contiguous."""
    if t.device.type != "cpu":
        t = t.cpu()
    if t.requires_grad:
        t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    # numpy has no bfloat16: reinterpret its bits as int16 (same bytes).
    return (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()


def _new_request_dict(n: NewRequest) -> dict:
    return {"id": n.request_id, "n": n.num_prompt_tokens, "s": dataclasses.asdict(n.sampling),
            "p": list(n.prompt_token_ids), "e": n.enter_layer}


def _encode_input(w: WireInput, frames: list) -> dict:
    it = w.item
    d: dict = {"id": it.request_id, "pos": it.start_position}
    if it.token_ids is not None:
        d["tok"] = list(it.token_ids)
    else:
        hs = it.hidden_states
        d["dt"] = _DTYPE_NAMES[hs.dtype]
        d["sh"] = list(hs.shape)
        d["f"] = len(frames)
        frames.append(tensor_frame(hs))
    if it.new_request is not None:
        d["new"] = _new_request_dict(it.new_request)
    if w.route is not None:
        d["r"] = [[h.node, h.enter_layer] for h in w.route.hops]
    return d


def encode(msg: Message) -> list:
    """Frames of ``msg``: ``[header bytes, raw tensor frames...]``."""
    frames: list = [b""]
    if isinstance(msg, InputBatch):
        head = {"v": WIRE_VERSION, "kind": "in", "items": [_encode_input(w, frames) for w in msg.inputs]}
    elif isinstance(msg, TokenBatch):
        head = {"v": WIRE_VERSION, "kind": "tok", "items": [
            {"id": t.request_id, "pos": t.position, "t": t.token.token_id, "lp": t.token.logprob,
             "top": [list(x) for x in t.token.top_logprobs], "fin": t.finish_reason, "node": t.node}
            for t in msg.tokens]}
    elif isinstance(msg, Release):
        head = {"v": WIRE_VERSION, "kind": "rel", "ids": list(msg.request_ids)}
    else:
        raise TypeError(f"not a wire message: {type(msg).__name__}")
    frames[0] = _packer.pack(head)
    return frames


_packer = msgpack.Packer()   # reused: building one per message costs as much as packing a decode header


# --- decoding ---------------------------------------------------------------------------------------
def _buffer(frame) -> memoryview:
    """A flat byte view of a frame (``zmq.Frame``, bytes, or a numpy array before sending)."""
    buf = frame.buffer if hasattr(frame, "buffer") else memoryview(frame)
    return buf if buf.ndim == 1 and buf.format == "B" else buf.cast("B")


def _decode_new(d: dict) -> NewRequest:
    s = dict(d["s"])
    s["stop_token_ids"] = tuple(s.get("stop_token_ids", ()))
    return NewRequest(d["id"], int(d["n"]), SamplingParams(**s), tuple(d["p"]), d["e"])


def _decode_input(d: dict, frames: Sequence) -> WireInput:
    new = _decode_new(d["new"]) if "new" in d else None
    if "tok" in d:
        item = StageInput(d["id"], d["pos"], token_ids=tuple(d["tok"]), new_request=new)
    else:
        buf = _buffer(frames[d["f"]])
        dtype = _DTYPES[d["dt"]]
        hs = torch.frombuffer(buf, dtype=dtype) if len(buf) else torch.empty(0, dtype=dtype)
        item = StageInput(d["id"], d["pos"], hidden_states=hs.view(*d["sh"]), new_request=new)
    route = Route(tuple(Hop(n, int(e)) for n, e in d["r"])) if "r" in d else None
    return WireInput(item, route)


def _decode_header(frame) -> dict:
    try:
        head = msgpack.unpackb(frame if isinstance(frame, bytes) else _buffer(frame))
    except (ValueError, msgpack.UnpackException) as exc:
        raise WireError(f"malformed header: {exc!r}") from None
    if not isinstance(head, dict) or head.get("v") != WIRE_VERSION:
        version = head.get("v") if isinstance(head, dict) else None
        raise WireError(f"wire version {version!r}, expected {WIRE_VERSION}")
    return head


def decode(frames: Sequence) -> Message:
    """The message in ``frames`` (bytes or ``zmq.Frame``); tensors view the frames' memory."""
    head = _decode_header(frames[0])
    try:
        kind = head["kind"]
        if kind == "in":
            return InputBatch(tuple(_decode_input(d, frames) for d in head["items"]))
        if kind == "tok":
            return TokenBatch(tuple(
                TokenEvent(d["id"], d["pos"], SampledToken(d["t"], d["lp"], tuple(map(tuple, d["top"]))),
                           d["fin"], d["node"]) for d in head["items"]))
        if kind == "rel":
            return Release(tuple(head["ids"]))
        raise WireError(f"unknown message kind {kind!r}")
    except (KeyError, TypeError, IndexError, ValueError, msgpack.UnpackException) as exc:
        raise WireError(f"malformed message: {exc!r}") from None
