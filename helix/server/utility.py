"""vLLM's utility routes beside the OpenAI API: ``GET /version``, ``GET|POST /ping``, ``POST /tokenize``
and ``POST /detokenize`` (request and reply shapes as vLLM's server answers them). Tokenizing runs
off the event loop, after the same text checks as a completion (valid Unicode, the byte cap)."""

from __future__ import annotations

import asyncio
from importlib.metadata import PackageNotFoundError, version

from fastapi import FastAPI, Response
from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr

from helix.core.errors import HelixUserError
from helix.server.schemas import ChatMessage, message_dicts


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    prompt: StrictStr | None = None
    messages: list[ChatMessage] | None = None
    """Checked and rendered as ``/v1/chat/completions`` does (:func:`message_dicts`)."""
    add_special_tokens: StrictBool | None = None
    """Default: true for a prompt (as a completion), false for messages (as a chat)."""
    add_generation_prompt: StrictBool = True


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    tokens: list[StrictInt]


def _helix_version() -> str:
    try:
        return version("helix-serve")
    except PackageNotFoundError:   # a source tree that was never installed
        return "0+unknown"


def add_utility_routes(app: FastAPI, server) -> None:
    """Add the routes to ``app``; ``server`` is the app's :class:`~helix.server.app.OpenAIServer`."""
    codec = server.coordinator.codec

    @app.get("/version")
    def version_route():
        return {"version": _helix_version()}

    @app.api_route("/ping", methods=["GET", "POST"])
    def ping():
        return Response(status_code=200)

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest):
        if body.model is not None:
            server._check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise HelixUserError("tokenize needs exactly one of 'prompt' or 'messages'")
        if body.prompt is not None:
            server._check_texts([body.prompt], "prompt")
            special = True if body.add_special_tokens is None else body.add_special_tokens
            tokens = await asyncio.to_thread(codec.encode, body.prompt, special)
        else:
            messages = message_dicts(body.messages)
            server._check_texts([m["content"] for m in messages], "messages")
            text = await asyncio.to_thread(codec.render_chat, messages, body.add_generation_prompt)
            # As the chat API encodes: no special tokens with the model's template, the
            # post-processor's with the built-in one.
            special = codec.chat_special_tokens if body.add_special_tokens is None \
                else body.add_special_tokens
            tokens = await asyncio.to_thread(codec.encode, text, special)
        return {"count": len(tokens), "max_model_len": codec.max_context_tokens, "tokens": tokens}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest):
        if body.model is not None:
            server._check_model(body.model)
        bad = [t for t in body.tokens if not 0 <= t < codec.vocab_size]
        if bad:
            raise HelixUserError(f"tokens must be ids in [0, {codec.vocab_size}), got {bad[:5]!r}")
        return {"prompt": await asyncio.to_thread(codec.decode, body.tokens)}
