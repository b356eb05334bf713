"""Sampling parameters and sampled tokens: what a request asks of the sampler and what it gets back.

Both sides of the wire use them: the coordinator and the servers build :class:`SamplingParams` from
untrusted input (validated here, once), the worker's sampler (``worker.sampling``) honours them and
returns :class:`SampledToken`. Names and defaults are vLLM's ``SamplingParams``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from helix.core.errors import HelixUserError


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings (names and defaults of ``vllm.SamplingParams``)."""

    temperature: float = 1.0
    """0 (or anything below :data:`SAMPLING_EPS`) means greedy."""
    top_p: float = 1.0
    top_k: int = 0
    """0 or -1 = off."""
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    max_tokens: int | None = 16
    """None: to the end of the context (the coordinator resolves it before a request runs: what a
    stage receives is always a number)."""
    min_tokens: int = 0
    ignore_eos: bool = False
    logprobs: int | None = None
    """Top-n logprobs to return per token (plus the sampled token's)."""
    logit_bias: tuple[tuple[int, float], ...] = ()
    """(token id, bias) pairs added to the logits before sampling (OpenAI's ``logit_bias``; bias in
    [-100, 100], ids checked against the vocabulary by the coordinator and the last stage)."""
    prompt_logprobs: int | None = None
    """vLLM's ``prompt_logprobs``: the logprob of every prompt token after the first (and the top-n),
    computed by the last stage only when set (it keeps the logits of every prompt position)."""
    guided_regex: str | None = None
    """Structured output: the reply must match this regex (built from a JSON schema by the server);
    the last stage masks every token that would leave it (``worker.guided``). None = free text."""
    guided_resume_tokens: int = 0
    """How many of the last prompt tokens were already generated under ``guided_regex`` (a request
    moved to another pipeline after a failure): the last stage walks the automaton through them."""

    def __post_init__(self) -> None:
        # Every caller (HTTP schemas, the gRPC API, the wire decoder) builds these from untrusted
        # values, so types and int64 ranges are checked here, once: a bool is no count, and an int
        # past int64 would fail later in MessagePack or torch.Generator, far from the request.
        stop = self.stop_token_ids
        if isinstance(stop, (str, bytes)) or not hasattr(stop, "__iter__"):
            raise HelixUserError(f"sampling params: stop_token_ids must be a list of token ids, "
                                 f"got {stop!r}")
        stop = tuple(stop)
        object.__setattr__(self, "stop_token_ids", stop)
        object.__setattr__(self, "logit_bias", _bias_pairs(self.logit_bias))
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if not (value is None and name in _OPTIONAL_FIELDS or _is_int64(value)):
                raise HelixUserError(f"sampling params: {name} must be an integer in [-2**63, 2**63)"
                                     f"{' or null' if name in _OPTIONAL_FIELDS else ''}, got {value!r}")
        for name in _REAL_FIELDS:
            value = getattr(self, name)
            if not _is_finite_real(value):
                raise HelixUserError(f"sampling params: {name} must be a finite number, got {value!r}")
        if not isinstance(self.ignore_eos, bool):
            raise HelixUserError(f"sampling params: ignore_eos must be true or false, "
                                 f"got {self.ignore_eos!r}")
        bad = [t for t in stop if not (_is_int64(t) and t >= 0)]
        if bad:
            raise HelixUserError(f"sampling params: stop_token_ids must be token ids (integers in "
                                 f"[0, 2**63)), got {bad[:5]!r}")
        checks = [(self.temperature >= 0, "temperature", "must be >= 0"),
                  (0 < self.top_p <= 1, "top_p", "must be in (0, 1]"),
                  (self.top_k >= -1, "top_k", "must be -1, 0 or positive"),
                  (0 <= self.min_p <= 1, "min_p", "must be in [0, 1]"),
                  (self.repetition_penalty > 0, "repetition_penalty", "must be > 0"),
                  (-2 <= self.presence_penalty <= 2, "presence_penalty", "must be in [-2, 2]"),
                  (-2 <= self.frequency_penalty <= 2, "frequency_penalty", "must be in [-2, 2]"),
                  (self.max_tokens is None or self.max_tokens >= 1, "max_tokens", "must be >= 1"),
                  (0 <= self.min_tokens <= (self.max_tokens or INT64_MAX), "min_tokens",
                   "must be in [0, max_tokens]"),
                  (self.logprobs is None or self.logprobs >= 0, "logprobs", "must be >= 0"),
                  (self.prompt_logprobs is None or self.prompt_logprobs >= 0, "prompt_logprobs",
                   "must be >= 0")]
        for ok, name, msg in checks:
            if not ok:
                raise HelixUserError(f"sampling params: {name} {msg}, got {getattr(self, name)!r}")
        _check_guided(self.guided_regex, self.guided_resume_tokens)

    @property
    def greedy(self) -> bool:
        """Temperatures below :data:`SAMPLING_EPS` are greedy: ``logits / 1e-45`` overflows to inf
        and the softmax of that is NaN."""
        return self.temperature < SAMPLING_EPS


SAMPLING_EPS = 1e-5
"""Temperatures below this sample greedily (vLLM's ``_SAMPLING_EPS``)."""

MAX_LOGPROBS = 20
"""Most top logprobs a served request may ask for (vLLM's default ``max_logprobs``); the server's
checks use it, the engine itself serves any count up to the vocabulary."""

_INT_FIELDS = ("top_k", "seed", "max_tokens", "min_tokens", "logprobs", "prompt_logprobs")
_OPTIONAL_FIELDS = ("seed", "logprobs", "max_tokens", "prompt_logprobs")
_REAL_FIELDS = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                "repetition_penalty")
INT64_MIN, INT64_MAX = -2**63, 2**63 - 1


def _is_int64(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and INT64_MIN <= value <= INT64_MAX


def _is_finite_real(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


MAX_LOGIT_BIAS = 100.0
"""OpenAI's bound on a ``logit_bias`` value (either sign)."""


def _bias_pairs(bias) -> tuple[tuple[int, float], ...]:
    """``logit_bias`` as sorted (token id, bias) pairs: from pairs (the wire sends lists) or a
    mapping; ids are non-negative int64, biases finite and within +-:data:`MAX_LOGIT_BIAS`."""
    items = bias.items() if isinstance(bias, dict) else bias
    try:
        pairs = [(tid, b) for tid, b in items]
    except (TypeError, ValueError):
        raise HelixUserError(f"sampling params: logit_bias must map token ids to numbers, "
                             f"got {bias!r:.80}") from None
    for tid, b in pairs:
        if not (_is_int64(tid) and tid >= 0):
            raise HelixUserError(f"sampling params: logit_bias keys must be token ids, got {tid!r:.40}")
        if not (_is_finite_real(b) and -MAX_LOGIT_BIAS <= b <= MAX_LOGIT_BIAS):
            raise HelixUserError(f"sampling params: logit_bias[{tid}] must be in "
                                 f"[-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}], got {b!r:.40}")
    return tuple(sorted((int(t), float(b)) for t, b in dict(pairs).items()))


@dataclass(frozen=True)
class SampledToken:
    token_id: int
    logprob: float
    top_logprobs: tuple[tuple[int, float], ...] = ()


def _check_guided(regex, resume_tokens) -> None:
    if regex is not None and not isinstance(regex, str):
        raise HelixUserError(f"sampling params: guided_regex must be a string or null, got {regex!r:.40}")
    if not (_is_int64(resume_tokens) and resume_tokens >= 0):
        raise HelixUserError(f"sampling params: guided_resume_tokens must be an integer >= 0, "
                             f"got {resume_tokens!r:.40}")
