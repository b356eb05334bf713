"""``helix.Client``: the native Python client, over gRPC server streaming to the coordinator.

    from helix.client import Client
    c = Client("127.0.0.1:50051")
    out = c.generate("Hello", temperature=0, max_tokens=16)       # -> Completion
    out = c.generate("Hello", max_tokens=16, logprobs=5)          # out.logprobs: [{token_id: logprob}]
    for chunk in c.stream("Hello", max_tokens=16): print(chunk.text, end="")
    out = await c.agenerate("Hello", max_tokens=16)               # async twins
    async for chunk in c.astream("Hello"): ...

Sampling options use vLLM's ``SamplingParams`` names (``temperature``, ``top_p``, ``top_k``,
``min_p``, ``seed``, ``max_tokens``, ``min_tokens``, ``stop``, ``stop_token_ids``, ``ignore_eos``,
``presence_penalty``, ``frequency_penalty``, ``repetition_penalty``, ``logprobs``), given as keywords
or as ``sampling_params=``: a dict, or any object with those attribute names (duck-typed: a
``vllm.SamplingParams`` works, but vLLM is not a dependency of Helix and is not installed here, so the
tests use a stand-in dataclass); ``stop`` takes stop strings. Keywords override ``sampling_params``.
The server validates the values: a bad one raises :class:`ClientError` with its message.

Leaving a stream early (``break``, closing the generator) cancels the request on the server, which frees
its KV cache on every stage.

A server started with ``--keys DIR`` speaks TLS: pass ``tls_cert="DIR/grpc.crt"`` (the certificate
only; the client needs no secret key).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

_SERVICE = "helix.Coordinator"


@dataclass(frozen=True)
class StreamChunk:
    """New tokens of a streamed request; the last chunk has ``finish_reason`` and ``usage``.

    ``logprobs`` / ``token_logprobs``: of this chunk's tokens (see :class:`Completion`)."""

    text: str = ""
    token_ids: tuple[int, ...] = ()
    finish_reason: str | None = None
    usage: dict | None = None
    logprobs: tuple[dict[int, float], ...] | None = None
    token_logprobs: tuple[float, ...] | None = None


@dataclass(frozen=True)
class Completion:
    """A finished request: its text, token ids, ``finish_reason``, ``usage`` and, when the request set
    ``logprobs=N``, its logprobs (``None`` otherwise), one entry per token of ``token_ids``:

    - ``logprobs[i]``: ``{token_id: logprob}``, as vLLM's ``CompletionOutput.logprobs`` but with plain
      floats instead of ``Logprob`` objects: the N most likely tokens, best first, plus the sampled
      token when it is not among them. So it has N entries (N + 1 when sampling picked a token outside
      the top N; only the sampled token for ``logprobs=0``), and ``logprobs[i][token_ids[i]]`` exists.
    - ``token_logprobs[i]``: the sampled token's logprob (``logprobs[i][token_ids[i]]``).

    Values are the model's raw log-softmax (before temperature, penalties, top-k/p), as vLLM's default
    ``raw_logprobs`` and Helix's HTTP API return them."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str
    usage: dict
    logprobs: tuple[dict[int, float], ...] | None = None
    token_logprobs: tuple[float, ...] | None = None


class ClientError(RuntimeError):
    """The server refused or failed the request; ``code`` is the gRPC status name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


def _ser(obj: dict) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _de(data: bytes) -> dict:
    return json.loads(data)


SAMPLING_NAMES = ("temperature", "top_p", "top_k", "min_p", "seed", "max_tokens", "min_tokens",
                  "stop_token_ids", "ignore_eos", "presence_penalty", "frequency_penalty",
                  "repetition_penalty", "logprobs")
"""Attributes of vLLM's ``SamplingParams`` that the server takes (``stop`` is read too, as stop strings)."""


def _sampling_fields(sampling_params: Any) -> dict:
    """The known sampling fields of a dict or of any object with vLLM's attribute names.

    Duck-typed on purpose: vLLM is not a dependency (nor installable everywhere Helix runs), so a
    ``vllm.SamplingParams``, a ``worker.sampling.SamplingParams`` or any stand-in with those attribute
    names works. Other attributes (``n``, ``skip_special_tokens``, ...) are ignored; so are ``None``
    values (vLLM's "unset")."""
    if sampling_params is None:
        return {}
    if isinstance(sampling_params, Mapping):
        return {k: v for k, v in sampling_params.items() if v is not None}
    return {k: v for k in (*SAMPLING_NAMES, "stop")
            if (v := getattr(sampling_params, k, None)) is not None}


def _request(prompt: str | Sequence[int], stop, sampling_params, kwargs, adapter: str | None = None) -> dict:
    """The Generate request; keywords override ``sampling_params``, ``stop=`` overrides its ``stop``."""
    sampling = {**_sampling_fields(sampling_params), **kwargs}
    stop = sampling.pop("stop", None) if stop is None else stop
    sampling.pop("stop", None)
    if sampling.get("stop_token_ids") is not None:
        sampling["stop_token_ids"] = [int(t) for t in sampling["stop_token_ids"]]
    req: dict = {"sampling": sampling}
    if isinstance(prompt, str):
        req["prompt"] = prompt
    else:
        req["prompt_token_ids"] = [int(t) for t in prompt]
    if stop:
        req["stop"] = [stop] if isinstance(stop, str) else list(stop)
    if adapter is not None:
        req["adapter"] = adapter
    return req


def _logprobs(msg: dict, token_ids: tuple[int, ...]):
    """(``logprobs``, ``token_logprobs``) of one message's tokens; (None, None) when not sent."""
    if "token_logprobs" not in msg:
        return None, None
    chosen = tuple(float(lp) for lp in msg["token_logprobs"])
    per_token = []
    for tok, lp, top in zip(token_ids, chosen, msg["top_logprobs"]):
        d = {int(i): float(v) for i, v in top}
        d.setdefault(tok, lp)   # vLLM's dicts hold the sampled token too
        per_token.append(d)
    return tuple(per_token), chosen


def _chunk(msg: dict) -> StreamChunk:
    ids = tuple(msg.get("token_ids", ()))
    return StreamChunk(msg.get("text", ""), ids, msg.get("finish_reason"), msg.get("usage"),
                       *_logprobs(msg, ids))


def _join(chunks: list[StreamChunk]) -> Completion:
    last = chunks[-1] if chunks else StreamChunk()
    logprobs = token_logprobs = None
    if any(c.logprobs is not None for c in chunks):   # the finish chunk has no tokens, so none
        logprobs = tuple(d for c in chunks for d in c.logprobs or ())
        token_logprobs = tuple(lp for c in chunks for lp in c.token_logprobs or ())
    return Completion("".join(c.text for c in chunks), tuple(t for c in chunks for t in c.token_ids),
                      last.finish_reason or "abort", last.usage or {}, logprobs, token_logprobs)


class Client:
    """Talks to ``helix serve``'s gRPC port (``host:port``, optionally prefixed ``grpc://``)."""

    def __init__(self, url: str, timeout_s: float = 300.0, api_key: str | None = None,
                 tls_cert: str | Path | bytes | None = None) -> None:
        """``api_key``: the server's ``--api-key`` (sent as ``authorization: Bearer KEY``);
        ``tls_cert``: the certificate of a server started with ``--keys DIR`` (``DIR/grpc.crt``, a
        path or its PEM bytes): TLS, trusting only it."""
        self.target = url.removeprefix("grpc://")
        self.timeout_s = timeout_s
        self._metadata = (("authorization", f"Bearer {api_key}"),) if api_key else None
        self._tls = None
        if tls_cert is not None:
            from helix.net.control import tls_channel_options
            pem = tls_cert if isinstance(tls_cert, bytes) else Path(tls_cert).read_bytes()
            self._tls = tls_channel_options(pem)
        self._channel = self._open(grpc)
        self._aio_channel: grpc.aio.Channel | None = None

    def _open(self, module):
        """A channel from ``module`` (``grpc`` or ``grpc.aio``): TLS when a certificate was given."""
        if self._tls is None:
            return module.insecure_channel(self.target)
        credentials, options = self._tls
        return module.secure_channel(self.target, credentials, options=options)

    def stream(self, prompt: str | Sequence[int], sampling_params: Any = None, *,
               stop: str | Sequence[str] | None = None, adapter: str | None = None,
               **kwargs) -> Iterator[StreamChunk]:
        """Stream a generation; ``adapter``: a loaded fine-tuned task (``/v1/load_lora_adapter``)
        to run instead of the base model."""
        rpc = self._channel.unary_stream(f"/{_SERVICE}/Generate", request_serializer=_ser,
                                         response_deserializer=_de)
        call = rpc(_request(prompt, stop, sampling_params, kwargs, adapter), timeout=self.timeout_s,
                   metadata=self._metadata)
        try:
            for msg in call:
                yield _chunk(msg)
        except grpc.RpcError as exc:
            raise ClientError(exc.code().name, exc.details() or "") from None
        finally:
            call.cancel()   # stopping early cancels the request on the server

    def generate(self, prompt: str | Sequence[int], sampling_params: Any = None, *,
                 stop: str | Sequence[str] | None = None, adapter: str | None = None,
                 **kwargs) -> Completion:
        return _join(list(self.stream(prompt, sampling_params, stop=stop, adapter=adapter, **kwargs)))

    async def astream(self, prompt: str | Sequence[int], sampling_params: Any = None, *,
                      stop: str | Sequence[str] | None = None, adapter: str | None = None,
                      **kwargs) -> AsyncIterator[StreamChunk]:
        if self._aio_channel is None:
            self._aio_channel = self._open(grpc.aio)
        rpc = self._aio_channel.unary_stream(f"/{_SERVICE}/Generate", request_serializer=_ser,
                                             response_deserializer=_de)
        call = rpc(_request(prompt, stop, sampling_params, kwargs, adapter), timeout=self.timeout_s,
                   metadata=self._metadata)
        try:
            async for msg in call:
                yield _chunk(msg)
        except grpc.RpcError as exc:
            raise ClientError(exc.code().name, exc.details() or "") from None
        finally:
            call.cancel()

    async def agenerate(self, prompt: str | Sequence[int], sampling_params: Any = None, *,
                        stop: str | Sequence[str] | None = None, adapter: str | None = None,
                        **kwargs) -> Completion:
        return _join([c async for c in self.astream(prompt, sampling_params, stop=stop, adapter=adapter,
                                                    **kwargs)])

    def drain(self, node: str, force: bool = False, move: bool = False) -> dict:
        """Take ``node`` out of routing (``helix drain``; :mod:`coordinator.drain`): its status
        after it (``state`` draining or drained, ``requests`` left). ``ClientError`` NOT_FOUND for
        an unknown node, FAILED_PRECONDITION when no pipeline would be left (``force`` drains anyway)."""
        return self._unary("Drain", {"node": node, "force": force, "move": move})

    def undrain(self, node: str) -> dict:
        """Put ``node`` back into routing; its status after it."""
        return self._unary("Undrain", {"node": node})

    def nodes(self) -> list[dict]:
        """Every node's status (state, layers, requests left)."""
        return self._unary("Nodes", {})["nodes"]

    def _unary(self, method: str, request: dict) -> dict:
        rpc = self._channel.unary_unary(f"/{_SERVICE}/{method}", request_serializer=_ser,
                                        response_deserializer=_de)
        try:
            return rpc(request, timeout=self.timeout_s, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise ClientError(exc.code().name, exc.details() or "") from None

    def close(self) -> None:
        self._channel.close()

    async def aclose(self) -> None:
        if self._aio_channel is not None:
            await self._aio_channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
