"""GGUF checkpoints (llama.cpp's one-file format), read as ``transformers`` reads them.

A GGUF holds the model's shape and its tokenizer as metadata and its tensors, usually quantized,
under llama.cpp's names. :class:`GGUFFile` (the ``gguf`` package's reader underneath) gives

- the Hugging Face ``config.json`` fields the metadata implies, as ``transformers``' GGUF loader maps
  them (``llama.block_count`` -> ``num_hidden_layers``, ...; no ``output.weight`` means tied
  embeddings), from which :func:`helix.core.models.resolve_model` builds the model's shape;
- any tensor by its Hugging Face name, dequantized to float32 on demand, so a worker reads only its
  slice. llama.cpp's converter reorders the rows of ``q_proj`` and ``k_proj`` within each head
  (pairs of rotary dimensions interleaved rather than split in halves); :meth:`GGUFFile.read`
  undoes it, as ``transformers``' ``LlamaTensorProcessor`` does.

Everything else in Helix reads a Hugging Face folder (the coordinator its ``tokenizer.json`` and
chat template, the worker ``config.json``). :func:`checkpoint_folder` turns a GGUF into one, once:
``config.json``, ``tokenizer.json``, ``tokenizer_config.json`` and ``chat_template.jinja`` written
from the metadata (:mod:`helix.core.gguf_tokenizer`), and ``model.gguf``, a link to the file itself, in
place of safetensors. It lives under the Helix cache (:func:`helix.core.cache.cache_dir`), keyed by the
file's resolved path, size and modification time, and is written to a temporary folder and renamed
into place, so workers that convert at once never see half a folder.

Only LLaMA-family files (``general.architecture`` ``llama``) are read; ``transformers`` calls one
whose ``general.name`` contains "mistral" Mistral, and so do we.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

from helix.core.errors import SpecError
from helix.core.gguf_tokenizer import build_tokenizer, tokenizer_config

#: The link to the GGUF inside a converted folder; the worker reads tensors through it.
GGUF_LINK = "model.gguf"

_FORMAT = "1"   # bump when the converted folder's contents change, so old ones are not reused

#: Hugging Face tensor name (``{i}`` = layer) -> llama.cpp's.
_LAYER_NAMES = {
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
}
_GLOBAL_NAMES = {"model.embed_tokens.weight": "token_embd.weight",
                 "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}


def gguf_name(hf_name: str) -> str | None:
    """llama.cpp's name for a Hugging Face LLaMA tensor name (None for one it has no name for)."""
    if hf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[hf_name]
    parts = hf_name.split(".", 3)   # model, layers, {i}, rest
    if len(parts) == 4 and parts[:2] == ["model", "layers"] and parts[3] in _LAYER_NAMES:
        return f"blk.{parts[2]}.{_LAYER_NAMES[parts[3]]}"
    return None


def is_gguf_file(path: str | Path) -> bool:
    """Whether ``path`` is a file that starts with GGUF's magic bytes."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def find_gguf(path: str | Path) -> Path | None:
    """The GGUF file ``path`` names: the file itself, or the one ``*.gguf`` in a folder that has no
    ``config.json`` (a folder holding several is an error that names them); None otherwise."""
    p = Path(path)
    if p.is_file():
        if p.suffix.lower() == ".gguf" or is_gguf_file(p):
            return p
        return None
    if p.is_dir() and not (p / "config.json").is_file():
        found = sorted(f for f in p.glob("*.gguf") if f.is_file())
        if len(found) > 1:
            raise SpecError(f"model {str(p)!r}: holds {len(found)} GGUF files "
                            f"({', '.join(f.name for f in found)}); name one")
        return found[0] if found else None
    return None


class GGUFFile:
    """One GGUF file's metadata and tensors. Open with :func:`open_gguf` (cached per file)."""

    def __init__(self, path: str | Path) -> None:
        try:
            from gguf import GGUFReader
        except ImportError:
            raise SpecError("reading a GGUF file needs the gguf package: "
                            "pip install 'helix-serve[torch]'") from None
        self.path = Path(path)
        if not is_gguf_file(self.path):
            raise SpecError(f"model {str(self.path)!r}: not a GGUF file (no GGUF magic bytes)")
        try:
            self._reader = GGUFReader(str(self.path))
        except (ValueError, IndexError, KeyError, TypeError, OverflowError) as exc:
            raise SpecError(f"model {str(self.path)!r}: unreadable GGUF file: {exc}") from None
        self._tensors = {t.name: t for t in self._reader.tensors}
        self._values: dict[str, Any] = {}
        arch = self.field("general.architecture")
        if arch != "llama":
            raise SpecError(f"model {str(self.path)!r}: unsupported GGUF architecture {arch!r}; "
                            f"supported: llama (LLaMA-family)")
        if "rope_freqs.weight" in self._tensors:
            raise SpecError(f"model {str(self.path)!r}: per-dimension rope frequency factors "
                            f"(rope_freqs.weight, LLaMA-3.1-style scaling) are not supported")
        self.config = self._hf_config()

    @property
    def header_bytes(self) -> int:
        """Bytes before the tensor data: the metadata and the tensor table."""
        return int(self._reader.data_offset)

    def field(self, key: str, default: Any = None) -> Any:
        """A metadata value as Python (str, int, float, bool or list), or ``default``."""
        if key not in self._values:
            f = self._reader.get_field(key)
            self._values[key] = None if f is None else f.contents()
        value = self._values[key]
        return default if value is None else value

    def _hf_config(self) -> dict[str, Any]:
        """``config.json`` fields, as ``transformers``' GGUF loader maps them."""
        a = "llama."
        name = self.field("general.name") or self.path.stem
        heads = self.field(a + "attention.head_count")
        missing = [k for k in ("block_count", "embedding_length", "feed_forward_length",
                               "attention.head_count") if self.field(a + k) is None]
        if missing:
            raise SpecError(f"model {str(self.path)!r}: GGUF metadata lacks {a + missing[0]!r}")
        if isinstance(heads, list) or isinstance(self.field(a + "attention.head_count_kv"), list):
            raise SpecError(f"model {str(self.path)!r}: per-layer head counts are not supported")
        vocab = self.field(a + "vocab_size") or len(self.field("tokenizer.ggml.tokens") or [])
        cfg: dict[str, Any] = {
            "architectures": ["MistralForCausalLM" if "mistral" in str(name).lower()
                              else "LlamaForCausalLM"],
            "model_type": "mistral" if "mistral" in str(name).lower() else "llama",
            "_name_or_path": name,
            "num_hidden_layers": self.field(a + "block_count"),
            "hidden_size": self.field(a + "embedding_length"),
            "intermediate_size": self.field(a + "feed_forward_length"),
            "num_attention_heads": heads,
            "num_key_value_heads": self.field(a + "attention.head_count_kv", heads),
            "vocab_size": vocab,
            "max_position_embeddings": self.field(a + "context_length", 2048),
            "rope_theta": self.field(a + "rope.freq_base", 10000.0),
            "rms_norm_eps": self.field(a + "attention.layer_norm_rms_epsilon", 1e-6),
            "tie_word_embeddings": "output.weight" not in self._tensors,
        }
        head_dim = self.field(a + "attention.key_length") or self.field(a + "rope.dimension_count")
        if head_dim:
            cfg["head_dim"] = head_dim
        scaling = self.field(a + "rope.scaling.type")
        if scaling == "linear":
            cfg["rope_scaling"] = {"rope_type": "linear",
                                   "factor": self.field(a + "rope.scaling.factor", 1.0)}
        elif scaling not in (None, "none"):
            raise SpecError(f"model {str(self.path)!r}: unsupported rope scaling {scaling!r} "
                            f"(supported: none, linear)")
        for key in ("bos", "eos", "padding", "unknown"):
            token_id = self.field(f"tokenizer.ggml.{key}_token_id")
            if token_id is not None:
                cfg[{"padding": "pad", "unknown": "unk"}.get(key, key) + "_token_id"] = token_id
        return cfg

    # --- tensors ----------------------------------------------------------------------------------
    def has(self, hf_name: str) -> bool:
        return gguf_name(hf_name) in self._tensors

    def shape(self, hf_name: str) -> tuple[int, ...]:
        """Torch order (GGUF lists dimensions innermost first)."""
        return tuple(int(n) for n in reversed(self._tensors[gguf_name(hf_name)].shape))

    def nbytes(self, hf_name: str) -> int:
        """Bytes the tensor takes in the file (quantized)."""
        return int(self._tensors[gguf_name(hf_name)].n_bytes)

    def read(self, hf_name: str):
        """The tensor as a float32 numpy array in torch order, dequantized, with llama.cpp's
        q/k row order undone."""
        import numpy as np
        from gguf import dequantize
        t = self._tensors[gguf_name(hf_name)]
        try:
            values = dequantize(t.data, t.tensor_type)
        except NotImplementedError:
            raise SpecError(f"model {str(self.path)!r}: tensor {t.name!r} has quantization "
                            f"{t.tensor_type.name}, which the gguf package cannot dequantize") from None
        values = np.array(values, dtype=np.float32).reshape(self.shape(hf_name))
        if hf_name.endswith("self_attn.q_proj.weight"):
            values = _unpermute(values, self.config["num_attention_heads"])
        elif hf_name.endswith("self_attn.k_proj.weight"):
            values = _unpermute(values, self.config["num_key_value_heads"])
        return values


def _unpermute(w, num_heads: int):
    """Undo llama.cpp's ``permute``: within each head, rows ``(half, pair)`` back to ``(pair, half)``."""
    rows_per_half = w.shape[0] // num_heads // 2
    return w.reshape(num_heads, rows_per_half, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def _file_key(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return str(path.resolve()), st.st_size, st.st_mtime_ns


@functools.lru_cache(maxsize=4)
def _open_cached(resolved: str, size: int, mtime_ns: int) -> GGUFFile:
    return GGUFFile(resolved)


_open_lock = threading.Lock()


def open_gguf(path: str | Path) -> GGUFFile:
    """The file's :class:`GGUFFile`, parsed once per process while the file is unchanged (parsing a
    tokenizer's 50k-entry metadata takes seconds; workers of one process that load at once wait
    for one parse)."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"model: no such GGUF file {str(p)!r}")
    with _open_lock:
        return _open_cached(*_file_key(p))


def checkpoint_folder(path: str | Path) -> Path:
    """A Hugging Face-style folder for ``path``: ``path`` itself unless it names a GGUF
    (:func:`find_gguf`), else that GGUF's converted folder (see the module doc), made on first use."""
    found = find_gguf(path)
    if found is None:
        return Path(path)
    resolved, size, mtime_ns = _file_key(found)
    key = hashlib.sha256(f"{_FORMAT}\0{resolved}\0{size}\0{mtime_ns}".encode()).hexdigest()[:16]
    from helix.core.cache import cache_dir
    folder = cache_dir() / "gguf" / f"{found.stem}-{key}"
    if (folder / "config.json").is_file():
        return folder
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    except OSError as exc:
        raise SpecError(f"model {str(found)!r}: cannot write its converted folder under "
                        f"{str(folder.parent)!r} ({exc.strerror}); set HELIX_CACHE to a writable "
                        f"folder") from None
    try:
        write_folder(open_gguf(found), tmp)
        try:
            os.rename(tmp, folder)
        except OSError:   # another process finished first: keep its folder
            if not (folder / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def write_folder(g: GGUFFile, folder: Path) -> None:
    """Write ``config.json``, the tokenizer files, ``chat_template.jinja`` (when the file has a
    template) and the ``model.gguf`` link into ``folder``."""
    (folder / "config.json").write_text(json.dumps(g.config, indent=1))
    build_tokenizer(g).save(str(folder / "tokenizer.json"))
    tok_cfg = tokenizer_config(g)
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=1))
    if tok_cfg.get("chat_template"):
        (folder / "chat_template.jinja").write_text(tok_cfg["chat_template"])
    (folder / GGUF_LINK).symlink_to(g.path.resolve())
