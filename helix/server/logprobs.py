"""OpenAI ``logprobs`` objects built from the sampled tokens of one request.

The same builder serves the whole reply (non-streaming) and each streamed chunk in turn: it keeps the
running ``text_offset``, so the chunks' lists, concatenated, equal the non-streamed object.
``text_offset`` is the sum of the decoded lengths of the tokens before each one (as vLLM computes it);
it can run past the reply's text when a stop string cut the last tokens' text. Completions'
``top_logprobs`` maps token text to logprob (OpenAI's format), so tokens with the same text collapse
into one entry; ``return_tokens_as_token_ids`` keeps them apart. Chat entries carry each token's raw
``bytes`` (:meth:`~coordinator.textcodec.TextCodec.token_bytes`: a token holding part of a multi-byte
character carries that part, so a client joining them gets the text); the completions format has no
``bytes`` field, in OpenAI's API as in vLLM's.
"""

from __future__ import annotations

from collections.abc import Sequence

from coordinator.textcodec import TextCodec
from helix.net.sampling import SampledToken


class LogprobsBuilder:
    """Completions- or chat-format logprobs for successive runs of tokens of one request."""

    def __init__(self, codec: TextCodec, as_token_ids: bool) -> None:
        self.codec = codec
        self.as_token_ids = as_token_ids
        """vLLM's ``return_tokens_as_token_ids``: name tokens ``token_id:<id>`` instead of their text."""
        self.text_offset = 0
        """Decoded characters of the tokens already formatted."""

    def _name(self, token_id: int) -> str:
        return f"token_id:{token_id}" if self.as_token_ids else self.codec.decode([token_id])

    def completion(self, tokens: Sequence[SampledToken]) -> dict:
        """``{tokens, token_logprobs, top_logprobs, text_offset}`` of ``/v1/completions``."""
        offsets = []
        for t in tokens:
            offsets.append(self.text_offset)
            self.text_offset += len(self.codec.decode([t.token_id]))
        return {"tokens": [self._name(t.token_id) for t in tokens],
                "token_logprobs": [t.logprob for t in tokens],
                "top_logprobs": [{self._name(i): lp for i, lp in t.top_logprobs} for t in tokens],
                "text_offset": offsets}

    def prompt(self, token_ids: Sequence[int], scored: Sequence[SampledToken]) -> dict:
        """Completions-format logprobs of an echoed prompt: ``scored[i]`` is token ``i + 1``'s
        (``SamplingParams.prompt_logprobs``); the first token has none (``null`` logprob and top)."""
        offsets = []
        for t in token_ids:
            offsets.append(self.text_offset)
            self.text_offset += len(self.codec.decode([t]))
        entries = [None, *scored][:len(token_ids)]
        entries += [None] * (len(token_ids) - len(entries))
        return {"tokens": [self._name(t) for t in token_ids],
                "token_logprobs": [e and e.logprob for e in entries],
                "top_logprobs": [e and {self._name(i): lp for i, lp in e.top_logprobs}
                                 for e in entries],
                "text_offset": offsets}

    def _entry(self, token_id: int, logprob: float) -> dict:
        raw = self.codec.token_bytes(token_id)   # None: an id the tokenizer lacks (OpenAI's null)
        return {"token": self._name(token_id), "logprob": logprob,
                "bytes": None if raw is None else list(raw)}

    def chat(self, tokens: Sequence[SampledToken]) -> dict:
        """``{content: [{token, logprob, bytes, top_logprobs}]}`` of ``/v1/chat/completions``."""
        return {"content": [{**self._entry(t.token_id, t.logprob),
                             "top_logprobs": [self._entry(i, lp) for i, lp in t.top_logprobs]}
                            for t in tokens]}


def joined(first: dict | None, second: dict) -> dict:
    """Two completions-format logprobs objects, one after the other (``first`` may be None)."""
    if first is None:
        return second
    return {k: first[k] + second[k] for k in second}
