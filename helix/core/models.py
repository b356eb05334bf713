"""Model catalog: the shape of a LLaMA-family decoder, and the bytes that shape implies.

A :class:`ModelSpec` is built from the fields of a Hugging Face ``config.json`` (so any checkpoint a
user will serve can be described by pointing at its folder), or taken from the built-in catalog.
Everything the planner and the cost model need is derived here, once: bytes of one decoder layer,
of the embedding and of the LM head, KV bytes per token per layer, activation bytes per token.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from helix.core.errors import SpecError
from helix.core.gguf import find_gguf, open_gguf

#: Architectures whose decoder layer is the LLaMA block (RMSNorm, RoPE, GQA, SwiGLU, no biases).
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM")

#: Bytes per element of each weight dtype the system understands.
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}


def known_dtype(value: str) -> str:
    """``value`` when it names a dtype of :data:`DTYPE_BYTES`; ValueError naming the known ones
    otherwise (the spec's and the plan's ``dtype`` fields validate with it)."""
    if value not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {value!r}; known: {', '.join(DTYPE_BYTES)}")
    return value


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a LLaMA-family decoder-only model (field names follow Hugging Face's config)."""

    name: str
    num_layers: int
    """Decoder layers (``num_hidden_layers``)."""
    hidden_size: int
    num_heads: int
    """Query heads (``num_attention_heads``)."""
    num_kv_heads: int
    """Key/value heads (``num_key_value_heads``); fewer than ``num_heads`` means grouped-query attention."""
    intermediate_size: int
    """Width of the SwiGLU MLP."""
    vocab_size: int
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = field(default=None, compare=False, hash=False)
    """HF ``rope_scaling`` (e.g. LLaMA-3.1's ``{"rope_type": "llama3", "factor": 8, ...}``) or None."""
    rms_norm_eps: float = 1e-6
    head_dim: int | None = None
    """Per-head width; defaults to ``hidden_size // num_heads``."""
    architecture: str = "LlamaForCausalLM"

    def __post_init__(self) -> None:
        for attr in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "intermediate_size",
                     "vocab_size"):
            if getattr(self, attr) < 1:
                raise SpecError(f"model {self.name!r}: {attr} must be >= 1, got {getattr(self, attr)}")
        if self.num_heads % self.num_kv_heads:
            raise SpecError(f"model {self.name!r}: num_heads {self.num_heads} is not a multiple of "
                            f"num_kv_heads {self.num_kv_heads}")
        if self.head_dim is None:
            if self.hidden_size % self.num_heads:
                raise SpecError(f"model {self.name!r}: hidden_size {self.hidden_size} is not a multiple "
                                f"of num_heads {self.num_heads}")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)

    # --- parameter counts -------------------------------------------------------------------------
    @property
    def params_per_layer(self) -> int:
        """Weights of one decoder layer: q,k,v,o projections, gate/up/down MLP, two RMSNorm vectors."""
        h, d = self.hidden_size, self.head_dim
        q_o = 2 * h * self.num_heads * d
        k_v = 2 * h * self.num_kv_heads * d
        mlp = 3 * h * self.intermediate_size
        return q_o + k_v + mlp + 2 * h

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """LM head plus the final norm. With tied embeddings the head shares the embedding matrix,
        but a node holding only the last layers still has to hold a copy of it."""
        return self.vocab_size * self.hidden_size + self.hidden_size

    @property
    def total_params(self) -> int:
        head = self.hidden_size if self.tie_word_embeddings else self.lm_head_params
        return self.embedding_params + self.num_layers * self.params_per_layer + head

    # --- bytes ------------------------------------------------------------------------------------
    def layer_bytes(self, dtype_bytes: int = 2) -> int:
        return self.params_per_layer * dtype_bytes

    def embedding_bytes(self, dtype_bytes: int = 2) -> int:
        return self.embedding_params * dtype_bytes

    def lm_head_bytes(self, dtype_bytes: int = 2) -> int:
        return self.lm_head_params * dtype_bytes

    def kv_bytes_per_token_per_layer(self, dtype_bytes: int = 2) -> int:
        """One key and one value vector per KV head."""
        return 2 * self.num_kv_heads * self.head_dim * dtype_bytes

    def activation_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """Hidden state passed between pipeline stages for one token."""
        return self.hidden_size * dtype_bytes

    # --- flops ------------------------------------------------------------------------------------
    @property
    def linear_flops_per_token_per_layer(self) -> int:
        """2 FLOPs per multiply-accumulate over every matrix of the layer."""
        return 2 * (self.params_per_layer - 2 * self.hidden_size)

    def attention_flops_per_token_per_layer(self, context_tokens: float) -> float:
        """QK^T and softmax(.)V against ``context_tokens`` keys: 2 matmuls x 2 FLOPs/MAC."""
        return 4.0 * context_tokens * self.num_heads * self.head_dim

    # --- construction -----------------------------------------------------------------------------
    @classmethod
    def from_hf_config(cls, config: dict[str, Any], name: str | None = None) -> "ModelSpec":
        """Build from the fields of a Hugging Face ``config.json`` (already parsed)."""
        archs = config.get("architectures") or ["LlamaForCausalLM"]
        arch = archs[0]
        model_name = name or config.get("_name_or_path") or arch
        if arch not in SUPPORTED_ARCHITECTURES:
            raise SpecError(f"model {model_name!r}: unsupported architecture {arch!r}; supported: "
                            f"{', '.join(SUPPORTED_ARCHITECTURES)}")
        # transformers >= 5 writes rope_theta and the scaling into one "rope_parameters" dict.
        rope = config.get("rope_parameters") or {}
        scaling = config.get("rope_scaling") or (
            rope if rope.get("rope_type", "default") != "default" else None)
        try:
            num_heads = int(config["num_attention_heads"])
            return cls(
                name=str(model_name),
                num_layers=int(config["num_hidden_layers"]),
                hidden_size=int(config["hidden_size"]),
                num_heads=num_heads,
                num_kv_heads=int(config.get("num_key_value_heads") or num_heads),
                intermediate_size=int(config["intermediate_size"]),
                vocab_size=int(config["vocab_size"]),
                tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
                max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
                rope_theta=float(config.get("rope_theta") or rope.get("rope_theta") or 10000.0),
                rope_scaling=scaling,
                rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
                head_dim=int(config["head_dim"]) if config.get("head_dim") else None,
                architecture=arch,
            )
        except KeyError as exc:
            raise SpecError(f"model {model_name!r}: config.json lacks field {exc.args[0]!r}") from None
        except (TypeError, ValueError) as exc:
            raise SpecError(f"model {model_name!r}: bad value in config.json: {exc}") from None

    @classmethod
    def from_pretrained_dir(cls, path: str | Path) -> "ModelSpec":
        """Read ``config.json`` from a checkpoint folder (or the file itself)."""
        p = Path(path)
        cfg_path = p / "config.json" if p.is_dir() else p
        if not cfg_path.is_file():
            raise SpecError(f"model: no config.json at {str(cfg_path)!r}")
        try:
            config = json.loads(cfg_path.read_text())
        except json.JSONDecodeError as exc:
            raise SpecError(f"model: {str(cfg_path)!r} is not valid JSON: {exc.msg} "
                            f"(line {exc.lineno})") from None
        return cls.from_hf_config(config, name=p.name if p.is_dir() else p.parent.name)


def _llama(name: str, layers: int, hidden: int, heads: int, kv_heads: int, inter: int, vocab: int,
           max_pos: int, theta: float = 10000.0, eps: float = 1e-6, tied: bool = False,
           rope_scaling: dict[str, Any] | None = None) -> ModelSpec:
    return ModelSpec(name=name, num_layers=layers, hidden_size=hidden, num_heads=heads,
                     num_kv_heads=kv_heads, intermediate_size=inter, vocab_size=vocab,
                     max_position_embeddings=max_pos, rope_theta=theta, rms_norm_eps=eps,
                     tie_word_embeddings=tied, rope_scaling=rope_scaling)


_LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}

#: Built-in models. Shapes are the ``config.json`` values of the public checkpoints
#: (huggyllama/llama-30b, meta-llama/Llama-2-70b-hf, meta-llama/Meta-Llama-3-8B / -70B,
#: meta-llama/Llama-3.1-8B); the tiny ones are for tests and the demo.
MODEL_CATALOG: dict[str, ModelSpec] = {m.name: m for m in (
    _llama("llama-1-30b", 60, 6656, 52, 52, 17920, 32000, 2048),
    _llama("llama-2-7b", 32, 4096, 32, 32, 11008, 32000, 4096, eps=1e-5),
    _llama("llama-2-70b", 80, 8192, 64, 8, 28672, 32000, 4096, eps=1e-5),
    _llama("llama-3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, theta=500000.0, eps=1e-5),
    _llama("llama-3-70b", 80, 8192, 64, 8, 28672, 128256, 8192, theta=500000.0, eps=1e-5),
    _llama("llama-3.1-8b", 32, 4096, 32, 8, 14336, 128256, 131072, theta=500000.0, eps=1e-5,
           rope_scaling=_LLAMA3_SCALING),
    _llama("tiny-llama", 8, 64, 4, 2, 128, 512, 512, eps=1e-5),
    _llama("tiny-llama-tied", 6, 64, 4, 4, 160, 384, 512, eps=1e-5, tied=True),
    # Big enough that layer math dominates a CPU step (scripts/bench_live.py, local2.yaml).
    _llama("small-llama", 8, 512, 8, 8, 1408, 512, 4096, eps=1e-5),
)}


def resolve_model(ref: str | Path, base_dir: Path | None = None) -> ModelSpec:
    """A catalog name (case-insensitive), or a path to a checkpoint folder / ``config.json``, or to a
    GGUF file / a folder holding one (its shape from the file's metadata, :mod:`helix.core.gguf`).

    Relative paths are taken against ``base_dir`` (the spec file's folder) first, then the CWD.
    """
    key = str(ref).strip()
    for name, spec in MODEL_CATALOG.items():
        if name.lower() == key.lower():
            return spec
    candidates = [Path(key)]
    if base_dir is not None and not Path(key).is_absolute():
        candidates.insert(0, base_dir / key)
    for cand in candidates:
        if cand.exists():
            found = find_gguf(cand)
            if found is not None:
                return ModelSpec.from_hf_config(open_gguf(found).config, name=found.stem)
            return ModelSpec.from_pretrained_dir(cand)
    raise SpecError(f"model: unknown model {key!r}; known: {', '.join(MODEL_CATALOG)} "
                    f"(or a path to a checkpoint folder with config.json, or a GGUF file)")
