"""A tiny random-weight LLaMA checkpoint with an in-code tokenizer, for ``helix demo`` and tests.

The checkpoint is a normal Hugging Face folder (``config.json``, ``model.safetensors``,
``tokenizer.json``, ``tokenizer_config.json`` with a chat template), so the serving path is exactly
the one a real model takes. The shapes are the catalog's ``tiny-llama`` (8 layers, hidden 64, GQA
4/2 heads), so ``cluster_specs/local3.yaml`` plans for it. Weights are random with a fixed seed and
scaled up so greedy choices are well separated (float rounding between engines cannot flip them).
"""

from __future__ import annotations

import json
from pathlib import Path

from helix.core.cache import cache_dir
from helix.core.models import MODEL_CATALOG

TEXT = ("Helix serves one large language model over a cluster of mixed GPUs in several regions. "
        "Each worker holds a contiguous slice of layers and runs whatever requests reach it. "
        "The placement maximizes the max flow from source to sink; every request gets its own "
        "pipeline. Iteration-level scheduling lets finished requests leave and new ones join. "
        "Chunked prefill cuts long prompts so decodes ride along with them. ")

CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n"
                 "{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}")

_VERSION = "1"   # bump when the recipe changes, so cached folders are rebuilt


def default_cache_dir() -> Path:
    return cache_dir() / f"tiny-llama-demo-v{_VERSION}"


def build_tokenizer():
    """A byte-level BPE tokenizer trained on :data:`TEXT` (ids 0-2: ``<unk> <s> </s>``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TEXT] * 4, trainer)
    return tok


def write_tiny_checkpoint(path: str | Path, seed: int = 0, chat_template: bool = True,
                          model: str = "tiny-llama"):
    """Write the checkpoint folder; returns the ``transformers`` model (eval mode) as the oracle.
    ``model``: another catalog LLaMA with random weights and the same tokenizer (its vocabulary
    must hold the tokenizer's 300 ids), e.g. ``small-llama`` for scripts/bench_live.py."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    spec = MODEL_CATALOG[model]
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = LlamaConfig(
        vocab_size=spec.vocab_size, hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size, num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings, rms_norm_eps=spec.rms_norm_eps,
        rope_theta=spec.rope_theta, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
    _quiet_transformers()
    model.save_pretrained(path)
    build_tokenizer().save(str(path / "tokenizer.json"))
    tok_cfg = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True}
    if chat_template:
        tok_cfg["chat_template"] = CHAT_TEMPLATE
    (path / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=1))
    return model


def _quiet_transformers() -> None:
    """No progress bars of transformers' own ("Writing model shards") in Helix's output."""
    try:
        from transformers.utils import logging as hf_logging
        hf_logging.disable_progress_bar()
    except ImportError:   # an older or newer layout: the bar is cosmetic
        pass
    try:
        from huggingface_hub.utils import disable_progress_bars
        disable_progress_bars()
    except ImportError:
        pass


def ensure_tiny_checkpoint(path: str | Path | None = None) -> Path:
    """The cached demo checkpoint, written on first use."""
    path = Path(path) if path is not None else default_cache_dir()
    if not (path / "model.safetensors").is_file() or not (path / "tokenizer.json").is_file():
        write_tiny_checkpoint(path)
    return path
