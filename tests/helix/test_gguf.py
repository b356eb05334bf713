"""GGUF files as models: the shape from the metadata (``helix plan`` on a spec naming one), the
converted folder (config, tokenizer, chat template) and its tokenizer against ``transformers``' own
GGUF loader, for both tokenizers a LLaMA GGUF carries; bad files are one clear error."""

from __future__ import annotations

import json

import pytest

from helix.core.errors import SpecError
from helix.core.gguf import GGUF_LINK, checkpoint_folder, find_gguf, open_gguf
from helix.core.models import resolve_model
from tests.builders.gguf import CHAT_TEMPLATE, write_tiny_gguf

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

TEXTS = ["Helix serves one large language model", " leading space", "two  spaces\nand a line",
         "héllo wörld 日本語 🙂", "Chunked prefill cuts long prompts", "<s> inside </s>", "", "x"]
QUANT = {"attn_q.weight": "Q8_0", "attn_k.weight": "Q4_1", "ffn_up.weight": "Q4_0",
         "token_embd.weight": "F16"}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HELIX_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def tiny_gguf(request, tmp_path_factory):
    """(path, spec, weights) of a quantized tiny GGUF with a byte-level or a sentencepiece tokenizer."""
    path = tmp_path_factory.mktemp(f"gguf-{request.param}") / f"tiny-{request.param}.gguf"
    spec, weights = write_tiny_gguf(path, request.param, quant=QUANT)
    return path, spec, weights


def test_shape_from_metadata_and_plan_reads_it(tiny_gguf, tmp_path, capsys):
    path, spec, _ = tiny_gguf
    got = resolve_model(path)
    assert (got.num_layers, got.hidden_size, got.num_heads, got.num_kv_heads, got.head_dim,
            got.intermediate_size, got.vocab_size, got.tie_word_embeddings, got.rope_theta) == \
        (spec.num_layers, spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_dim,
         spec.intermediate_size, spec.vocab_size, False, spec.rope_theta)
    assert resolve_model(path.parent) == got   # a folder holding one GGUF
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(f"model: {path}\ndtype: float32\nregions: {{local: {{bandwidth: 1GB/s, "
                       f"latency: 100us}}}}\nnodes:\n  - {{name: cpu-0, gpu: CPU, memory: 64MiB}}\n"
                       f"  - {{name: cpu-1, gpu: CPU, memory: 64MiB}}\n")
    from helix.cli import main
    assert main(["plan", str(cluster), "--method", "uniform", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["num_layers"] == spec.num_layers and plan["model"] == path.stem


def test_converted_folder_tokenizes_as_transformers(tiny_gguf):
    transformers = pytest.importorskip("transformers")
    from coordinator.textcodec import TextCodec
    path, _, _ = tiny_gguf
    folder = checkpoint_folder(path)
    assert checkpoint_folder(path) == folder   # made once
    assert (folder / GGUF_LINK).resolve() == path.resolve()
    assert (folder / "chat_template.jinja").read_text() == CHAT_TEMPLATE
    hf = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    codec = TextCodec(folder)
    for text in TEXTS:
        ids = hf(text)["input_ids"]
        assert codec.encode(text) == ids, text
        assert codec.decode(ids) == hf.decode(ids, skip_special_tokens=True), text
    assert codec.encode("x")[0] == 1   # the file says add BOS
    messages = [{"role": "user", "content": TEXTS[0]}]
    want = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    assert codec.encode_chat(messages) == list(want["input_ids"] if hasattr(want, "keys") else want)
    assert codec.eos_token_ids == (2,)


def test_a_changed_file_gets_a_new_folder(tmp_path):
    path = tmp_path / "m.gguf"
    write_tiny_gguf(path)
    first = checkpoint_folder(path)
    write_tiny_gguf(path, seed=1)
    import os
    os.utime(path, ns=(1, 1))   # a new modification time whatever the clock's resolution
    assert checkpoint_folder(path) != first
    assert checkpoint_folder(tmp_path / "not-a-gguf") == tmp_path / "not-a-gguf"   # folders pass


def test_bad_files_are_one_clear_error(tmp_path, capsys):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model at all")
    with pytest.raises(SpecError, match="not a GGUF file"):
        resolve_model(junk)
    other = tmp_path / "qwen" / "q.gguf"
    other.parent.mkdir()
    write_tiny_gguf(other, architecture="qwen2")
    with pytest.raises(SpecError, match="unsupported GGUF architecture 'qwen2'; supported: llama"):
        open_gguf(other)
    write_tiny_gguf(tmp_path / "qwen" / "second.gguf")
    with pytest.raises(SpecError, match="holds 2 GGUF files"):
        find_gguf(other.parent)
    from helix.cli import main
    cluster = tmp_path / "c.yaml"
    cluster.write_text("model: junk.gguf\nregions: {local: {bandwidth: 1GB/s, latency: 1ms}}\n"
                       "nodes:\n  - {name: a, gpu: CPU, memory: 1GiB}\n")
    assert main(["plan", str(cluster)]) != 0
    err = capsys.readouterr().err.strip()
    assert "not a GGUF file" in err and "Traceback" not in err and len(err.splitlines()) == 1
