"""Token sampling with vLLM's ``SamplingParams`` names and semantics.

Order of operations (as vLLM's sampler): ``logit_bias`` added to the raw logits, then penalties
(repetition over prompt + output tokens, presence / frequency over output tokens), EOS / stop tokens
masked while fewer than ``min_tokens`` were produced, then temperature (below 1e-5 = greedy argmax),
min_p, top_k, top_p, and a draw.
A request with a ``seed`` draws from its own generator, so its tokens do not depend on its neighbours in
the batch. Logprobs are those of the raw model distribution (``log_softmax`` of the logits before any
processing), like vLLM's default ``raw_logprobs``. A structured-output request (``guided_regex``)
keeps only the tokens its automaton allows (``worker.guided``), after the penalties and the
``min_tokens`` ban.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from helix.net.sampling import SampledToken, SamplingParams
from worker.guided import Guide


@dataclass
class SamplingState:
    """What the sampler needs to know about one request across steps."""

    params: SamplingParams
    prompt_token_ids: tuple[int, ...] = ()
    output_token_ids: list[int] = field(default_factory=list)
    generator: torch.Generator | None = None
    guide: Guide | None = None
    """Structured output: the request's token automaton (only its allowed tokens are sampled)."""


class Sampler:
    """Samples one token per row of a ``[num_rows, vocab]`` logits matrix."""

    def __init__(self, eos_token_ids: Sequence[int] = (), device: torch.device | str = "cpu",
                 seed: int = 0) -> None:
        self.eos_token_ids = tuple(eos_token_ids)
        self.device = torch.device(device)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)

    def new_state(self, params: SamplingParams, prompt_token_ids: Sequence[int] = ()) -> SamplingState:
        gen = None
        if params.seed is not None:
            gen = torch.Generator(device=self.device).manual_seed(params.seed)
        return SamplingState(params, tuple(prompt_token_ids), [], gen)

    def sample(self, logits: torch.Tensor, states: Sequence[SamplingState]) -> list[SampledToken]:
        """One token per row; appends nothing to the states (the caller decides what is kept)."""
        if all(_plain_greedy(st) for st in states):   # the common serving case: one argmax
            return [SampledToken(t, float("nan")) for t in logits.argmax(dim=-1).tolist()]
        logits = logits.float()
        raw_logprobs = torch.log_softmax(logits, dim=-1) if any(
            s.params.logprobs is not None for s in states) else None
        logits = self._penalize(logits.clone(), states)
        logits = _constrained(logits, states)
        out = []
        greedy_ids = logits.argmax(dim=-1).tolist()
        for row, st in enumerate(states):
            p = st.params
            tok = greedy_ids[row] if p.greedy else self._draw(logits[row], st)
            out.append(self._with_logprobs(tok, row, p, raw_logprobs))
        return out

    def _penalize(self, logits: torch.Tensor, states: Sequence[SamplingState]) -> torch.Tensor:
        vocab = logits.shape[-1]
        for row, st in enumerate(states):
            p = st.params
            if p.logit_bias:   # before the penalties, as vLLM's logits processors
                ids, bias = zip(*p.logit_bias)
                logits[row, torch.tensor(ids, dtype=torch.long, device=logits.device)] += \
                    torch.tensor(bias, dtype=logits.dtype, device=logits.device)
            if p.repetition_penalty != 1.0:
                seen = torch.tensor(sorted({*st.prompt_token_ids, *st.output_token_ids}),
                                    dtype=torch.long, device=logits.device)
                if seen.numel():
                    vals = logits[row, seen]
                    logits[row, seen] = torch.where(vals > 0, vals / p.repetition_penalty,
                                                    vals * p.repetition_penalty)
            if (p.presence_penalty or p.frequency_penalty) and st.output_token_ids:
                counts = torch.bincount(torch.tensor(st.output_token_ids, device=logits.device),
                                        minlength=vocab)[:vocab].float()
                logits[row] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0)
            if len(st.output_token_ids) < p.min_tokens:
                # An id past the vocabulary can never be sampled, so it needs no mask (and would
                # not index one); the engine refuses such requests at admission anyway.
                banned = [t for t in (*p.stop_token_ids, *(() if p.ignore_eos else self.eos_token_ids))
                          if t < vocab]
                if banned:
                    logits[row, torch.tensor(banned, dtype=torch.long)] = float("-inf")
        return logits

    def _draw(self, logits: torch.Tensor, st: SamplingState) -> int:
        probs = processed_probs(logits, st.params)
        # Exponential race (as vLLM): argmax(p / Exp(1)) is a draw from p, one generator per request.
        q = torch.empty_like(probs).exponential_(generator=st.generator or self.generator)
        return int((probs / q).argmax())

    @staticmethod
    def _with_logprobs(tok: int, row: int, p: SamplingParams,
                       raw: torch.Tensor | None) -> SampledToken:
        if raw is None or p.logprobs is None:
            return SampledToken(tok, float("nan"))
        top = ()
        if p.logprobs:
            vals, ids = raw[row].topk(min(p.logprobs, raw.shape[-1]))
            top = tuple(zip(ids.tolist(), vals.tolist()))
        return SampledToken(tok, float(raw[row, tok]), top)


def _plain_greedy(st: SamplingState) -> bool:
    """Greedy, without logprobs, and nothing that would change the row's logits (no bias, no
    penalties, no ``min_tokens`` ban left, no automaton): its token is the row's argmax."""
    p = st.params
    return (p.greedy and p.logprobs is None and not p.logit_bias and p.repetition_penalty == 1.0
            and not p.presence_penalty and not p.frequency_penalty and st.guide is None
            and len(st.output_token_ids) >= p.min_tokens)


def processed_probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Probabilities of one row ([vocab]) after temperature, min_p, top_k and top_p, in vLLM's order;
    each filter sees the distribution renormalised after the previous one (temperature > 0)."""
    probs = torch.softmax(logits / p.temperature, dim=-1)
    if p.min_p > 0:
        probs = _renormalized(probs, probs >= p.min_p * probs.max())
    if p.top_k > 0:
        kth = probs.topk(min(p.top_k, probs.numel())).values[-1]
        probs = _renormalized(probs, probs >= kth)
    if p.top_p < 1:
        # Drop the low tail whose cumulative mass stays within 1 - top_p (always keep the top token).
        sorted_probs, order = probs.sort()
        tail = sorted_probs.cumsum(0) <= 1 - p.top_p
        tail[-1] = False
        drop = torch.zeros_like(tail)
        drop[order] = tail
        probs = _renormalized(probs, ~drop)
    return probs


def _renormalized(probs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    probs = torch.where(keep, probs, torch.zeros_like(probs))
    return probs / probs.sum()


def _constrained(logits: torch.Tensor, states: Sequence[SamplingState]) -> torch.Tensor:
    """Rows of guided requests keep only the tokens their automaton allows (after the penalties and
    the ``min_tokens`` ban: should those leave none of the allowed tokens, the automaton wins and
    its tokens are drawn alike). One masked fill over all guided rows."""
    rows = [row for row, st in enumerate(states) if st.guide is not None]
    if not rows:
        return logits
    banned = torch.stack([states[row].guide.banned() for row in rows])   # [guided rows, vocab]
    index = torch.tensor(rows, dtype=torch.long, device=logits.device)
    masked = logits.index_select(0, index).masked_fill_(banned, float("-inf"))
    dead = ~torch.isfinite(masked).any(dim=-1)
    if dead.any():
        masked[dead] = torch.zeros_like(masked[dead]).masked_fill_(banned[dead], float("-inf"))
    logits.index_copy_(0, index, masked)
    return logits
