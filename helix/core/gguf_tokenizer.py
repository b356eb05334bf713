"""A ``tokenizers`` tokenizer from a GGUF file's metadata, built as ``transformers`` builds it.

A GGUF stores the vocabulary (``tokenizer.ggml.tokens``), the merges or the sentencepiece scores,
each token's type and the special token ids. ``tokenizer.ggml.model`` says which tokenizer they
describe:

- ``gpt2``: byte-level BPE (SmolLM2, LLaMA-3). Tokens are spelled in GPT-2's byte alphabet; one
  that is not is re-spelled through it. ``tokenizer.ggml.pre`` picks the split regex for the
  vocabularies ``transformers`` knows (LLaMA-3's, Mistral's Tekken); any other keeps GPT-2's.
- ``llama``: sentencepiece BPE with byte fallback (LLaMA-2, Mistral-7B, TinyLlama). Files carry
  scores, not merges: the merges are recovered from the scores as ``transformers``'
  ``generate_merges`` does (every split of a token into two vocabulary pieces, best score first).

Tokens typed control (3) become special added tokens (in a byte-level vocabulary only those spelled
in its alphabet: others are llama.cpp mislabels), user-defined ones (4) plain added tokens; BOS/EOS
are added by the post-processor per ``tokenizer.ggml.add_bos_token`` / ``add_eos_token`` (a
sentencepiece file that does not say adds BOS, as llama.cpp does).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from helix.core.errors import SpecError
from helix.core.tokens import byte_of_char


class GGUFFields(Protocol):
    """What the tokenizer reads of a GGUF file (:class:`helix.core.gguf.GGUFFile` is one)."""

    path: Path

    def field(self, key: str, default: Any = None) -> Any: ...

_CONTROL, _USER_DEFINED = 3, 4

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
#: ``tokenizer.ggml.pre`` -> split regex, for the LLaMA-family entries of ``transformers``' table.
PRE_TOKENIZER_SPLITS = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral", "dbrx", "smaug-bpe"),
                    _LLAMA3_SPLIT),
    "tekken": _TEKKEN_SPLIT,
}


def _field_list(g: GGUFFields, key: str) -> list:
    value = g.field(key)
    return list(value) if value is not None else []


def build_tokenizer(g: GGUFFields):
    """The ``tokenizers.Tokenizer`` the file describes (see the module doc)."""
    kind = g.field("tokenizer.ggml.model")
    tokens = _field_list(g, "tokenizer.ggml.tokens")
    if not tokens:
        raise SpecError(f"model {str(g.path)!r}: the GGUF has no tokenizer (tokenizer.ggml.tokens)")
    if kind == "gpt2":
        tok = _byte_level(g, tokens)
    elif kind == "llama":
        tok = _sentencepiece(g, tokens)
    else:
        raise SpecError(f"model {str(g.path)!r}: unsupported GGUF tokenizer {kind!r}; "
                        f"supported: gpt2 (byte-level BPE), llama (sentencepiece BPE)")
    _add_special_tokens(g, tok, tokens, byte_level=kind == "gpt2")
    tok.post_processor = _post_processor(g, tokens)
    return tok


def _byte_level(g: GGUFFields, tokens: list[str]):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    alphabet = byte_of_char()
    char_of = {b: c for c, b in alphabet.items()}
    vocab = {t if set(t) <= alphabet.keys() else "".join(char_of[b] for b in t.encode()): i
             for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ")) for m in _field_list(g, "tokenizer.ggml.merges")]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="",
                               end_of_word_suffix="", fuse_unk=False, byte_fallback=False))
    split = PRE_TOKENIZER_SPLITS.get(g.field("tokenizer.ggml.pre"))
    if split is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True,
                                                     use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    return tok


def _sentencepiece(g: GGUFFields, tokens: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ")) for m in _field_list(g, "tokenizer.ggml.merges")]
    if not merges:
        merges = merges_from_scores(tokens, _field_list(g, "tokenizer.ggml.scores"))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=True, byte_fallback=True,
                               dropout=None))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(content=" ", left=1, right=0)])
    return tok


def merges_from_scores(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """Sentencepiece merges recovered from the vocabulary: each way of cutting a token into two
    vocabulary pieces, ordered by the token's score (best first), then by the pieces' lengths."""
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(scores) != len(tokens):
        raise SpecError(f"GGUF tokenizer: {len(scores)} scores for {len(tokens)} tokens")
    found = []
    for token, score in dict(zip(tokens, scores)).items():
        local = [(token[:k], token[k:], score) for k in range(1, len(token))
                 if token[:k] in vocab and token[k:] in vocab]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        found.extend(local)
    found.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in found]


def _add_special_tokens(g: GGUFFields, tok, tokens: list[str], byte_level: bool) -> None:
    from tokenizers import AddedToken
    types = _field_list(g, "tokenizer.ggml.token_type")
    alphabet = byte_of_char().keys()
    special_ids = {i for i, t in enumerate(types)
                   if t == _CONTROL and (not byte_level or set(tokens[i]) <= alphabet)}
    # The named special tokens are special whatever their type (sentencepiece's <unk> is "unknown").
    special_ids |= {i for i in _special_token_ids(g).values() if 0 <= i < len(tokens)}
    if special_ids:
        tok.add_special_tokens([AddedToken(tokens[i], normalized=False, special=True)
                                for i in sorted(special_ids)])
    vocab = tok.get_vocab(with_added_tokens=False)
    user = [tokens[i] for i, t in enumerate(types) if t == _USER_DEFINED and tokens[i] in vocab]
    if user:
        tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])


def _special_token_ids(g: GGUFFields) -> dict[str, int]:
    names = {"bos_token": "bos", "eos_token": "eos", "unk_token": "unknown", "pad_token": "padding"}
    ids = {name: g.field(f"tokenizer.ggml.{key}_token_id") for name, key in names.items()}
    return {name: int(i) for name, i in ids.items() if i is not None}


def _adds(g: GGUFFields) -> tuple[bool, bool]:
    """(add BOS, add EOS) per the file; a sentencepiece file that does not say adds BOS."""
    bos_default = g.field("tokenizer.ggml.model") == "llama"
    return (bool(g.field("tokenizer.ggml.add_bos_token", bos_default)),
            bool(g.field("tokenizer.ggml.add_eos_token", False)))


def _post_processor(g: GGUFFields, tokens: list[str]):
    from tokenizers import processors
    ids = _special_token_ids(g)
    add_bos, add_eos = _adds(g)
    bos = (tokens[ids["bos_token"]], ids["bos_token"]) if add_bos and "bos_token" in ids else None
    eos = (tokens[ids["eos_token"]], ids["eos_token"]) if add_eos and "eos_token" in ids else None
    single = " ".join([*([f"{bos[0]}:0"] if bos else []), "$A:0", *([f"{eos[0]}:0"] if eos else [])])
    pair = " ".join([single, *([f"{bos[0]}:1"] if bos else []), "$B:1",
                     *([f"{eos[0]}:1"] if eos else [])])
    return processors.TemplateProcessing(single=single, pair=pair,
                                         special_tokens=[t for t in (bos, eos) if t])


def tokenizer_config(g: GGUFFields) -> dict[str, Any]:
    """``tokenizer_config.json``: the special tokens' text, whether BOS/EOS are added, and the chat
    template (``tokenizer.chat_template``) when the file has one."""
    tokens = _field_list(g, "tokenizer.ggml.tokens")
    cfg: dict[str, Any] = {name: tokens[i] for name, i in _special_token_ids(g).items()
                           if 0 <= i < len(tokens)}
    cfg["add_bos_token"], cfg["add_eos_token"] = _adds(g)
    template = g.field("tokenizer.chat_template")
    if template:
        cfg["chat_template"] = template
    return cfg
