"""``helix.Client``: the native Python client, over gRPC server streaming to the coordinator.

    from helix.client import Client
    c = Client("127.0.0.1:50051")
    out = c.generate("Hello", temperature=0, max_tokens=16)       # -> Completion
    for chunk in c.stream("Hello", max_tokens=16): print(chunk.text, end="")
    out = await c.agenerate("Hello", max_tokens=16)               # async twins
    async for chunk in c.astream("Hello"): ...

Sampling options use vLLM's ``SamplingParams`` names (``temperature``, ``top_p``, ``top_k``,
``min_p``, ``seed``, ``max_tokens``, ``stop_token_ids``, ``ignore_eos``, ...), given as keywords or as
``sampling_params=`` (a ``worker.sampling.SamplingParams``, a vLLM one, or a dict); ``stop`` takes
stop strings. The server validates them: a bad value raises :class:`ClientError` with its message.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

_SERVICE = "helix.Coordinator"


@dataclass(frozen=True)
class StreamChunk:
    """New tokens of a streamed request; the last chunk has ``finish_reason`` and ``usage``."""

    text: str = ""
    token_ids: tuple[int, ...] = ()
    finish_reason: str | None = None
    usage: dict | None = None


@dataclass(frozen=True)
class Completion:
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str
    usage: dict


class ClientError(RuntimeError):
    """The server refused or failed the request; ``code`` is the gRPC status name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


def _ser(obj: dict) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _de(data: bytes) -> dict:
    return json.loads(data)


def _sampling_dict(sampling_params: Any, kwargs: dict) -> dict:
    if sampling_params is None:
        base = {}
    elif isinstance(sampling_params, dict):
        base = dict(sampling_params)
    elif dataclasses.is_dataclass(sampling_params):
        base = dataclasses.asdict(sampling_params)
    else:   # vLLM's SamplingParams (msgspec) and similar: take the public fields we know
        base = {k: getattr(sampling_params, k) for k in (
            "temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty",
            "repetition_penalty", "stop_token_ids", "max_tokens", "min_tokens", "ignore_eos", "logprobs")
            if getattr(sampling_params, k, None) is not None}
    base.update(kwargs)
    if "stop_token_ids" in base and base["stop_token_ids"] is not None:
        base["stop_token_ids"] = list(base["stop_token_ids"])
    return base


def _request(prompt: str | Sequence[int], stop, sampling_params, kwargs) -> dict:
    stop = kwargs.pop("stop", stop)
    req: dict = {"sampling": _sampling_dict(sampling_params, kwargs)}
    if isinstance(prompt, str):
        req["prompt"] = prompt
    else:
        req["prompt_token_ids"] = [int(t) for t in prompt]
    if stop:
        req["stop"] = [stop] if isinstance(stop, str) else list(stop)
    return req


def _chunk(msg: dict) -> StreamChunk:
    return StreamChunk(msg.get("text", ""), tuple(msg.get("token_ids", ())), msg.get("finish_reason"),
                       msg.get("usage"))


def _join(chunks: list[StreamChunk]) -> Completion:
    last = chunks[-1] if chunks else StreamChunk()
    return Completion("".join(c.text for c in chunks), tuple(t for c in chunks for t in c.token_ids),
                      last.finish_reason or "abort", last.usage or {})


class Client:
    """Talks to ``helix serve``'s gRPC port (``host:port``, optionally prefixed ``grpc://``)."""

    def __init__(self, url: str, timeout_s: float = 300.0) -> None:
        self.target = url.removeprefix("grpc://")
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(self.target)
        self._aio_channel: grpc.aio.Channel | None = None

    def stream(self, prompt: str | Sequence[int], sampling_params: Any = None, *,
               stop: str | Sequence[str] | None = None, **kwargs) -> Iterator[StreamChunk]:
        rpc = self._channel.unary_stream(f"/{_SERVICE}/Generate", request_serializer=_ser,
                                         response_deserializer=_de)
        call = rpc(_request(prompt, stop, sampling_params, kwargs), timeout=self.timeout_s)
        try:
            for msg in call:
                yield _chunk(msg)
        except grpc.RpcError as exc:
            raise ClientError(exc.code().name, exc.details() or "") from None
        finally:
            call.cancel()   # stopping early cancels the request on the server

    def generate(self, prompt: str | Sequence[int], sampling_params: Any = None, *,
                 stop: str | Sequence[str] | None = None, **kwargs) -> Completion:
        return _join(list(self.stream(prompt, sampling_params, stop=stop, **kwargs)))

    async def astream(self, prompt: str | Sequence[int], sampling_params: Any = None, *,
                      stop: str | Sequence[str] | None = None, **kwargs) -> AsyncIterator[StreamChunk]:
        if self._aio_channel is None:
            self._aio_channel = grpc.aio.insecure_channel(self.target)
        rpc = self._aio_channel.unary_stream(f"/{_SERVICE}/Generate", request_serializer=_ser,
                                             response_deserializer=_de)
        call = rpc(_request(prompt, stop, sampling_params, kwargs), timeout=self.timeout_s)
        try:
            async for msg in call:
                yield _chunk(msg)
        except grpc.RpcError as exc:
            raise ClientError(exc.code().name, exc.details() or "") from None
        finally:
            call.cancel()

    async def agenerate(self, prompt: str | Sequence[int], sampling_params: Any = None, *,
                        stop: str | Sequence[str] | None = None, **kwargs) -> Completion:
        return _join([c async for c in self.astream(prompt, sampling_params, stop=stop, **kwargs)])

    def close(self) -> None:
        self._channel.close()

    async def aclose(self) -> None:
        if self._aio_channel is not None:
            await self._aio_channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
