"""Text in and out of the coordinator: the checkpoint's tokenizer, chat template and stop strings.

The tokenizer is ``tokenizer.json`` from the checkpoint folder, read with the ``tokenizers`` library;
``tokenizer_config.json`` gives the BOS/EOS tokens. The chat template (Jinja, rendered with
``messages``, ``add_generation_prompt``, ``bos_token`` and ``eos_token`` as in ``transformers``) is
the checkpoint's own or the one ``helix serve --chat-template`` gives
(:mod:`coordinator.chat_template`); without either, chat prompts are refused with a
:class:`HelixUserError` that names the flag.

:class:`Detokenizer` turns a growing list of output token ids into text deltas, holding back an
incomplete UTF-8 sequence and any tail that could still become a stop string, so a streamed reply
never shows text that the final reply cuts.

:meth:`TextCodec.token_bytes` gives a token's raw bytes (OpenAI's logprob ``bytes``): a byte-level
BPE token is mapped back through GPT-2's byte-to-character table, a sentencepiece token's ``<0xNN>``
is one byte and ``▁`` a space; otherwise the token's text in UTF-8. The raw bytes of a token that
holds part of a multi-byte character are that part, so a client that joins them gets the text.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from coordinator.chat_template import (DEFAULT_CHAT_TEMPLATE, ChatTemplate, checkpoint_chat_template,
                                       missing_template_message)
from helix.core.errors import HelixUserError
from helix.core.tokens import piece_bytes, tokenizer_kind

__all__ = ["DEFAULT_CHAT_TEMPLATE", "Detokenizer", "TextCodec"]


def _token_text(value) -> str | None:
    if isinstance(value, dict):   # {"content": "<s>", ...} in older tokenizer configs
        return value.get("content")
    return value


class TextCodec:
    """Tokenizer, special tokens and chat template of one checkpoint folder."""

    def __init__(self, ckpt_dir: str | Path, chat_template: ChatTemplate | None = None) -> None:
        """``chat_template``: one that replaces the checkpoint's (``--chat-template``)."""
        from tokenizers import Tokenizer
        path = Path(ckpt_dir)
        tok_file = path / "tokenizer.json"
        if not tok_file.is_file():
            raise HelixUserError(f"model {str(path)!r}: no tokenizer.json (the coordinator needs the "
                                 f"checkpoint's tokenizer)")
        self.tokenizer = Tokenizer.from_file(str(tok_file))
        # transformers turns these off for a plain call; left on, a tokenizer.json that stores them
        # would silently cut prompts (and pass the length checks on the cut prompt).
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        cfg_file = path / "tokenizer_config.json"
        cfg = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
        model_cfg_file = path / "config.json"
        model_cfg = json.loads(model_cfg_file.read_text()) if model_cfg_file.is_file() else {}
        self.bos_token = _token_text(cfg.get("bos_token"))
        self.eos_token = _token_text(cfg.get("eos_token"))
        self.eos_token_ids = self._eos_ids(model_cfg)
        self.ckpt_dir = path
        self.chat_template: ChatTemplate | None = chat_template or checkpoint_chat_template(path, cfg)
        """The template chat prompts are rendered with; None: chat requests are refused."""
        self.checkpoint_context_tokens = int(model_cfg.get("max_position_embeddings", 2048))
        """The model's own context (``max_position_embeddings``)."""
        self.max_context_tokens = self.checkpoint_context_tokens
        """Most prompt + output tokens served: the model's context or a smaller cap
        (:meth:`cap_context`, ``helix serve --max-model-len``)."""
        self.vocab_size = int(model_cfg.get("vocab_size") or self.tokenizer.get_vocab_size())

    @functools.cached_property
    def kind(self) -> str:
        """:func:`tokenizer_kind` of this checkpoint's tokenizer."""
        return tokenizer_kind(json.loads(self.tokenizer.to_str()))

    @functools.lru_cache(maxsize=65536)
    def token_bytes(self, token_id: int) -> bytes | None:
        """The raw bytes token ``token_id`` stands for (see the module doc); an added (special)
        token is its text in UTF-8; None for an id the tokenizer does not have (a model's vocabulary
        can be larger than its tokenizer's)."""
        piece = self.tokenizer.id_to_token(token_id)
        if piece is None:
            return None
        if token_id in self._added_ids:
            return piece.encode()
        return piece_bytes(piece, self.kind)

    @functools.cached_property
    def _added_ids(self) -> frozenset[int]:
        return frozenset(self.tokenizer.get_added_tokens_decoder())

    def cap_context(self, max_model_len: int) -> None:
        """Serve at most ``max_model_len`` tokens of context (vLLM's ``--max-model-len``); more than
        the checkpoint's own context is a user error."""
        if not 1 <= max_model_len <= self.checkpoint_context_tokens:
            raise HelixUserError(f"--max-model-len {max_model_len} must be in [1, "
                                 f"{self.checkpoint_context_tokens}] (the checkpoint's "
                                 f"max_position_embeddings)")
        self.max_context_tokens = max_model_len
        self.__dict__.pop("max_text_bytes", None)   # cached from the old context

    def _eos_ids(self, model_cfg: dict) -> tuple[int, ...]:
        eos = model_cfg.get("eos_token_id")
        ids = eos if isinstance(eos, list) else ([eos] if eos is not None else [])
        if not ids and self.eos_token:
            tid = self.tokenizer.token_to_id(self.eos_token)
            ids = [tid] if tid is not None else []
        return tuple(int(i) for i in ids)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids exactly as ``AutoTokenizer.from_pretrained(ckpt)(text)`` gives them: the
        tokenizer's own post-processor decides the special tokens (Llama-2 and Llama-3 add BOS
        there; a byte-level BPE with a ``bos_token`` but no post-processor adds none). Like
        ``transformers`` 5 and vLLM, ``add_bos_token`` in ``tokenizer_config.json`` is not applied
        on top: the tokenizer file already says what the model was trained with."""
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    @functools.cached_property
    def max_text_bytes(self) -> int:
        """Most UTF-8 bytes of text that can still fit the model's context once tokenized: a token
        spells at most its longest vocabulary entry, each character of which stands for at most 4
        bytes (one byte for byte-level BPE, ``▁`` for a space, ``<0xE4>``-style byte fallbacks for
        one). Text past this is refused before it is tokenized, so a huge prompt costs no tokenizer
        time; the token count is checked after tokenizing as before. (A normalizer that deletes
        characters could in principle fit more; none of the LLaMA-family tokenizers does.)"""
        longest = max((len(t) for t in self.tokenizer.get_vocab(with_added_tokens=True)), default=1)
        return max(64 * 1024, self.max_context_tokens * max(1, longest) * 4)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def chat_template_line(self) -> str:
        """Which chat template is served, for the start log."""
        if self.chat_template is None:
            return ("none: chat requests get HTTP 400 (the checkpoint has none; pass "
                    "--chat-template FILE|STRING)")
        return self.chat_template.source

    def render_chat(self, messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
        """The prompt text for ``messages`` (each ``{"role", "content"}``), with an open assistant
        turn unless ``add_generation_prompt`` is false."""
        if self.chat_template is None:
            raise HelixUserError(missing_template_message(self.ckpt_dir))
        return self.chat_template.render(messages, add_generation_prompt,
                                         {"bos_token": self.bos_token or "",
                                          "eos_token": self.eos_token or ""})

    @property
    def chat_special_tokens(self) -> bool:
        """Whether a rendered chat prompt gets the post-processor's special tokens
        (:attr:`ChatTemplate.add_special_tokens`)."""
        return self.chat_template is not None and self.chat_template.add_special_tokens

    def encode_chat(self, messages: Sequence[dict]) -> list[int]:
        """The chat prompt's ids. With the model's template, as ``apply_chat_template(...,
        tokenize=True)`` and vLLM's chat API: the rendered text without special tokens (a template
        writes BOS itself where the model wants it). With :data:`DEFAULT_CHAT_TEMPLATE` (plain text,
        no BOS of its own) the post-processor decides, as for a completion."""
        return self.encode(self.render_chat(messages), add_special_tokens=self.chat_special_tokens)


@dataclass
class Detokenizer:
    """Incremental text of one request's output tokens, with stop strings applied."""

    codec: TextCodec
    stop: tuple[str, ...] = ()
    token_ids: list[int] | None = None
    sent_chars: int = 0
    stopped: bool = False
    stop_string: str | None = None
    """The stop string that ended the text (the first to appear; None: none did)."""

    def __post_init__(self) -> None:
        self.token_ids = []
        self.text = ""

    def add(self, token_id: int, final: bool) -> str:
        """Append a token; the new text to show. Sets ``stopped`` when a stop string appeared (the text
        is then cut before it, and the caller finishes the request)."""
        self.token_ids.append(token_id)
        text = self.codec.decode(self.token_ids)
        found = [(i, k) for k, i in enumerate(text.find(s) if s else -1 for s in self.stop) if i >= 0]
        if found:
            cut, k = min(found)
            text, self.stopped, final = text[:cut], True, True
            self.stop_string = self.stop[k]
        self.text = text
        visible = len(text) if final else self._safe_len(text)
        delta = text[self.sent_chars:visible] if visible > self.sent_chars else ""
        self.sent_chars = max(self.sent_chars, visible)
        return delta

    def _safe_len(self, text: str) -> int:
        n = len(text)
        if text.endswith("\ufffd"):   # an incomplete UTF-8 sequence: wait for the next token
            n -= 1
        hold = 0
        for s in self.stop:   # a tail that may still grow into a stop string stays hidden
            for k in range(min(len(s) - 1, n), 0, -1):
                if text[n - k:n] == s[:k]:
                    hold = max(hold, k)
                    break
        return n - hold
