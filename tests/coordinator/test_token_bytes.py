"""``TextCodec.token_bytes``: each token's raw bytes, so the bytes of a text's tokens, joined, are the
text's UTF-8 (multi-byte characters split over tokens included), for a byte-level BPE tokenizer (the
demo's) and a sentencepiece-style one (``▁`` spaces, ``<0xNN>`` byte fallback)."""

from __future__ import annotations

import pytest

from coordinator.textcodec import TextCodec, tokenizer_kind

TEXTS = ["hello world", "héllo — 日本語 😀 naïve", "<s> tabs\tand\nlines", "ÿ\x7f\x00 ¡¬®"]


def _codec(tmp_path, tok) -> TextCodec:
    tok.save(str(tmp_path / "tokenizer.json"))
    return TextCodec(tmp_path)


@pytest.mark.parametrize("text", TEXTS)
def test_byte_level_bytes_join_to_the_text(tmp_path, text):
    from helix.commands.demo_checkpoint import build_tokenizer
    codec = _codec(tmp_path, build_tokenizer())
    assert codec.kind == "byte_level"
    ids = codec.encode(text)
    assert b"".join(codec.token_bytes(i) for i in ids) == text.encode()


def test_byte_level_splits_a_character_into_its_raw_bytes(tmp_path):
    from helix.commands.demo_checkpoint import build_tokenizer
    codec = _codec(tmp_path, build_tokenizer())
    parts = [codec.token_bytes(i) for i in codec.encode("😀")]
    assert len(parts) > 1 and b"".join(parts) == "😀".encode()   # decode() of each part is U+FFFD


def _sentencepiece():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    vocab = {"<unk>": 0, **{f"<0x{b:02X}>": 1 + b for b in range(256)}, "\u2581": 257}
    vocab |= {c: len(vocab) + k for k, c in enumerate("abcdefghijklmnopqrstuvwxyz")}
    vocab["\u2581h"] = len(vocab)
    vocab["\u2581he"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab, [("\u2581", "h"), ("\u2581h", "e")], unk_token="<unk>",
                               byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    return tok


@pytest.mark.parametrize("text", ["hello world", "héllo 日本 😀"])
def test_sentencepiece_bytes_join_to_the_text(tmp_path, text):
    codec = _codec(tmp_path, _sentencepiece())
    assert codec.kind == "sentencepiece"
    ids = codec.encode(text)
    assert "<0xC3>" in [codec.tokenizer.id_to_token(i) for i in ids] or text.isascii()
    # Metaspace prepends ▁ to the first word: one leading space, as the token itself says.
    assert b"".join(codec.token_bytes(i) for i in ids) == b" " + text.encode()


def test_kind_from_the_tokenizer_json():
    assert tokenizer_kind({"decoder": {"type": "Sequence", "decoders": [{"type": "ByteLevel"}]}}) \
        == "byte_level"
    assert tokenizer_kind({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split"}, {"type": "ByteLevel"}]}}) == "byte_level"
    assert tokenizer_kind({"decoder": {"type": "Metaspace"}}) == "sentencepiece"
    assert tokenizer_kind({"model": {"type": "BPE", "byte_fallback": True}}) == "sentencepiece"
    assert tokenizer_kind({"model": {"type": "WordPiece"}, "decoder": {"type": "WordPiece"}}) == "text"
