"""Tiny LLaMA GGUF files, written with the ``gguf`` package as llama.cpp's converter writes them
(llama.cpp's tensor names, q/k rows permuted per head, any tensor quantized), with either tokenizer
a LLaMA GGUF carries: byte-level BPE (``gpt2``, the demo's trained tokenizer) or sentencepiece BPE
(``llama``: byte-fallback pieces, scores and no merges)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from helix.commands.demo_checkpoint import TEXT, build_tokenizer
from helix.core.models import MODEL_CATALOG, ModelSpec

CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}"
                 "{{ eos_token }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")

_NORMAL, _UNKNOWN, _CONTROL, _BYTE = 1, 2, 3, 6


def byte_level_vocab() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) of the demo's byte-level BPE (ids 0-2 ``<unk> <s> </s>``)."""
    tok = json.loads(build_tokenizer().to_str())
    vocab = tok["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    return tokens, [_CONTROL] * 3 + [_NORMAL] * (len(tokens) - 3), merges


def sentencepiece_vocab() -> tuple[list[str], list[int], list[float]]:
    """(tokens, token types, scores): ``<unk> <s> </s>``, the 256 ``<0xNN>`` byte pieces, the
    characters of the demo text and every prefix of its words (``▁``-marked), longer ones scored
    higher, so that merges can be recovered from the scores."""
    words = sorted({"▁" + w for w in TEXT.split()})
    chars = sorted({c for w in words for c in w})
    prefixes = sorted({w[:k] for w in words for k in range(2, len(w) + 1)}, key=lambda p: (len(p), p))
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *chars, *prefixes]
    types = [_UNKNOWN, _CONTROL, _CONTROL] + [_BYTE] * 256 + [_NORMAL] * (len(chars) + len(prefixes))
    scores = [0.0] * 259 + [-100.0 - i for i in range(len(chars))] + [-float(len(prefixes) - i)
                                                                       for i in range(len(prefixes))]
    return tokens, types, scores


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's ``LlamaModel.permute`` of q/k rows (what :mod:`helix.core.gguf` undoes)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def random_weights(spec: ModelSpec, seed: int = 0) -> dict[str, np.ndarray]:
    """Hugging Face name -> float32 weights of ``spec`` (untied LM head), scaled so greedy choices
    are well apart."""
    rng = np.random.default_rng(seed)
    h, d, inter = spec.hidden_size, spec.head_dim, spec.intermediate_size
    shapes = {"model.embed_tokens.weight": (spec.vocab_size, h), "model.norm.weight": (h,),
              "lm_head.weight": (spec.vocab_size, h)}
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (spec.num_heads * d, h),
                       p + "self_attn.k_proj.weight": (spec.num_kv_heads * d, h),
                       p + "self_attn.v_proj.weight": (spec.num_kv_heads * d, h),
                       p + "self_attn.o_proj.weight": (h, spec.num_heads * d),
                       p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
                       p + "mlp.down_proj.weight": (h, inter),
                       p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)})
    return {n: (1.0 + 0.1 * rng.standard_normal(s) if len(s) == 1 else 0.2 * rng.standard_normal(s))
            .astype(np.float32) for n, s in shapes.items()}


def write_tiny_gguf(path: str | Path, tokenizer: str = "gpt2", quant: dict[str, str] | None = None,
                    seed: int = 0, architecture: str = "llama",
                    ) -> tuple[ModelSpec, dict[str, np.ndarray]]:
    """Write a catalog ``tiny-llama``-shaped GGUF (vocabulary: the tokenizer's) to ``path``;
    returns the spec and the float32 weights written (before quantization). ``quant``: llama.cpp
    tensor-name suffix (``attn_q.weight``) -> ggml type name (``Q8_0``), others float32."""
    import gguf
    from helix.core.gguf import gguf_name
    if tokenizer == "gpt2":
        tokens, types, merges = byte_level_vocab()
        scores = None
    else:
        tokens, types, scores = sentencepiece_vocab()
        merges = None
    spec = dataclasses.replace(MODEL_CATALOG["tiny-llama"], vocab_size=len(tokens))
    weights = random_weights(spec, seed)
    w = gguf.GGUFWriter(str(path), architecture)
    w.add_name("tiny test llama")
    w.add_context_length(spec.max_position_embeddings)
    w.add_block_count(spec.num_layers)
    w.add_embedding_length(spec.hidden_size)
    w.add_feed_forward_length(spec.intermediate_size)
    w.add_head_count(spec.num_heads)
    w.add_head_count_kv(spec.num_kv_heads)
    w.add_rope_dimension_count(spec.head_dim)
    w.add_rope_freq_base(spec.rope_theta)
    w.add_layer_norm_rms_eps(spec.rms_norm_eps)
    w.add_vocab_size(spec.vocab_size)
    w.add_tokenizer_model(tokenizer)
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    if merges is not None:
        w.add_token_merges(merges)
    if scores is not None:
        w.add_token_scores(scores)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_chat_template(CHAT_TEMPLATE)
    for name, value in weights.items():
        gname = gguf_name(name)
        if name.endswith("q_proj.weight"):
            value = _permute(value, spec.num_heads)
        elif name.endswith("k_proj.weight"):
            value = _permute(value, spec.num_kv_heads)
        qtype = next((t for suffix, t in (quant or {}).items() if gname.endswith(suffix)), None)
        if qtype is None:
            w.add_tensor(gname, value)
        else:
            kind = gguf.GGMLQuantizationType[qtype]
            w.add_tensor(gname, gguf.quants.quantize(value, kind), raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return spec, weights
