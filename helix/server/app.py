"""The OpenAI-compatible HTTP API (FastAPI) in front of the live coordinator.

``POST /v1/completions``, ``POST /v1/chat/completions`` (SSE when ``stream``; the stream ends with
``data: [DONE]``; ``stream_options.include_usage`` adds a final usage chunk, and
``continuous_usage_stats`` the running counts to every chunk, as vLLM does), ``GET /v1/models``,
``GET /health`` (200 only when every stage of some pipeline answers and stepped recently, or a
one-token probe passes now; 503 at once when no pipeline's workers answer; the body's ``status`` is
``ok``, ``degraded`` while some node is down or part of the plan's capacity does not serve, or
``unhealthy``, beside :meth:`~coordinator.membership.Membership.health_report`: the capacity
fraction, each node's state, the nodes down since when and why, the waiting queue and its bound),
``GET /metrics`` (Prometheus), ``GET /v1/cluster`` and ``GET /dashboard`` (the live view,
:mod:`helix.server.live`). Errors are OpenAI-style JSON ``{"error": {"message", "type", "param",
"code"}}``: 400 for bad input, 404 for an unknown model or path, 503 with ``Retry-After`` when the
queue is full, 504 (``timeout_error``) when the workers produce nothing for ``request_timeout_s``,
500 (``server_error``) when generation fails. A stream that fails or times out sends one
``data: {"error": ...}`` event and then ``data: [DONE]`` (as vLLM does). Streamed chunks carry
``logprobs`` when requested, in the same format as the non-streamed reply. A client that disconnects
mid-stream cancels its request (KV freed on every stage). ``n``, several prompts and ``echo``: one
choice per sequence (:mod:`helix.server.choices`), streamed interleaved, each chunk naming its
``index``. Chat without ``max_tokens`` generates to the end of the context (vLLM's default).
A finished choice (the finish chunk of a stream) carries vLLM's ``stop_reason``
(:attr:`~coordinator.requests.Done.stop_reason`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from coordinator.requests import Delta, Done, RequestTimeout
from coordinator.runtime import Coordinator, NoPipeline, QueueFull
from helix.core.errors import HelixUserError
from helix.core.spec import ClusterSpec
from helix.server.adapters import add_adapter_routes, resolve_model, task_cards
from helix.server.admin import add_admin_routes
from helix.server.choices import Choice, child_params, merged, usage
from helix.server.guard import HttpOptions, install as install_guards
from helix.server.live import ClusterView, add_live_routes
from helix.server.logprobs import LogprobsBuilder, joined
from helix.server.utility import add_utility_routes
from helix.server.metrics import ServingMetrics
from helix.server.schemas import MAX_N, ChatRequest, CompletionRequest, unknown_fields


log = logging.getLogger("helix.server")


class GenerationFailed(RuntimeError):
    """The coordinator ended the request with an error (``Done.error``): HTTP 500."""


def error_body(message: str, err_type: str, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": err_type, "param": None, "code": code}}


def error_response(status: int, message: str, err_type: str, code: str | None = None,
                   headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, err_type, code), status_code=status, headers=headers)


def _stream_error(exc: Exception) -> dict:
    """The error event that ends a failed stream (before ``data: [DONE]``)."""
    if isinstance(exc, RequestTimeout):
        return error_body(str(exc), "timeout_error", "request_timeout")
    if isinstance(exc, GenerationFailed):
        return error_body(str(exc), "server_error")
    if isinstance(exc, NoPipeline):
        return error_body(str(exc), "service_unavailable", "no_pipeline")
    if isinstance(exc, HelixUserError):
        return error_body(str(exc), "invalid_request_error")
    log.exception("stream failed")   # a bug: keep the traceback in the log
    return error_body(f"internal error: {type(exc).__name__}: {exc}", "server_error")


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

    @app.exception_handler(NoPipeline)
    async def _no_pipeline(_req, exc: NoPipeline):
        return error_response(503, str(exc), "service_unavailable", "no_pipeline",
                              headers={"Retry-After": str(exc.retry_after_s)})

    @app.exception_handler(RequestTimeout)
    async def _timeout(_req, exc: RequestTimeout):
        return error_response(504, str(exc), "timeout_error", "request_timeout")

    @app.exception_handler(GenerationFailed)
    async def _failed(_req, exc: GenerationFailed):
        return error_response(500, str(exc), "server_error")

    @app.exception_handler(StarletteHTTPException)
    async def _http(_req, exc: StarletteHTTPException):
        kind = ("not_found_error" if exc.status_code == 404 else
                "server_error" if exc.status_code >= 500 else "invalid_request_error")
        return error_response(exc.status_code, str(exc.detail), kind)


def _raise_failed(done: Done) -> None:
    """A Done that ended in an error: 503 (no pipeline now) or 500 (generation failed)."""
    if done.error is not None and done.retry_after_s is not None:
        raise NoPipeline(done.error, done.retry_after_s)
    if done.error is not None and done.user_error:   # a worker refused it as bad input: 400
        raise HelixUserError(done.error)
    if done.error is not None:
        raise GenerationFailed(done.error)


_CLIENT_LEFT = Response(status_code=499)
"""What a handler returns when its client disconnected (nginx's 499; nobody reads it)."""


async def _client_left(request: Request) -> None:
    """Returns when the client disconnects. The body was read already (the route has it), so the
    next ASGI message is ``http.disconnect``."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _sse(obj) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


class OpenAIServer:
    """Routes bound to one coordinator and one served model name."""

    def __init__(self, coordinator: Coordinator, model_name: str,
                 metrics: ServingMetrics | None = None, strict: bool = False) -> None:
        self.coordinator = coordinator
        self.model_name = model_name
        self.metrics = metrics or ServingMetrics(model_name)
        self.created = int(time.time())
        self.timeout_s = coordinator.config.request_timeout_s
        self.strict = strict
        self._warned: set[str] = set()

    def _check_fields(self, body) -> None:
        """Unknown request fields: a 400 with ``--strict``, else ignored with one warning per name."""
        unknown = unknown_fields(body)
        if not unknown:
            return
        if self.strict:
            raise HelixUserError(f"unknown field(s) {', '.join(unknown)} (the server runs with --strict)")
        new = [f for f in unknown if f not in self._warned]
        if new:
            self._warned.update(new)
            log.warning("ignoring unknown request field(s) %s", ", ".join(new))

    def _check_model(self, name: str) -> str | None:
        """The adapter task ``name`` asks for (None: the base model); 404 for anything else."""
        return resolve_model(self.coordinator, self.model_name, name)

    def _check_texts(self, texts, what: str) -> None:
        """Text a client sent: valid Unicode (JSON allows lone surrogates such as ``"\\ud800"``,
        which UTF-8 and the tokenizer do not) and, together, no longer than the model's context can
        hold (:attr:`TextCodec.max_text_bytes`), checked before any tokenizer time is spent."""
        total = 0
        for text in texts:
            try:
                total += len(text.encode("utf-8"))
            except UnicodeEncodeError as exc:
                raise HelixUserError(f"{what}: invalid Unicode at character {exc.start} "
                                     f"({exc.reason}: {text[exc.start:exc.end]!a})") from None
        limit = self.coordinator.codec.max_text_bytes
        if total > limit:
            raise HelixUserError(f"{what} is {total} bytes; the model's context of "
                                 f"{self.coordinator.codec.max_context_tokens} tokens holds at most "
                                 f"{limit} bytes of text")

    async def _prompt_ids(self, prompt) -> list[int]:
        # Token ids are checked (vocabulary, emptiness) by Coordinator.submit's RequestLimits.
        if not isinstance(prompt, str):
            return list(prompt)
        self._check_texts([prompt], "prompt")
        # Off the event loop: a long prompt must not stall every other stream while it tokenizes.
        return await asyncio.to_thread(self.coordinator.codec.encode, prompt)

    async def _chat_ids(self, messages: list[dict]) -> list[int]:
        self._check_texts([m["content"] for m in messages], "messages")
        return await asyncio.to_thread(self.coordinator.codec.encode_chat, messages)

    def _logprobs(self, params, as_token_ids: bool) -> LogprobsBuilder | None:
        if params.logprobs is None:
            return None
        return LogprobsBuilder(self.coordinator.codec, as_token_ids)

    async def completions(self, body: CompletionRequest, request: Request):
        adapter = self._check_model(body.model)
        self._check_fields(body)
        params = dataclasses.replace(body.params(), guided_regex=body.guided_regex())
        self._check_texts(body.stop_strings(), "stop")
        prompts = body.prompts()
        ids = [await self._prompt_ids(p) for p in prompts]
        echo = [(p if isinstance(p, str) else self.coordinator.codec.decode(i)) if body.echo else None
                for p, i in zip(prompts, ids)]
        choices = self._submit(ids, params, body, echo, body.echo_only(), adapter=adapter)
        rid = f"cmpl-{uuid.uuid4().hex}"
        model = body.model if adapter is not None else self.model_name   # vLLM names the task
        if body.stream:
            return self._stream(choices, rid, body, chat=False, model=model)
        if not await self._collect_unless_left(choices, request):
            return _CLIENT_LEFT
        return {"id": rid, "object": "text_completion", "created": int(time.time()),
                "model": model, "choices": [c.completion() for c in choices],
                "usage": usage(choices)}

    async def chat(self, body: ChatRequest, request: Request):
        adapter = self._check_model(body.model)
        self._check_fields(body)
        params = dataclasses.replace(body.params(), guided_regex=body.guided_regex())
        self._check_texts(body.stop_strings(), "stop")
        ids = await self._chat_ids(body.message_dicts())
        choices = self._submit([ids], params, body, adapter=adapter)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        model = body.model if adapter is not None else self.model_name   # vLLM names the task
        if body.stream:
            return self._stream(choices, rid, body, chat=True, model=model)
        if not await self._collect_unless_left(choices, request):
            return _CLIENT_LEFT
        return {"id": rid, "object": "chat.completion", "created": int(time.time()),
                "model": model, "choices": [c.chat() for c in choices],
                "usage": usage(choices)}

    def _submit(self, prompt_ids: list[list[int]], params, body, echo: list[str | None] | None = None,
                echo_only: bool = False, adapter: str | None = None) -> list[Choice]:
        """``body.n`` sequences of every prompt (:mod:`helix.server.choices`), all admitted (or
        queued) before any output is awaited; a refused one cancels those already submitted."""
        choices: list[Choice] = []
        loop = asyncio.get_running_loop()
        try:
            for i, ids in enumerate(prompt_ids):
                for j in range(body.n):
                    # The reply's later sequences follow its first past a full queue (MAX_N at most).
                    handle = self.coordinator.submit(ids, child_params(params, j), body.stop_strings(),
                                                     loop=loop, adapter=adapter,
                                                     sibling=0 < len(choices) < MAX_N)
                    lp = self._logprobs(params, body.return_tokens_as_token_ids)
                    choices.append(Choice(len(choices), handle, i, ids, lp, echo[i] if echo else None,
                                          echo_only))
        except BaseException:
            for c in choices:
                c.handle.cancel()
            raise
        return choices

    async def _collect_unless_left(self, choices: list[Choice], request: Request) -> bool:
        """:meth:`_collect` while watching the connection: False when the client went away first
        (every choice cancelled: KV freed on every stage, as when a stream's client leaves; vLLM's
        ``with_cancellation``). Without this a non-streamed request ran to ``max_tokens``, for chat
        without one to the end of the context, ``n`` times, for nobody."""
        collect = asyncio.ensure_future(self._collect(choices))
        left = asyncio.ensure_future(_client_left(request))
        try:
            done, _ = await asyncio.wait((collect, left), return_when=asyncio.FIRST_COMPLETED)
        finally:
            left.cancel()
            collect.cancel()   # no-op when done; else its finally cancels every choice
        if collect not in done:
            await asyncio.gather(collect, return_exceptions=True)   # the cancels have run
            return False
        collect.result()   # its 500 / 504
        return True

    async def _collect(self, choices: list[Choice]) -> None:
        """Every choice's output and Done; a timeout (504) or a failed generation (500) raises and
        cancels the other choices."""
        try:
            async for c, ev in merged(choices, self.timeout_s):
                if isinstance(ev, Delta):
                    c.take(ev)
                    continue
                _raise_failed(ev)
                c.done = ev
        finally:
            for c in choices:
                c.handle.cancel()   # no-op when finished; frees KV when the client went away

    def _stream(self, choices: list[Choice], rid: str, body, chat: bool,
                model: str | None = None) -> StreamingResponse:
        return StreamingResponse(self._sse_events(choices, rid, body.include_usage(), chat,
                                                  body.continuous_usage(), model),
                                 media_type="text/event-stream")

    async def _sse_events(self, choices: list[Choice], rid: str, include_usage: bool, chat: bool,
                          continuous_usage: bool = False, model: str | None = None
                          ) -> AsyncIterator[str]:
        """Chat: a role chunk per choice first. Then a chunk per text delta of a choice (with the
        logprobs of its tokens since its last chunk; a completion's first carries the echoed prompt
        and its logprobs), a finish chunk per choice (logprobs of tokens whose text was held back or
        cut by a stop string), the usage chunk if asked, and ``data: [DONE]`` — also after an error
        event. With ``continuous_usage`` every chunk carries the usage so far: the prompts and the
        completion tokens sent up to and including it."""
        head = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()), "model": model or self.model_name}
        extra = {"usage": None} if include_usage else {}   # OpenAI: null on all but the usage chunk
        prompt_tokens = usage(choices)["prompt_tokens"]
        sent_tokens = 0

        def chunk(c: Choice, text: str | None, tokens=(), finish=None, delta: dict | None = None,
                  echo_lp: dict | None = None) -> str:
            nonlocal sent_tokens
            sent_tokens += len(tokens)
            use = extra
            if continuous_usage:
                use = {"usage": {"prompt_tokens": prompt_tokens, "completion_tokens": sent_tokens,
                                 "total_tokens": prompt_tokens + sent_tokens}}
            lp = echo_lp
            if c.logprobs is not None and tokens:
                lp = c.logprobs.chat(tokens) if chat else joined(lp, c.logprobs.completion(tokens))
            if chat:
                delta = delta or ({} if text is None else {"content": text})
                choice = {"index": c.index, "delta": delta, "logprobs": lp, "finish_reason": finish}
            else:
                choice = {"index": c.index, "text": text or "", "logprobs": lp, "finish_reason": finish}
            if finish is not None:   # vLLM sends stop_reason with the finish only
                choice["stop_reason"] = c.done.stop_reason if c.done is not None else None
            return _sse({**head, "choices": [choice], **use})
        try:
            if chat:
                for c in choices:
                    yield chunk(c, None, delta={"role": "assistant", "content": ""})
            pending = {c.index: [] for c in choices}   # tokens not yet sent (text held back)
            async for c, ev in merged(choices, self.timeout_s):
                if isinstance(ev, Delta):
                    text, tokens, first = c.take(ev)
                    pending[c.index].extend(tokens)
                    if first and c.echo_text is not None:   # the prompt goes first
                        sent, pending[c.index] = (pending[c.index], []) if text else ([], pending[c.index])
                        yield chunk(c, c.echo_text + text, sent, echo_lp=c.echo_logprobs())
                    elif text:
                        yield chunk(c, text, pending[c.index])
                        pending[c.index] = []
                    continue
                c.done = ev
                if ev.error is not None:
                    # Not a silent [DONE] after partial text: a finish chunk that says it failed.
                    yield chunk(c, None, pending.pop(c.index), finish="error")
                    _raise_failed(ev)
                yield chunk(c, None, pending.pop(c.index), finish=ev.finish_reason)
            if include_usage:
                yield _sse({**head, "choices": [], "usage": usage(choices)})
        except Exception as exc:   # not GeneratorExit / CancelledError: a disconnect just ends here
            yield _sse(_stream_error(exc))
        finally:
            for c in choices:
                c.handle.cancel()   # client disconnect lands here (GeneratorExit / CancelledError)
        yield "data: [DONE]\n\n"

    def models(self) -> dict:
        return {"object": "list", "data": [self.model_card(), *task_cards(self.coordinator, self.model_name,
                                                                          self.created)]}

    def model_card(self) -> dict:
        return {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "helix",
                "max_model_len": self.coordinator.codec.max_context_tokens}

    def model(self, model_id: str) -> dict:
        adapter = self._check_model(model_id)
        if adapter is None:
            return self.model_card()
        return next(c for c in task_cards(self.coordinator, self.model_name, self.created)
                    if c["id"] == adapter)


def create_app(coordinator: Coordinator, model_name: str, metrics: ServingMetrics | None = None,
               http: HttpOptions = HttpOptions(), cluster: ClusterSpec | None = None,
               elastic=None) -> FastAPI:
    """The FastAPI app; ``metrics`` should be the coordinator's observer; ``http`` the API key and
    request-body limits (:mod:`helix.server.guard`); ``cluster`` (the spec) and ``elastic``
    (:class:`helix.server.elastic.Elastic`) give the live view its GPU kinds, regions and joining
    nodes (:mod:`helix.server.live`)."""
    server = OpenAIServer(coordinator, model_name, metrics, strict=http.strict)
    app = FastAPI(title="Helix", docs_url=None, redoc_url=None)
    app.state.helix = server
    _install_error_handlers(app)
    install_guards(app, http)
    app.add_api_route("/v1/completions", server.completions, methods=["POST"])
    app.add_api_route("/v1/chat/completions", server.chat, methods=["POST"])
    app.add_api_route("/v1/models", server.models, methods=["GET"])
    app.add_api_route("/v1/models/{model_id:path}", server.model, methods=["GET"])
    add_utility_routes(app, server)
    admin_open = http.api_key is not None or http.admin_open
    add_admin_routes(app, coordinator, admin_open=admin_open)
    add_adapter_routes(app, coordinator, admin_open=admin_open)
    add_live_routes(app, ClusterView(coordinator, model_name, server.metrics.recent, cluster, elastic),
                    f"Helix \u00b7 {model_name}")

    @app.get("/health")
    def health():
        ok = coordinator.healthy()
        report = coordinator.health_report()
        status = "unhealthy" if not ok else "degraded" if report["down"] or \
            report["capacity_fraction"] < 1 else "ok"
        return JSONResponse({"status": status, **report}, status_code=200 if ok else 503)

    @app.get("/metrics")
    def metrics_text():
        return Response(server.metrics.render(coordinator),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/")
    def root():
        return PlainTextResponse("helix: OpenAI-compatible API at /v1\n")
    return app
