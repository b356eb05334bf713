"""Tiny random LLaMA checkpoints written with ``save_pretrained`` and a tokenizer trained in code.

Everything is built on the fly (no network). The models are the outside oracle: the engine must give
token-for-token what ``transformers`` gives on the same weights.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.builders.threads import one_torch_thread

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

_TEXT = ("Helix serves one large language model over a cluster of mixed GPUs in several regions. "
         "Each worker holds a contiguous slice of layers and runs whatever requests reach it. "
         "The placement maximizes the max flow from source to sink; every request gets its own "
         "pipeline. Iteration-level scheduling lets finished requests leave and new ones join. "
         "Chunked prefill cuts long prompts so decodes ride along with them. ")


@pytest.fixture(autouse=True)
def _one_torch_thread():
    with one_torch_thread():
        yield


def tiny_llama_config(**overrides):
    from transformers import LlamaConfig
    kwargs = dict(vocab_size=320, hidden_size=64, intermediate_size=160, num_hidden_layers=8,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
                  # LLaMA-3 frequency scaling with a short original context, so it matters here.
                  rope_theta=10000.0,
                  rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    kwargs.update(overrides)
    return LlamaConfig(**kwargs)


def save_tiny_llama(path: Path, seed: int = 0, **overrides):
    """A random ``LlamaForCausalLM`` saved to ``path``; returns the model (eval mode, float32)."""
    from transformers import LlamaForCausalLM
    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_llama_config(**overrides)).eval()
    # Random init with std 0.02 gives nearly flat logits; scale up so greedy choices are well separated.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
    model.save_pretrained(path)
    return model


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([_TEXT] * 4, trainer)
    return tok


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    """(checkpoint dir, HF model) of an 8-layer GQA LLaMA with LLaMA-3 RoPE scaling."""
    path = tmp_path_factory.mktemp("tiny_llama")
    return path, save_tiny_llama(path)


@pytest.fixture(scope="session")
def tied_ckpt(tmp_path_factory):
    """(checkpoint dir, HF model) with tied embeddings, no GQA and plain RoPE, sharded in 3 files."""
    from transformers import LlamaForCausalLM
    path = tmp_path_factory.mktemp("tied_llama")
    torch.manual_seed(1)
    model = LlamaForCausalLM(tiny_llama_config(num_hidden_layers=4, num_key_value_heads=4,
                                               tie_word_embeddings=True, rope_scaling=None)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
    model.save_pretrained(path, max_shard_size="100KB")
    return path, model


@pytest.fixture(scope="session")
def prompts(tiny_tokenizer):
    """16 prompts of mixed lengths (3 to ~70 tokens) from the trained tokenizer."""
    words = _TEXT.split()
    out = []
    for i in range(16):
        n = 2 + (i * 7) % 40
        ids = tiny_tokenizer.encode(" ".join(words[i:i + n])).ids
        out.append([1] + ids)
    return out
