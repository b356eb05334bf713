"""Load only one slice's tensors from a Hugging Face safetensors checkpoint or a GGUF file.

Reads ``config.json`` through :class:`helix.core.models.ModelSpec`, then ``model.safetensors`` or the shards
named by ``model.safetensors.index.json``. The safetensors format is an 8-byte little-endian header
length, a JSON header (name -> dtype, shape, byte offsets) and the raw data; we read the header and then
exactly the byte ranges of the tensors the slice needs with ``os.pread``, so memory and I/O grow with the
slice, not the model (``LoadReport.bytes_read`` counts every byte read, headers included).

A GGUF file (or a folder holding one) is first given its converted folder
(:func:`helix.core.gguf.checkpoint_folder`), whose ``model.gguf`` link is read through
:class:`helix.core.gguf.GGUFFile`: each tensor the slice needs is dequantized to float32 and then cast to
the serving dtype; ``bytes_read`` counts the file's header and those tensors' quantized bytes.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from helix.core.errors import HelixUserError, SpecError
from helix.core.gguf import GGUF_LINK, checkpoint_folder, open_gguf
from helix.core.models import ModelSpec
from worker.model import LayerWeights, SliceWeights

_ST_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
              "F64": torch.float64}


@dataclass(frozen=True)
class LoadReport:
    """What a load read: bytes (headers included) and tensor names."""

    bytes_read: int
    tensor_names: tuple[str, ...]


def check_slice(spec: ModelSpec, start: int, end: int) -> None:
    if not 0 <= start < end <= spec.num_layers:
        raise HelixUserError(f"slice [{start}, {end}) is outside model {spec.name!r} with "
                             f"{spec.num_layers} layers (need 0 <= start < end <= {spec.num_layers})")


def expected_shapes(spec: ModelSpec, start: int, end: int) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> shape for everything slice ``[start, end)`` needs."""
    h, d, inter = spec.hidden_size, spec.head_dim, spec.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {}
    for li in range(start, end):
        p = f"model.layers.{li}."
        shapes.update({
            p + "self_attn.q_proj.weight": (spec.num_heads * d, h),
            p + "self_attn.k_proj.weight": (spec.num_kv_heads * d, h),
            p + "self_attn.v_proj.weight": (spec.num_kv_heads * d, h),
            p + "self_attn.o_proj.weight": (h, spec.num_heads * d),
            p + "mlp.gate_proj.weight": (inter, h),
            p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
        })
    if start == 0:
        shapes["model.embed_tokens.weight"] = (spec.vocab_size, h)
    if end == spec.num_layers:
        shapes["model.norm.weight"] = (h,)
        shapes["lm_head.weight"] = (spec.vocab_size, h)
    return shapes


class _Reader:
    """Reads named tensors from the safetensors files of one checkpoint, counting bytes."""

    def __init__(self, ckpt: Path) -> None:
        self.ckpt = ckpt
        self.bytes_read = 0
        self._headers: dict[Path, tuple[int, dict]] = {}
        index = ckpt / "model.safetensors.index.json"
        single = ckpt / "model.safetensors"
        if index.is_file():
            raw = index.read_bytes()
            self.bytes_read += len(raw)
            self.where = {k: ckpt / v for k, v in json.loads(raw)["weight_map"].items()}
        elif single.is_file():
            self.where = {name: single for name in self._header(single)[1]}
        else:
            raise SpecError(f"checkpoint {str(ckpt)!r} has neither model.safetensors nor "
                            f"model.safetensors.index.json")

    def _header(self, path: Path) -> tuple[int, dict]:
        if path not in self._headers:
            with open(path, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(n))
            self.bytes_read += 8 + n
            header.pop("__metadata__", None)
            self._headers[path] = (8 + n, header)
        return self._headers[path]

    def has(self, name: str) -> bool:
        return name in self.where

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._header(self.where[name])[1][name]["shape"])

    def read(self, name: str) -> torch.Tensor:
        path = self.where[name]
        data_start, header = self._header(path)
        info = header[name]
        if info["dtype"] not in _ST_DTYPES:
            raise SpecError(f"tensor {name!r} in {path.name}: unsupported dtype {info['dtype']!r}")
        begin, end = info["data_offsets"]
        fd = os.open(path, os.O_RDONLY)
        try:
            buf = bytearray(end - begin)
            got = os.preadv(fd, [buf], data_start + begin)
        finally:
            os.close(fd)
        if got != end - begin:
            raise SpecError(f"tensor {name!r} in {path.name}: file is truncated")
        self.bytes_read += got
        return torch.frombuffer(buf, dtype=_ST_DTYPES[info["dtype"]]).reshape(info["shape"])


class _GGUFReader:
    """The :class:`_Reader` interface over a GGUF file, dequantizing each tensor read."""

    def __init__(self, path: Path) -> None:
        self.gguf = open_gguf(path)
        self.bytes_read = self.gguf.header_bytes

    def has(self, name: str) -> bool:
        return self.gguf.has(name)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.gguf.shape(name)

    def read(self, name: str) -> torch.Tensor:
        self.bytes_read += self.gguf.nbytes(name)
        return torch.from_numpy(self.gguf.read(name))


def load_slice(ckpt_dir: str | Path, start: int, end: int, dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu") -> tuple[SliceWeights, LoadReport]:
    """Weights of layers ``[start, end)`` (plus embedding / final norm / LM head where the slice needs
    them) in ``dtype`` on ``device``, from a checkpoint folder or a GGUF file. One clear error for a
    bad slice or a missing / mis-shaped tensor."""
    ckpt = checkpoint_folder(ckpt_dir)
    spec = ModelSpec.from_pretrained_dir(ckpt)
    check_slice(spec, start, end)
    reader = _GGUFReader(ckpt / GGUF_LINK) if (ckpt / GGUF_LINK).is_file() else _Reader(ckpt)
    shapes = expected_shapes(spec, start, end)
    if spec.tie_word_embeddings and not reader.has("lm_head.weight") and "lm_head.weight" in shapes:
        shapes["model.embed_tokens.weight"] = shapes.pop("lm_head.weight")
        tied = True
    else:
        tied = False
    tensors = {}
    for name, shape in shapes.items():
        if not reader.has(name):
            raise SpecError(f"checkpoint {str(ckpt)!r} lacks tensor {name!r} "
                            f"(needed by slice [{start}, {end}))")
        if reader.shape(name) != shape:
            raise SpecError(f"checkpoint {str(ckpt)!r}: tensor {name!r} has shape "
                            f"{list(reader.shape(name))}, expected {list(shape)} from config.json")
        tensors[name] = reader.read(name).to(device=device, dtype=dtype)
    report = LoadReport(reader.bytes_read, tuple(tensors))
    return _assemble(spec, start, end, tensors, tied), report


def _assemble(spec: ModelSpec, start: int, end: int, t: dict[str, torch.Tensor],
              tied: bool) -> SliceWeights:
    layers = []
    for li in range(start, end):
        p = f"model.layers.{li}."
        layers.append(LayerWeights(
            qkv=torch.cat([t.pop(p + f"self_attn.{x}_proj.weight") for x in "qkv"]).contiguous(),
            o=t.pop(p + "self_attn.o_proj.weight"),
            gate_up=torch.cat([t.pop(p + "mlp.gate_proj.weight"),
                               t.pop(p + "mlp.up_proj.weight")]).contiguous(),
            down=t.pop(p + "mlp.down_proj.weight"),
            input_norm=t.pop(p + "input_layernorm.weight"),
            post_norm=t.pop(p + "post_attention_layernorm.weight"),
        ))
    embed = t.get("model.embed_tokens.weight") if start == 0 else None
    last = end == spec.num_layers
    lm_head = (t["model.embed_tokens.weight"] if tied else t.get("lm_head.weight")) if last else None
    return SliceWeights(spec, start, end, layers, embed=embed,
                        final_norm=t.get("model.norm.weight") if last else None, lm_head=lm_head)
