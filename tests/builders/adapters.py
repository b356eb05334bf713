"""Adapter tasks for tests and benchmarks: random parameters of each kind written in Helix's own format
(or with ``peft`` for LoRA), and the reference a task defines: a copy of the Hugging Face model with the
task's parameters merged into its weights (a forward hook for the bottleneck, which does not merge).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

MODULE_OF = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
             "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def _linear(model, layer: int, target: str) -> torch.nn.Linear:
    return getattr(getattr(model.model.layers[layer], MODULE_OF[target]), target)


def random_task(model, kind: str, targets: tuple[str, ...], seed: int, rank: int = 8,
                density: float = 0.05, strength: float = 1.0) -> dict[str, torch.Tensor]:
    """Random parameters of ``kind`` for ``targets`` of every layer of HF ``model``, named as in
    :mod:`worker.adapter_files`' own format. ``strength`` scales how far the task moves the outputs."""
    g = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for layer in range(model.config.num_hidden_layers):
        for target in targets:
            w = _linear(model, layer, target).weight
            o, i = w.shape
            p = f"layers.{layer}.{target}."
            if kind == "lora":
                out[p + "lora_A"] = torch.randn(rank, i, generator=g) * 0.3 * strength
                out[p + "lora_B"] = torch.randn(o, rank, generator=g) * 0.3 * strength
            elif kind == "bottleneck":
                out[p + "down"] = torch.randn(rank, o, generator=g) * 0.5 * strength
                out[p + "up"] = torch.randn(o, rank, generator=g) * 0.5 * strength
            elif kind == "bitfit":
                out[p + "bias"] = torch.randn(o, generator=g) * 0.5 * strength
            else:   # diff / mask: a random share of the entries
                nnz = int(density * o * i)
                flat = torch.randperm(o * i, generator=g)[:nnz]
                idx = torch.stack([flat // i, flat % i])
                if kind == "diff":
                    out[p + "indices"] = idx
                    out[p + "values"] = torch.randn(nnz, generator=g) * 0.5 * strength
                else:
                    out[p + "pruned"] = idx
    return out


def write_task(folder: Path, kind: str, tensors: dict[str, torch.Tensor], **config) -> Path:
    """Helix's own format: ``helix_adapter.json`` + ``adapter.safetensors``."""
    from safetensors.torch import save_file
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "helix_adapter.json").write_text(json.dumps({"kind": kind, **config}))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "adapter.safetensors"))
    return folder


def merged_model(model, kind: str, tensors: dict[str, torch.Tensor], scale: float = 1.0,
                 activation: str = "relu"):
    """A copy of HF ``model`` that computes the task: its parameters merged into the weights."""
    ref = copy.deepcopy(model)
    acts = {"relu": torch.relu, "gelu": torch.nn.functional.gelu, "silu": torch.nn.functional.silu}
    params: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for name, t in tensors.items():
        _, layer, target, param = name.split(".")
        params.setdefault((int(layer), target), {})[param] = t
    with torch.no_grad():
        for (layer, target), p in params.items():
            lin = _linear(ref, layer, target)
            w = lin.weight
            if kind == "lora":
                w += scale * p["lora_B"] @ p["lora_A"]
            elif kind == "diff":
                w[p["indices"][0], p["indices"][1]] += p["values"]
            elif kind == "mask":
                mask = torch.ones_like(w)
                mask[p["pruned"][0], p["pruned"][1]] = 0
                w *= mask
            elif kind == "bitfit":
                lin.bias = torch.nn.Parameter(p["bias"].clone())
            else:
                down, up, act = p["down"], p["up"], acts[activation]
                lin.register_forward_hook(
                    lambda mod, inp, out, down=down, up=up, act=act: out + act(out @ down.T) @ up.T)
    return ref


def write_peft_lora(model, folder: Path, targets: tuple[str, ...], rank: int = 8, alpha: int = 16,
                    seed: int = 0):
    """Write a LoRA of HF ``model`` with the ``peft`` package (random A and B); returns the PEFT
    model (the reference: it computes the task itself)."""
    from peft import LoraConfig, get_peft_model
    torch.manual_seed(seed)
    cfg = LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets), init_lora_weights=False,
                     lora_dropout=0.0)
    peft_model = get_peft_model(copy.deepcopy(model), cfg).eval()
    with torch.no_grad():   # larger than peft's init so the task visibly changes the outputs
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn_like(p) * 0.3)
    peft_model.save_pretrained(folder)
    return peft_model
