"""Read one task's adapter files, only the parts of one slice's layers.

Two layouts, told apart by the JSON file in the folder:

* **PEFT LoRA** (what ``peft``'s ``save_pretrained`` writes): ``adapter_config.json`` (``r``,
  ``lora_alpha``, ``use_rslora``, ``target_modules``) and ``adapter_model.safetensors`` with
  ``base_model.model.model.layers.{L}.{self_attn|mlp}.{target}.lora_A.weight`` ``[r, in]`` and
  ``…lora_B.weight`` ``[out, r]``; scale ``lora_alpha / r`` (``/ sqrt(r)`` with rsLoRA).
* **Helix's own** for every kind: ``helix_adapter.json`` ``{"kind": ..., "activation": "relu",
  "scale": 1.0}`` and ``adapter.safetensors`` with ``layers.{L}.{target}.{param}``, ``L`` the model
  layer and ``target`` one of :data:`worker.adapters.TARGETS`:

  ========== ================================================================
  lora       ``lora_A`` ``[r, in]``, ``lora_B`` ``[out, r]`` (``scale`` in the JSON)
  bottleneck ``down`` ``[r, out]``, ``up`` ``[out, r]`` (``activation`` in the JSON)
  bitfit     ``bias`` ``[out]``
  diff       ``indices`` ``[2, nnz]`` int64 (row, column), ``values`` ``[nnz]``
  mask       ``pruned`` ``[2, nnz]`` int64: the entries whose mask bit is 0
  ========== ================================================================

Tensors are read memory-mapped and only for the slice's layers. Every shape is checked against the
base model; a wrong one is an error naming the tensor. :func:`probe_adapter` does the same checks
from the files' headers alone (no tensor is read): registering a task that stays on disk until a
request needs it (:mod:`worker.adapter_cache`).
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch

from helix.core.errors import HelixUserError
from worker.adapters import (ACTIVATIONS, KINDS, TARGETS, BiasTerm, BottleneckTerm, LoRATerm, SliceAdapter,
                             TermAt, pack_adapter, sparse_term, target_columns, target_shape)
from worker.model import SliceWeights

_PEFT_KEY = re.compile(r"(?:base_model\.model\.)?model\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\."
                       r"(lora_A|lora_B)(?:\.\w+)?\.weight")
_OWN_KEY = re.compile(r"layers\.(\d+)\.(\w+)\.(\w+)")
_PARAMS = {"lora": ("lora_A", "lora_B"), "bottleneck": ("down", "up"), "bitfit": ("bias",),
           "diff": ("indices", "values"), "mask": ("pruned",)}


@dataclass(frozen=True)
class AdapterLimits:
    """What a worker accepts from one task."""

    max_rank: int = 64
    """Largest LoRA rank / bottleneck width (vLLM's ``max_lora_rank`` plays the same part)."""
    max_sparse_fraction: float = 0.1
    """Largest share of a weight a diff or mask may touch (beyond it the sparse form costs more
    than a merged copy)."""


def read_adapter(name: str, path: str | Path, weights: SliceWeights,
                 limits: AdapterLimits = AdapterLimits(),
                 headers_only: bool = False) -> SliceAdapter | AdapterProbe:
    """Task ``name``'s terms for the layers of ``weights`` (its slice), from folder ``path``.
    ``headers_only``: check the headers alone (see :func:`probe_adapter`)."""
    folder = Path(path)
    if (folder / "adapter_config.json").is_file():
        return _read_peft(name, folder, weights, limits, headers_only)
    if (folder / "helix_adapter.json").is_file():
        return _read_own(name, folder, weights, limits, headers_only)
    raise HelixUserError(f"adapter {name!r}: {str(folder)!r} has neither adapter_config.json (PEFT LoRA) "
                         f"nor helix_adapter.json")


@dataclass(frozen=True)
class AdapterProbe:
    """A task as its files' headers describe it: what :func:`probe_adapter` checked."""

    name: str
    kind: str
    source: str
    nbytes: int
    """What its terms for the slice hold once read (diff and mask: at most, as repeated indices
    merge)."""


def probe_adapter(name: str, path: str | Path, weights: SliceWeights,
                  limits: AdapterLimits = AdapterLimits()) -> AdapterProbe:
    """Task ``name`` checked from its files' headers only (the JSON, tensor names, shapes and
    dtypes; no tensor is read, so it costs the same whatever the task's size): the errors of
    :func:`read_adapter` but those that need the values (sparse indices outside the weight)."""
    return read_adapter(name, path, weights, limits, headers_only=True)


def _config(name: str, file: Path) -> dict:
    try:
        return json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise HelixUserError(f"adapter {name!r}: cannot read {file.name}: {exc}") from None


class _Tensors:
    """The slice's tensors of one safetensors file, by (model layer, target) -> {param: tensor}."""

    def __init__(self, name: str, file: Path, pattern: re.Pattern, weights: SliceWeights,
                 headers_only: bool = False) -> None:
        from safetensors import safe_open
        if not file.is_file():
            raise HelixUserError(f"adapter {name!r}: {file.name} is missing in {str(file.parent)!r}")
        self.name, self.file, self.headers_only = name, file, headers_only
        self.parts: dict[tuple[int, str], dict[str, tuple[str, torch.Tensor | _Header]]] = defaultdict(dict)
        try:
            f = safe_open(str(file), framework="pt")
        except Exception as exc:   # not a safetensors file, a header that lies about the sizes
            raise HelixUserError(f"adapter {name!r}: cannot read {file.name}: {exc}") from None
        with f:
            for key in f.keys():
                m = pattern.fullmatch(key)
                if m is None:
                    raise HelixUserError(f"adapter {name!r}: tensor {key!r} in {file.name} is not a "
                                         f"layer's {'/'.join(TARGETS)} parameter")
                layer, target, param = int(m[1]), m[2], m[3]
                if target not in TARGETS:
                    raise HelixUserError(f"adapter {name!r}: tensor {key!r} adapts {target!r}; "
                                         f"supported: {', '.join(TARGETS)}")
                if not 0 <= layer < weights.spec.num_layers:
                    raise HelixUserError(f"adapter {name!r}: tensor {key!r} names layer {layer}; the model "
                                         f"has {weights.spec.num_layers}")
                if weights.start <= layer < weights.end:   # only this slice's layers are read
                    self.parts[(layer, target)][param] = (key, self._read(f, key))

    def _read(self, f, key: str) -> torch.Tensor | _Header:
        try:
            return _header(f, key) if self.headers_only else f.get_tensor(key)
        except Exception as exc:   # e.g. a dtype torch has no kind for, a file cut short since
            raise HelixUserError(f"adapter {self.name!r}: cannot read tensor {key!r} of "
                                 f"{self.file.name}: {exc}") from None

    def expect(self, key: str, t: torch.Tensor | _Header, shape: tuple[int, ...], what: str) -> None:
        if tuple(t.shape) != shape:
            raise HelixUserError(f"adapter {self.name!r}: tensor {key!r} has shape {list(t.shape)}, "
                                 f"expected {list(shape)} ({what})")


_ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
              "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
              "BOOL": torch.bool}


@dataclass(frozen=True)
class _Header:
    """A tensor as its file's header describes it (nothing read)."""

    shape: tuple[int, ...]
    dtype: torch.dtype


def _header(f, key: str) -> _Header:
    piece = f.get_slice(key)
    return _Header(tuple(piece.get_shape()), _ST_DTYPES.get(piece.get_dtype(), torch.uint8))


def _read_peft(name: str, folder: Path, weights: SliceWeights, limits: AdapterLimits,
               headers_only: bool = False) -> SliceAdapter | AdapterProbe:
    cfg = _config(name, folder / "adapter_config.json")
    if cfg.get("peft_type", "LORA") != "LORA":
        raise HelixUserError(f"adapter {name!r}: peft_type {cfg.get('peft_type')!r} is not LORA")
    for flag in ("use_dora", "fan_in_fan_out", "lora_bias", "modules_to_save", "trainable_token_indices",
                 "layer_replication"):
        if cfg.get(flag):
            raise HelixUserError(f"adapter {name!r}: {flag}={cfg[flag]!r} is not supported")
    if cfg.get("bias", "none") != "none" or cfg.get("rank_pattern") or cfg.get("alpha_pattern"):
        raise HelixUserError(f"adapter {name!r}: only bias='none' and no rank_pattern / alpha_pattern "
                             f"are supported")
    r = cfg.get("r")
    if not isinstance(r, int) or r < 1:
        raise HelixUserError(f"adapter {name!r}: adapter_config.json needs an integer r >= 1, got {r!r}")
    alpha = float(cfg.get("lora_alpha", r))
    scale = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
    tensors = _Tensors(name, folder / "adapter_model.safetensors", _PEFT_KEY, weights, headers_only)
    return _assemble(name, "lora", str(folder), tensors, weights, limits, scale=scale, rank=r)


def _read_own(name: str, folder: Path, weights: SliceWeights, limits: AdapterLimits,
              headers_only: bool = False) -> SliceAdapter | AdapterProbe:
    cfg = _config(name, folder / "helix_adapter.json")
    kind = cfg.get("kind")
    if kind not in KINDS:
        raise HelixUserError(f"adapter {name!r}: kind {kind!r}; known: {', '.join(KINDS)}")
    activation = cfg.get("activation", "relu")
    if activation not in ACTIVATIONS:
        raise HelixUserError(f"adapter {name!r}: activation {activation!r}; known: {', '.join(ACTIVATIONS)}")
    tensors = _Tensors(name, folder / "adapter.safetensors", _OWN_KEY, weights, headers_only)
    return _assemble(name, kind, str(folder), tensors, weights, limits,
                     scale=float(cfg.get("scale", 1.0)), activation=activation)


def _assemble(name: str, kind: str, source: str, tensors: _Tensors, weights: SliceWeights,
              limits: AdapterLimits, **options) -> SliceAdapter | AdapterProbe:
    layers: dict[int, dict[str, list[TermAt]]] = defaultdict(lambda: defaultdict(list))
    nbytes = 0   # headers only: what the terms will hold
    for (layer, target), params in sorted(tensors.parts.items()):
        missing = [p for p in _PARAMS[kind] if p not in params]
        extra = [key for p, (key, _) in params.items() if p not in _PARAMS[kind]]
        if missing or extra:
            raise HelixUserError(f"adapter {name!r} ({kind}): layer {layer} {target} "
                                 + (f"lacks {', '.join(missing)}" if missing else f"has unexpected {extra}"))
        term = _TERM_READERS[kind](tensors, params, weights, layer, target, limits, options)
        if isinstance(term, int):
            nbytes += term
            continue
        linear, start, end = target_columns(weights.spec, target)
        layers[layer - weights.start][linear].append(TermAt(start, end, target, term))
    if tensors.headers_only:
        return AdapterProbe(name, kind, source, nbytes)
    return pack_adapter(SliceAdapter(name, kind, {k: dict(v) for k, v in layers.items()}, source))


def _dense(tensors: _Tensors, params: dict, param: str, shape: tuple[int, ...], what: str,
           like: torch.Tensor) -> torch.Tensor | _Header:
    """The tensor, checked, in the base weights' dtype and on their device (as ``like``; a copy
    from host to device on a GPU worker)."""
    key, t = params[param]
    tensors.expect(key, t, shape, what)
    return t if isinstance(t, _Header) else t.to(like)


def _held_bytes(like: torch.Tensor, *headers: _Header) -> int:
    """Bytes the dense tensors of these headers hold once read (in the weights' dtype)."""
    return sum(math.prod(h.shape) for h in headers) * like.element_size()


def _check_rank(tensors: _Tensors, key: str, r: int, limits: AdapterLimits) -> None:
    if r > limits.max_rank:
        raise HelixUserError(f"adapter {tensors.name!r}: tensor {key!r} has rank {r}, over the limit "
                             f"max_rank={limits.max_rank}")


def _lora(tensors, params, weights, layer, target, limits, options) -> LoRATerm | int:
    out, inp = target_shape(weights.spec, target)
    key, a = params["lora_A"]
    r = options.get("rank", a.shape[0])
    _check_rank(tensors, key, r, limits)
    like, what = weights.layers[0].o, f"{target} is {out} x {inp}, rank {r}"
    a = _dense(tensors, params, "lora_A", (r, inp), what, like)
    b = _dense(tensors, params, "lora_B", (out, r), what, like)
    return _held_bytes(like, a, b) if tensors.headers_only else LoRATerm(a, b, options["scale"])


def _bottleneck(tensors, params, weights, layer, target, limits, options) -> BottleneckTerm | int:
    out, _ = target_shape(weights.spec, target)
    key, down = params["down"]
    r = down.shape[0]
    _check_rank(tensors, key, r, limits)
    like, what = weights.layers[0].o, f"{target} has {out} outputs, width {r}"
    down = _dense(tensors, params, "down", (r, out), what, like)
    up = _dense(tensors, params, "up", (out, r), what, like)
    if tensors.headers_only:
        return _held_bytes(like, down, up)
    return BottleneckTerm(down, up, options["activation"])


def _bitfit(tensors, params, weights, layer, target, limits, options) -> BiasTerm | int:
    out, _ = target_shape(weights.spec, target)
    like = weights.layers[0].o
    bias = _dense(tensors, params, "bias", (out,), f"{target} has {out} outputs", like)
    return _held_bytes(like, bias) if tensors.headers_only else BiasTerm(bias)


def _indices(tensors: _Tensors, params: dict, param: str, shape: tuple[int, int],
             limits: AdapterLimits) -> torch.Tensor | _Header:
    key, idx = params[param]
    if len(idx.shape) != 2 or idx.shape[0] != 2 or idx.dtype not in (torch.int64, torch.int32):
        raise HelixUserError(f"adapter {tensors.name!r}: tensor {key!r} must be [2, nnz] integer "
                             f"(row, column) indices, got {list(idx.shape)} {idx.dtype}")
    if idx.shape[1] > limits.max_sparse_fraction * shape[0] * shape[1]:
        raise HelixUserError(f"adapter {tensors.name!r}: tensor {key!r} touches {idx.shape[1]} of "
                             f"{shape[0] * shape[1]} weights, over max_sparse_fraction="
                             f"{limits.max_sparse_fraction}")
    if isinstance(idx, _Header):
        return idx
    idx = idx.long()
    if idx.numel() and (idx.min() < 0 or idx[0].max() >= shape[0] or idx[1].max() >= shape[1]):
        raise HelixUserError(f"adapter {tensors.name!r}: tensor {key!r} has indices outside the "
                             f"{shape[0]} x {shape[1]} weight")
    return idx


def _sparse_bytes(nnz: int, rows: int, like: torch.Tensor) -> int:
    """What a sparse term of ``nnz`` entries holds (at most: repeated indices merge): CSR row
    pointers and column indices (int64) and the values, kept as :func:`~worker.adapters.sparse_term`
    keeps them (float32 on CPU for half precision)."""
    half_on_cpu = like.device.type == "cpu" and like.dtype in (torch.float16, torch.bfloat16)
    return (rows + 1) * 8 + nnz * (8 + (4 if half_on_cpu else like.element_size()))


def _diff(tensors, params, weights, layer, target, limits, options):
    shape = target_shape(weights.spec, target)
    idx = _indices(tensors, params, "indices", shape, limits)
    like = weights.layers[0].o
    values = _dense(tensors, params, "values", (idx.shape[1],), "one value per index", like)
    if tensors.headers_only:
        return _sparse_bytes(idx.shape[1], shape[0], like)
    return sparse_term(idx.to(values.device), values, shape)


def _mask(tensors, params, weights, layer, target, limits, options):
    shape = target_shape(weights.spec, target)
    idx = _indices(tensors, params, "pruned", shape, limits)
    if tensors.headers_only:
        return _sparse_bytes(idx.shape[1], shape[0], weights.layers[0].o)
    linear, start, end = target_columns(weights.spec, target)
    w = getattr(weights.layers[layer - weights.start], linear)[start:end]   # [out, in] of the target
    # X·(M⊙W) = X·W − X·(M̄⊙W): the correction holds the pruned weights, negated.
    idx = idx.to(w.device)
    return sparse_term(idx, -w[idx[0], idx[1]], shape)


_TERM_READERS = {"lora": _lora, "bottleneck": _bottleneck, "bitfit": _bitfit, "diff": _diff, "mask": _mask}
