"""The OpenAI-compatible HTTP API (FastAPI) in front of the live coordinator.

``POST /v1/completions``, ``POST /v1/chat/completions`` (SSE when ``stream``; the stream ends with
``data: [DONE]``; ``stream_options.include_usage`` adds a final usage chunk), ``GET /v1/models``,
``GET /health`` (200 only when a token was produced recently or a one-token probe passes now),
``GET /metrics`` (Prometheus). Errors are OpenAI-style JSON ``{"error": {"message", "type", "param",
"code"}}``: 400 for bad input, 404 for an unknown model or path, 503 with ``Retry-After`` when the
queue is full. A client that disconnects mid-stream cancels its request (KV freed on every stage).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from coordinator.requests import Delta, Done, RequestHandle, RequestTimeout
from coordinator.runtime import Coordinator, QueueFull
from helix.errors import HelixUserError
from helix.server.metrics import ServingMetrics
from helix.server.schemas import ChatRequest, CompletionRequest


def error_response(status: int, message: str, err_type: str, code: str | None = None,
                   headers: dict | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": err_type, "param": None, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for e in exc.errors()[:5]:
        loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
        parts.append(f"{loc}: {e.get('msg')}" if loc else str(e.get("msg")))
    return "invalid request: " + "; ".join(parts)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _invalid(_req, exc: RequestValidationError):
        return error_response(400, _validation_message(exc), "invalid_request_error")

    @app.exception_handler(HelixUserError)
    async def _user_error(_req, exc: HelixUserError):
        return error_response(400, str(exc), "invalid_request_error")

    @app.exception_handler(QueueFull)
    async def _busy(_req, exc: QueueFull):
        return error_response(503, str(exc), "service_unavailable", "queue_full",
                              headers={"Retry-After": str(exc.retry_after_s)})

    @app.exception_handler(StarletteHTTPException)
    async def _http(_req, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return error_response(exc.status_code, str(exc.detail), kind)


def _usage(done: Done) -> dict:
    return {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens}


def _sse(obj) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


class OpenAIServer:
    """Routes bound to one coordinator and one served model name."""

    def __init__(self, coordinator: Coordinator, model_name: str,
                 metrics: ServingMetrics | None = None) -> None:
        self.coordinator = coordinator
        self.model_name = model_name
        self.metrics = metrics or ServingMetrics()
        self.created = int(time.time())
        self.timeout_s = coordinator.config.request_timeout_s

    def _check_model(self, name: str) -> None:
        if name != self.model_name:
            raise StarletteHTTPException(404, f"model {name!r} not found; this server serves "
                                              f"{self.model_name!r}")

    def _prompt_ids(self, prompt) -> list[int]:
        codec = self.coordinator.codec
        if isinstance(prompt, str):
            return codec.encode(prompt)
        bad = [t for t in prompt if not 0 <= t < codec.vocab_size]
        if bad:
            raise HelixUserError(f"prompt token id(s) {bad[:5]} outside the vocabulary "
                                 f"[0, {codec.vocab_size})")
        return list(prompt)

    async def completions(self, body: CompletionRequest, request: Request):
        self._check_model(body.model)
        params = body.params()
        ids = self._prompt_ids(body.single_prompt())
        handle = self.coordinator.submit(ids, params, body.stop_strings(), loop=asyncio.get_running_loop())
        rid = f"cmpl-{uuid.uuid4().hex}"
        if body.stream:
            return self._stream(handle, rid, "text_completion", body.include_usage(), chat=False)
        text, done, tokens = await self._collect(handle)
        choice = {"index": 0, "text": text,
                  "logprobs": self._completion_logprobs(tokens, params, body.return_tokens_as_token_ids),
                  "finish_reason": done.finish_reason}
        return {"id": rid, "object": "text_completion", "created": int(time.time()),
                "model": self.model_name, "choices": [choice], "usage": _usage(done)}

    async def chat(self, body: ChatRequest, request: Request):
        self._check_model(body.model)
        params = body.params()
        ids = self.coordinator.codec.encode_chat(body.message_dicts())
        handle = self.coordinator.submit(ids, params, body.stop_strings(), loop=asyncio.get_running_loop())
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        if body.stream:
            return self._stream(handle, rid, "chat.completion.chunk", body.include_usage(), chat=True)
        text, done, tokens = await self._collect(handle)
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "logprobs": self._chat_logprobs(tokens, params, body.return_tokens_as_token_ids),
                  "finish_reason": done.finish_reason}
        return {"id": rid, "object": "chat.completion", "created": int(time.time()),
                "model": self.model_name, "choices": [choice], "usage": _usage(done)}

    async def _collect(self, handle: RequestHandle):
        text, tokens, done = [], [], None
        try:
            async for ev in handle.aevents(self.timeout_s):
                if isinstance(ev, Delta):
                    text.append(ev.text)
                    tokens.extend(ev.tokens)
                else:
                    done = ev
        except RequestTimeout as exc:
            raise StarletteHTTPException(504, str(exc)) from None
        finally:
            handle.cancel()   # no-op when finished; frees KV when the client went away
        return "".join(text), done, tokens

    def _token_namer(self, as_ids: bool):
        if as_ids:
            return lambda ids: f"token_id:{ids[0]}"
        return self.coordinator.codec.decode

    def _completion_logprobs(self, tokens, params, as_ids: bool):
        if params.logprobs is None:
            return None
        dec = self._token_namer(as_ids)
        return {"tokens": [dec([t.token_id]) for t in tokens],
                "token_logprobs": [t.logprob for t in tokens],
                "top_logprobs": [{dec([i]): lp for i, lp in t.top_logprobs} for t in tokens],
                "text_offset": []}

    def _chat_logprobs(self, tokens, params, as_ids: bool):
        if params.logprobs is None:
            return None
        dec = self._token_namer(as_ids)
        return {"content": [{"token": dec([t.token_id]), "logprob": t.logprob, "bytes": None,
                             "top_logprobs": [{"token": dec([i]), "logprob": lp, "bytes": None}
                                              for i, lp in t.top_logprobs]} for t in tokens]}

    def _stream(self, handle: RequestHandle, rid: str, obj: str, include_usage: bool,
                chat: bool) -> StreamingResponse:
        return StreamingResponse(self._sse_events(handle, rid, obj, include_usage, chat),
                                 media_type="text/event-stream")

    async def _sse_events(self, handle, rid, obj, include_usage, chat) -> AsyncIterator[str]:
        created = int(time.time())

        def chunk(payload, finish=None):
            choice = ({"index": 0, "delta": payload, "logprobs": None, "finish_reason": finish} if chat
                      else {"index": 0, "text": payload, "logprobs": None, "finish_reason": finish})
            return {"id": rid, "object": obj, "created": created, "model": self.model_name,
                    "choices": [choice]}
        try:
            if chat:
                yield _sse(chunk({"role": "assistant", "content": ""}))
            async for ev in handle.aevents(self.timeout_s):
                if isinstance(ev, Delta) and ev.text:
                    yield _sse(chunk({"content": ev.text} if chat else ev.text))
                elif isinstance(ev, Done):
                    yield _sse(chunk({} if chat else "", finish=ev.finish_reason))
                    if include_usage:
                        yield _sse({"id": rid, "object": obj, "created": created, "model": self.model_name,
                                    "choices": [], "usage": _usage(ev)})
            yield "data: [DONE]\n\n"
        except RequestTimeout as exc:
            yield _sse({"error": {"message": str(exc), "type": "timeout", "param": None, "code": None}})
        finally:
            handle.cancel()   # client disconnect lands here (GeneratorExit / CancelledError)

    def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.model_name, "object": "model",
                                            "created": self.created, "owned_by": "helix"}]}


def create_app(coordinator: Coordinator, model_name: str, metrics: ServingMetrics | None = None) -> FastAPI:
    """The FastAPI app; ``metrics`` should be the coordinator's observer."""
    server = OpenAIServer(coordinator, model_name, metrics)
    app = FastAPI(title="Helix", docs_url=None, redoc_url=None)
    app.state.helix = server
    _install_error_handlers(app)
    app.add_api_route("/v1/completions", server.completions, methods=["POST"])
    app.add_api_route("/v1/chat/completions", server.chat, methods=["POST"])
    app.add_api_route("/v1/models", server.models, methods=["GET"])

    @app.get("/health")
    def health():
        ok = coordinator.healthy()
        return JSONResponse({"status": "ok" if ok else "unhealthy"}, status_code=200 if ok else 503)

    @app.get("/metrics")
    def metrics_text():
        return Response(server.metrics.render(coordinator),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/")
    def root():
        return PlainTextResponse("helix: OpenAI-compatible API at /v1\n")
    return app
