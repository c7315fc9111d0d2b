"""RoPE scaling variants: a registry from ``rope_type`` to the inverse frequencies and the
attention factor that multiplies cos/sin. The arithmetic follows transformers'
``modeling_rope_utils`` operation by operation, so the float32 tables agree with it bit for bit
(a one-ulp change of a frequency moves the angle at position 10^4 by ~10^-3).

Every variant returns one fixed table: a paged engine batches sequences of different lengths
in one step, so no frequency may depend on the batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

# name -> fn(rope_scaling, head_dim, base, max_position_embeddings) -> (inv_freq, attn factor)
ScalingFn = Callable[[dict, int, float, int], tuple[torch.Tensor, float]]
_SCALINGS: dict[str, ScalingFn] = {}


def register_rope_scaling(name: str):
    def deco(fn: ScalingFn) -> ScalingFn:
        _SCALINGS[name] = fn
        return fn
    return deco


def rope_inv_freq(rope_scaling: dict | None, head_dim: int, base: float,
                  max_position_embeddings: int) -> tuple[torch.Tensor, float]:
    """(inv_freq [head_dim // 2] float32, factor applied to cos and sin)."""
    kind = (rope_scaling or {}).get("rope_type", "default")
    if kind not in _SCALINGS:
        raise ValueError(f"rope_scaling type {kind!r} is not supported "
                         f"(known: {sorted(_SCALINGS)})")
    partial = (rope_scaling or {}).get("partial_rotary_factor")
    if partial is not None and float(partial) != 1.0:
        raise ValueError(f"partial_rotary_factor={partial} is not supported (only 1.0)")
    return _SCALINGS[kind](rope_scaling or {}, head_dim, base, max_position_embeddings)


def _unscaled(base: float, dim: int) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


@register_rope_scaling("default")
def _default(cfg, head_dim, base, max_pos):
    return _unscaled(base, head_dim), 1.0


@register_rope_scaling("linear")
def _linear(cfg, head_dim, base, max_pos):
    """Position interpolation: every frequency divided by ``factor``."""
    return _unscaled(base, head_dim) / float(cfg["factor"]), 1.0


@register_rope_scaling("llama3")
def _llama3(cfg, head_dim, base, max_pos):
    inv_freq = _unscaled(base, head_dim)
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


def dynamic_ntk_seq_len(max_position_embeddings: int, factor: float) -> int:
    """The sequence length the static dynamic-NTK table is computed for."""
    return int(max_position_embeddings * factor)


@register_rope_scaling("dynamic")
def _dynamic(cfg, head_dim, base, max_pos):
    """Dynamic NTK-aware scaling, as one static table (vLLM's choice).

    transformers recomputes the base at every forward from the current sequence length L:
    ``base * (factor * L / max_pos - (factor - 1)) ** (d / (d - 2))`` for L > max_pos, plain
    RoPE below. That makes a token's rotation depend on how long its sequence is at that
    moment (and keys cached earlier keep their old rotation), which a paged engine batching
    sequences of different lengths cannot reproduce. Here L is fixed at the longest length the
    table serves, ``max_position_embeddings * factor`` (``dynamic_ntk_seq_len``), for every
    position. Consequence: outputs differ from transformers even for sequences shorter than
    ``max_position_embeddings`` (transformers uses plain RoPE there); they equal transformers'
    ``_compute_dynamic_ntk_parameters`` evaluated at that L.
    """
    factor = cfg["factor"]
    seq_len = dynamic_ntk_seq_len(max_pos, factor)
    base = base * ((factor * seq_len / max_pos) - (factor - 1)) ** (head_dim / (head_dim - 2))
    return _unscaled(base, head_dim), 1.0


def _yarn_attention_factor(cfg: dict, factor: float) -> float:
    """The ``mscale`` that multiplies cos and sin: ``attention_factor`` if given, else
    0.1 * ln(factor) + 1 (or the ratio of two such terms with ``mscale`` / ``mscale_all_dim``)."""
    if cfg.get("attention_factor") is not None:
        return float(cfg["attention_factor"])

    def mscale_of(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    mscale, mscale_all_dim = cfg.get("mscale"), cfg.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return float(mscale_of(factor, mscale) / mscale_of(factor, mscale_all_dim))
    return mscale_of(factor)


def _yarn_dims(rotations: float, dim: int, base: float, old_len: int) -> float:
    """The (fractional) frequency index that turns ``rotations`` times over ``old_len``."""
    return (dim * math.log(old_len / (rotations * 2 * math.pi))) / (2 * math.log(base))


@register_rope_scaling("yarn")
def _yarn(cfg, head_dim, base, max_pos):
    """YaRN: high frequencies (more than ``beta_fast`` turns over the pretraining window) kept,
    low ones (fewer than ``beta_slow``) interpolated by ``factor``, a linear ramp between; cos
    and sin scaled by the attention factor. ``truncate`` (default True) rounds the ramp's ends
    outward to whole dimensions."""
    factor = float(cfg["factor"])
    old_len = cfg["original_max_position_embeddings"]
    beta_fast, beta_slow = cfg.get("beta_fast") or 32, cfg.get("beta_slow") or 1
    low = _yarn_dims(beta_fast, head_dim, base, old_len)
    high = _yarn_dims(beta_slow, head_dim, base, old_len)
    if cfg.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # keep the ramp finite
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: extrapolate (original frequency), 0: interpolate (divided by factor)
    pos_freqs = base ** (torch.arange(0, head_dim, 2).float() / head_dim)
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - keep) + (1.0 / pos_freqs) * keep
    return inv_freq, _yarn_attention_factor(cfg, factor)
