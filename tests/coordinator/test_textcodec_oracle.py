"""The coordinator tokenizes and detokenizes exactly as ``transformers`` does, on
tokenizer shapes these tests build: Llama-style (BOS from the post-processor, a template writing
BOS), byte-level BPE with a ``bos_token`` but no post-processor, a post-processor BOS with
``add_bos_token: false`` in the config, and a template writing BOS beside a BOS post-processor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from coordinator.textcodec import Detokenizer, TextCodec  # noqa: E402
from helix.commands.demo_checkpoint import TEXT  # noqa: E402

TEXTS = ["Helix serves", " leading space", "two  spaces and\nnewlines\n", "ünïcödé ✓ 日本",
         "Each worker holds a slice of layers.", "x"]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello ✓"},
            {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "More"}]
BOS_TEMPLATE = ("{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
                "{% if add_generation_prompt %}[assistant] {% endif %}")
PLAIN_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
                  "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def _tokenizer(kind: str, bos_post: bool):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    if kind == "llama":
        tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                         decoders.Fuse(), decoders.Strip(" ", 1, 0)])
        alphabet = sorted(set(TEXT + "".join(TEXTS) + "".join(m["content"] for m in MESSAGES)))
        trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", "<s>", "</s>"]
                                      + [f"<0x{b:02X}>" for b in range(256)], initial_alphabet=alphabet)
    else:
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TEXT] * 4, trainer)
    if bos_post:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                           special_tokens=[("<s>", 1)])
    return tok


SHAPES = {   # name: (tokenizer kind, BOS post-processor, tokenizer_config.json)
    "llama-bos-template": ("llama", True, {"bos_token": "<s>", "eos_token": "</s>",
                                           "tokenizer_class": "LlamaTokenizer",
                                           "chat_template": BOS_TEMPLATE}),
    "bytelevel-no-bos": ("bytelevel", False, {"bos_token": "<s>", "eos_token": "</s>",
                                              "chat_template": PLAIN_TEMPLATE}),
    "add-bos-false": ("llama", True, {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": False,
                                      "tokenizer_class": "LlamaTokenizer",
                                      "chat_template": PLAIN_TEMPLATE}),
    "template-writes-bos": ("bytelevel", True, {"bos_token": "<s>", "eos_token": "</s>",
                                                "add_bos_token": True, "chat_template": BOS_TEMPLATE}),
}


@pytest.fixture(scope="module", params=sorted(SHAPES))
def checkpoint(request, tmp_path_factory) -> Path:
    kind, bos_post, cfg = SHAPES[request.param]
    path = tmp_path_factory.mktemp(request.param)
    _tokenizer(kind, bos_post).save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))
    (path / "config.json").write_text(json.dumps({"vocab_size": 700, "max_position_embeddings": 512,
                                                  "eos_token_id": 2}))
    return path


def test_encode_decode_and_chat_equal_transformers(checkpoint):
    hf = transformers.AutoTokenizer.from_pretrained(str(checkpoint))
    ours = TextCodec(checkpoint)
    for text in TEXTS:
        ids = hf(text)["input_ids"]
        assert ours.encode(text) == ids, text
        assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True), text
    want = hf.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
    want = list(want["input_ids"] if hasattr(want, "keys") else want)
    assert ours.encode_chat(MESSAGES) == want
    # Streamed text, assembled chunk by chunk, is the whole decode.
    for text in TEXTS:
        ids = hf(text)["input_ids"]
        d = Detokenizer(ours)
        streamed = "".join(d.add(t, final=k == len(ids) - 1) for k, t in enumerate(ids))
        assert streamed == hf.decode(ids, skip_special_tokens=True), text


def test_bos_follows_the_post_processor(checkpoint):
    kind, bos_post, cfg = SHAPES[checkpoint.name.rstrip("0123456789")]
    ids = TextCodec(checkpoint).encode("Helix serves")
    assert (ids[0] == 1) is bos_post


JSON_TEMPLATE = ("{% for m in messages %}{% if loop.index > 3 %}{% break %}{% endif %}"
                 "{{ m['role'] }}: {{ m['content'] | tojson }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


def test_template_environment_and_no_truncation_as_transformers(tmp_path):
    """transformers renders templates with loop controls and a UTF-8 tojson, and a plain call
    tokenizes without the truncation or padding tokenizer.json may store."""
    tok = _tokenizer("bytelevel", False)
    tok.enable_truncation(max_length=3)
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "chat_template": JSON_TEMPLATE}))
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 700, "max_position_embeddings": 512}))
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    ours = TextCodec(tmp_path)
    text = "Each worker holds a slice of layers."
    assert ours.encode(text) == hf(text)["input_ids"] and len(ours.encode(text)) > 3
    msgs = [{"role": "user", "content": "a <b> & 'é'"}, *MESSAGES]
    want = hf.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert ours.render_chat(msgs) == want and "'é'" in want and "break" not in want
