import json

import pytest

from helix.core.errors import SpecError
from helix.core.models import MODEL_CATALOG, ModelSpec, resolve_model


def test_catalog_shapes():
    m = MODEL_CATALOG["llama-2-70b"]
    assert (m.num_layers, m.hidden_size, m.num_kv_heads, m.head_dim) == (80, 8192, 8, 128)
    # ~69B parameters, as published.
    assert 68e9 < m.total_params < 70e9
    assert 32e9 < MODEL_CATALOG["llama-1-30b"].total_params < 33e9
    assert 7.9e9 < MODEL_CATALOG["llama-3-8b"].total_params < 8.1e9
    assert MODEL_CATALOG["llama-3.1-8b"].rope_scaling["rope_type"] == "llama3"


def test_derived_bytes():
    m = MODEL_CATALOG["llama-2-70b"]
    assert m.kv_bytes_per_token_per_layer(2) == 2 * 8 * 128 * 2
    assert m.activation_bytes_per_token(2) == 8192 * 2
    assert m.embedding_bytes(2) == 32000 * 8192 * 2
    assert m.layer_bytes(2) == m.params_per_layer * 2
    assert m.lm_head_bytes(2) > m.embedding_bytes(2)  # head + final norm


def test_from_hf_config_matches_transformers_fields(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=100,
                                   tie_word_embeddings=True)
    cfg.architectures = ["LlamaForCausalLM"]
    cfg.save_pretrained(tmp_path)
    spec = ModelSpec.from_pretrained_dir(tmp_path)
    model = transformers.LlamaForCausalLM(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    assert spec.total_params == n_params
    assert spec.tie_word_embeddings and spec.num_kv_heads == 2 and spec.head_dim == 16


def test_unknown_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(SpecError, match="unsupported architecture 'GPT2LMHeadModel'"):
        ModelSpec.from_pretrained_dir(tmp_path)


def test_missing_field(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(SpecError, match="lacks field"):
        ModelSpec.from_pretrained_dir(tmp_path)


def test_resolve_unknown_model_lists_known():
    with pytest.raises(SpecError, match="known: llama-1-30b"):
        resolve_model("llama-9-900b")
    assert resolve_model("LLAMA-2-70B").name == "llama-2-70b"
