"""Rotary position embeddings as LLaMA uses them (including LLaMA-3 frequency scaling).

Formulas follow Hugging Face ``transformers`` (``modeling_rope_utils``): ``inv_freq[i] = theta^(-2i/d)``;
for ``rope_type == "llama3"`` long wavelengths are divided by ``factor`` and the middle band is
interpolated smoothly (Meta's LLaMA-3.1 recipe); ``"linear"`` divides every frequency by ``factor``.
cos/sin are computed in float32 exactly as HF does (``position * inv_freq`` then ``cos``), so a table
lookup by position gives bit-identical values.
"""

from __future__ import annotations

import math

import torch

from helix.core.errors import SpecError
from helix.core.models import ModelSpec


def inverse_frequencies(spec: ModelSpec) -> torch.Tensor:
    """``[head_dim // 2]`` float32 inverse frequencies, scaled per ``spec.rope_scaling``."""
    dim = spec.head_dim
    inv_freq = 1.0 / (spec.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = spec.rope_scaling or {}
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / float(scaling["factor"])
    if rope_type == "llama3":
        return _llama3_scaled(inv_freq, scaling)
    raise SpecError(f"model {spec.name!r}: unsupported rope_scaling type {rope_type!r}; "
                    f"supported: default, linear, llama3")


def _llama3_scaled(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    factor = float(scaling["factor"])
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_context = float(scaling["original_max_position_embeddings"])
    low_freq_wavelen, high_freq_wavelen = old_context / low, old_context / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryTable:
    """cos/sin for every position up to a limit, grown on demand. Shapes ``[positions, head_dim]``."""

    def __init__(self, spec: ModelSpec, device: torch.device, dtype: torch.dtype) -> None:
        self.inv_freq = inverse_frequencies(spec).to(device)
        self.dtype = dtype
        self.cos = torch.empty(0, spec.head_dim, device=device, dtype=dtype)
        self.sin = torch.empty(0, spec.head_dim, device=device, dtype=dtype)

    def _grow(self, num_positions: int) -> None:
        n = max(num_positions, 2 * self.cos.shape[0], 256)
        freqs = torch.arange(n, device=self.inv_freq.device).float()[:, None] * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos, self.sin = emb.cos().to(self.dtype), emb.sin().to(self.dtype)

    def ensure(self, num_positions: int) -> None:
        """Make the table cover positions ``[0, num_positions)`` (grown by doubling; a host-side
        check, so it never waits for the device)."""
        if num_positions > self.cos.shape[0]:
            self._grow(num_positions)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin at ``positions`` ([num_tokens] long, all below the size :meth:`ensure` gave):
        each ``[num_tokens, 1, head_dim]``."""
        return self.cos[positions][:, None, :], self.sin[positions][:, None, :]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ([num_tokens, heads, head_dim]) by the angles in cos/sin (HF's rotate_half form)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
