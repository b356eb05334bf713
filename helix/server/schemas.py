"""Request bodies of the OpenAI-compatible API, validated once (pydantic), then turned into
:class:`~worker.sampling.SamplingParams`.

Unknown fields are ignored with a logged warning, as vLLM does (clients send harmless OpenAI fields
such as ``store``, ``metadata``, ``service_tier``); ``helix serve --strict`` refuses them (HTTP 400)
instead, so a typo never silently changes sampling (:func:`unknown_fields`). Fields we know and
cannot honour are always a 400 naming the field (``tools``). Besides OpenAI's
fields we take vLLM's extra sampling names (``top_k``, ``min_p``, ``repetition_penalty``,
``min_tokens``, ``ignore_eos``, ``stop_token_ids``). ``suffix``, which OpenAI defines and Helix does
not implement, is refused with a clear message; ``best_of`` is not a field (vLLM's current engine
dropped it: an unknown field, ignored). ``max_tokens`` defaults as vLLM's: 16 for completions, the end
of the context for chat (None here; the coordinator resolves it).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from helix.core.errors import HelixUserError
from helix.net.sampling import MAX_LOGPROBS, SamplingParams
from helix.server.structured import guided_regex


_DEFAULT_MAX_TOKENS = 16
"""OpenAI's and vLLM's default for a completion's ``max_tokens`` when a request sets none."""

MAX_N = 128
"""Most choices one request may ask for (``n``)."""


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool = False


def unknown_fields(model: BaseModel, prefix: str = "") -> list[str]:
    """Dotted names of every field in ``model`` (nested models and lists of them included) that its
    schema does not define."""
    found = [f"{prefix}{k}" for k in (model.model_extra or {})]
    for name in type(model).model_fields:
        value = getattr(model, name)
        items = value if isinstance(value, list) else [value]
        for i, item in enumerate(items):
            if isinstance(item, BaseModel):
                where = f"{prefix}{name}[{i}]." if isinstance(value, list) else f"{prefix}{name}."
                found += unknown_fields(item, where)
    return found


class _Sampling(BaseModel):
    """Fields shared by completions and chat.

    Numbers and flags are strict (``StrictInt``, ``StrictFloat``, ``StrictBool``): JSON ``true`` is no
    token count and ``"0.5"`` no temperature, so neither is coerced (pydantic's lax mode would turn
    ``max_tokens: true`` into 1)."""

    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: StrictInt | None = Field(default=None, description="Tokens to generate at most.")
    temperature: StrictFloat = 1.0
    top_p: StrictFloat = 1.0
    n: StrictInt = 1
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    stop: StrictStr | list[StrictStr] | None = None
    seed: StrictInt | None = None
    presence_penalty: StrictFloat = 0.0
    frequency_penalty: StrictFloat = 0.0
    logit_bias: dict[str, StrictFloat] | None = None
    """Token id (a string) -> bias in [-100, 100], added to the logits before sampling."""
    user: str | None = None
    # vLLM extras
    top_k: StrictInt = 0
    min_p: StrictFloat = 0.0
    repetition_penalty: StrictFloat = 1.0
    min_tokens: StrictInt = 0
    ignore_eos: StrictBool = False
    stop_token_ids: list[StrictInt] | None = None
    return_tokens_as_token_ids: StrictBool = False
    """vLLM extra: logprob entries name tokens ``token_id:<id>`` instead of their text."""
    response_format: dict | None = None
    """``{"type": "text"}`` (the default), ``json_object`` or ``json_schema``: structured output
    (:meth:`guided_regex`)."""
    tools: list | None = None
    tool_choice: Any = None

    def _check_supported(self) -> None:
        if not 1 <= self.n <= MAX_N:
            raise HelixUserError(f"n must be in [1, {MAX_N}], got {self.n}")
        if self.stream_options is not None and not self.stream:
            raise HelixUserError("stream_options is only allowed with stream=true")
        if self.tools:
            raise HelixUserError("tools are not supported (no tool calling)")
        if self.tool_choice not in (None, "none", "auto"):
            raise HelixUserError("tool_choice is not supported (no tool calling)")

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def guided_regex(self) -> str | None:
        """The regex the reply must match under ``response_format`` (None: free text); a bad or
        unsupported schema is a :class:`HelixUserError` (:mod:`helix.server.structured`)."""
        return guided_regex(self.response_format)

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def continuous_usage(self) -> bool:
        """vLLM's ``continuous_usage_stats``: usage in every chunk (only with ``include_usage``)."""
        return self.include_usage() and self.stream_options.continuous_usage_stats

    def logit_bias_pairs(self) -> tuple[tuple[int, float], ...]:
        """``logit_bias`` as (token id, bias) pairs; keys must spell token ids (OpenAI's format).
        The range is checked by :class:`SamplingParams`, the vocabulary by the coordinator."""
        pairs = []
        for key, bias in (self.logit_bias or {}).items():
            if not (key.isascii() and key.isdigit() and len(key) <= 18):
                raise HelixUserError(f"logit_bias keys must be token ids, got {key!r:.40}")
            pairs.append((int(key), bias))
        return tuple(pairs)

    def sampling(self, max_tokens: int | None, logprobs: int | None,
                 max_tokens_field: str = "max_tokens",
                 default_max_tokens: int | None = _DEFAULT_MAX_TOKENS) -> SamplingParams:
        self._check_supported()
        if max_tokens is not None and max_tokens <= 0:
            raise HelixUserError(f"{max_tokens_field} must be >= 1, got {max_tokens}")
        return SamplingParams(
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, min_p=self.min_p,
            seed=self.seed, presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty, repetition_penalty=self.repetition_penalty,
            stop_token_ids=tuple(self.stop_token_ids or ()),
            max_tokens=default_max_tokens if max_tokens is None else max_tokens,
            min_tokens=self.min_tokens, ignore_eos=self.ignore_eos, logprobs=logprobs,
            logit_bias=self.logit_bias_pairs())


class CompletionRequest(_Sampling):
    prompt: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]
    logprobs: StrictInt | None = None
    echo: StrictBool = False
    """Return the prompt before the completion (and, with ``logprobs``, its tokens' logprobs)."""
    suffix: str | None = None

    def echo_only(self) -> bool:
        """``echo`` with ``max_tokens: 0``: the prompt alone, nothing generated (vLLM runs one
        token and drops it; scoring harnesses ask this for prompt logprobs)."""
        return self.echo and self.max_tokens == 0

    def params(self) -> SamplingParams:
        if self.suffix:
            raise HelixUserError("suffix is not supported")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise HelixUserError(f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs}")
        params = self.sampling(1 if self.echo_only() else self.max_tokens, self.logprobs)
        if self.echo and self.logprobs is not None:   # vLLM: echo's prompt logprobs, same count
            params = dataclasses.replace(params, prompt_logprobs=self.logprobs)
        return params

    def prompts(self) -> list[str | list[int]]:
        """Every prompt of the request, in order: one string or id list, or a list of them (as
        LangChain's batches send, one choice each)."""
        p: Any = self.prompt
        many = p if isinstance(p, list) and p and isinstance(p[0], (str, list)) else [p]
        if any(isinstance(one, list) and not one for one in many):   # [] or [[1], []]
            raise HelixUserError("the prompt is empty")
        return many


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One message of a chat, as ``/v1/chat/completions`` and ``/tokenize`` take it. Only an
    assistant message may have null (or no) content (an assistant turn that only made tool calls),
    rendered as empty text; for any other role :func:`message_dicts` refuses it, as vLLM's request
    schema does."""

    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


def message_dicts(messages: list[ChatMessage]) -> list[dict]:
    """``{"role", "content"}`` of each message for the chat template; null content outside an
    assistant message is a :class:`HelixUserError` (HTTP 400)."""
    for i, m in enumerate(messages):
        if m.content is None and m.role != "assistant":
            raise HelixUserError(f"messages[{i}]: a {m.role} message needs 'content' (text or text "
                                 f"parts); only an assistant message may have null content")
    return [{"role": m.role, "content": m.text()} for m in messages]


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = None
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = None

    def params(self) -> SamplingParams:
        if self.top_logprobs is not None and not self.logprobs:
            raise HelixUserError("top_logprobs needs logprobs=true")
        if self.top_logprobs is not None and not 0 <= self.top_logprobs <= MAX_LOGPROBS:
            raise HelixUserError(f"top_logprobs must be in [0, {MAX_LOGPROBS}], got {self.top_logprobs}")
        n_logprobs = (self.top_logprobs or 0) if self.logprobs else None
        # An explicit None check: `or` would turn max_completion_tokens=0 into the default.
        # No limit: to the end of the context (None, resolved by the coordinator), as vLLM.
        if self.max_completion_tokens is None:
            return self.sampling(self.max_tokens, n_logprobs, default_max_tokens=None)
        return self.sampling(self.max_completion_tokens, n_logprobs, "max_completion_tokens")

    def message_dicts(self) -> list[dict]:
        return message_dicts(self.messages)
