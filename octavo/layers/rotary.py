"""Rotary position embeddings (NeoX / HF Llama style: rotate halves), with a registry of RoPE
scaling variants read from the HF config."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

# name -> function(inv_freq, rope_scaling dict, head_dim, base) -> (inv_freq, position scale)
_SCALINGS: dict[str, Callable] = {}


def register_rope_scaling(name: str):
    def deco(fn):
        _SCALINGS[name] = fn
        return fn
    return deco


@register_rope_scaling("default")
def _default(inv_freq, cfg, head_dim, base):
    return inv_freq, 1.0


@register_rope_scaling("linear")
def _linear(inv_freq, cfg, head_dim, base):
    return inv_freq, 1.0 / float(cfg["factor"])


@register_rope_scaling("llama3")
def _llama3(inv_freq, cfg, head_dim, base):
    factor = cfg["factor"]
    low, high = cfg.get("low_freq_factor", 1.0), cfg.get("high_freq_factor", 4.0)
    old_len = cfg["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled), 1.0


def rope_params_from_config(hf_config) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling) from either the transformers-5 ``rope_parameters`` form or
    the older top-level ``rope_theta`` / ``rope_scaling``."""
    params = getattr(hf_config, "rope_parameters", None) or {}
    theta = params.get("rope_theta", getattr(hf_config, "rope_theta", None)) or 10000.0
    scaling = getattr(hf_config, "rope_scaling", None)
    if params and params.get("rope_type", "default") != "default":
        scaling = dict(params)
    if scaling is not None:
        scaling = dict(scaling)
        scaling.setdefault("rope_type", scaling.get("type", "default"))
        if scaling["rope_type"] == "default":
            scaling = None
    return float(theta), scaling


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_position: int, base: float,
                 rope_scaling: dict | None = None) -> None:
        super().__init__()
        self.head_dim = head_dim
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float()
                                   / head_dim))
        kind = (rope_scaling or {}).get("rope_type", "default")
        if kind not in _SCALINGS:
            raise ValueError(f"rope_scaling type {kind!r} is not supported "
                             f"(known: {sorted(_SCALINGS)})")
        inv_freq, pos_scale = _SCALINGS[kind](inv_freq, rope_scaling or {}, head_dim, base)
        t = torch.arange(max_position, dtype=torch.float32) * pos_scale
        freqs = torch.outer(t, inv_freq.float())
        emb = torch.cat((freqs, freqs), dim=-1)
        # Kept in float32 and cast per call: matches HF, which computes cos/sin in float32.
        self.register_buffer("cos_cache", emb.cos(), persistent=False)
        self.register_buffer("sin_cache", emb.sin(), persistent=False)
        self._step_positions: torch.Tensor | None = None
        self._step_cos = self._step_sin = self.cos_cache[:0]
        half = head_dim // 2
        # [max_pos, head_dim]: cos of each frequency, then sin, for the fused kernel.
        self.register_buffer("cos_sin_cache", torch.cat(
            (emb.cos()[:, :half], emb.sin()[:, :half]), dim=-1).contiguous(), persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [T, Hq, D], k: [T, Hkv, D] -> rotated (in place on CUDA with Triton).

        One instance serves every layer (see ``get_rope``); cos/sin of a step's positions are
        gathered once and reused by the following layers."""
        if q.is_cuda:
            from octavo.kernels.triton_utils import HAS_TRITON

            if HAS_TRITON:
                from octavo.kernels.rotary import rotary_embedding

                rotary_embedding(positions, q, k, self.cos_sin_cache, self.head_dim)
                return q, k
        if self._step_positions is not positions or self._step_cos.dtype != q.dtype:
            self._step_positions = positions
            self._step_cos = self.cos_cache[positions].to(q.dtype).unsqueeze(1)
            self._step_sin = self.sin_cache[positions].to(q.dtype).unsqueeze(1)
        cos, sin = self._step_cos, self._step_sin
        return _apply(q, cos, sin), _apply(k, cos, sin)


def _apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def get_rope(head_dim: int, max_position: int, base: float, rope_scaling: dict | None,
             cache: dict) -> RotaryEmbedding:
    """One RotaryEmbedding per distinct configuration within a model (``cache`` is owned by the
    model), so 30 layers share one table instead of holding 30 copies."""
    key = (head_dim, max_position, base, repr(sorted((rope_scaling or {}).items())))
    if key not in cache:
        cache[key] = RotaryEmbedding(head_dim, max_position, base, rope_scaling)
    return cache[key]
