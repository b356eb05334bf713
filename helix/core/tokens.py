"""What a token of a checkpoint's tokenizer stands for, as raw bytes.

A byte-level BPE token (GPT-2, Llama-3) is mapped back through GPT-2's byte-to-character table; a
sentencepiece token's ``<0xNN>`` is one byte and ``▁`` a space; any other tokenizer's token is its
text in UTF-8. The coordinator uses it for logprob ``bytes``, the last stage for the token automaton
of structured output (both read the same ``tokenizer.json``).
"""

from __future__ import annotations

import functools


@functools.cache
def byte_of_char() -> dict[str, int]:
    """The inverse of GPT-2's ``bytes_to_unicode``: printable Latin-1 bytes stand for themselves,
    the other bytes (controls, space, 0x7F-0xA0, 0xAD) for U+0100 onwards, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    table = {chr(b): b for b in printable}
    others = [b for b in range(256) if b not in set(printable)]
    table.update({chr(256 + i): b for i, b in enumerate(others)})
    return table


def _components(node) -> list[dict]:
    """A decoder or pre-tokenizer JSON node and, for a ``Sequence``, its parts."""
    if not isinstance(node, dict):
        return []
    parts = node.get("decoders") or node.get("pretokenizers") or []
    return [node, *(p for part in parts for p in _components(part))]


def tokenizer_kind(tokenizer_json: dict) -> str:
    """``byte_level`` (GPT-2/Llama-3 style), ``sentencepiece`` (``▁`` spaces, ``<0xNN>`` byte
    fallback) or ``text``, from the tokenizer's decoder and pre-tokenizer."""
    types = {c.get("type") for key in ("decoder", "pre_tokenizer")
             for c in _components(tokenizer_json.get(key))}
    if "ByteLevel" in types:
        return "byte_level"
    model = tokenizer_json.get("model") or {}
    if types & {"Metaspace", "ByteFallback"} or model.get("byte_fallback"):
        return "sentencepiece"
    return "text"


def piece_bytes(piece: str, kind: str) -> bytes:
    """The raw bytes of a (non-added) vocabulary piece of a tokenizer of ``kind``
    (:func:`tokenizer_kind`)."""
    if kind == "byte_level":
        table = byte_of_char()
        if all(c in table for c in piece):
            return bytes(table[c] for c in piece)
        return piece.encode()
    if kind == "sentencepiece":
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            try:
                return bytes([int(piece[3:5], 16)])
            except ValueError:
                pass
        return piece.replace("\u2581", " ").encode()
    return piece.encode()
