"""Rotary position embeddings (NeoX / HF Llama style: rotate halves), one fixed cos/sin table
per model, scaled by the variant named in the HF config (``rope_scaling.py``)."""

from __future__ import annotations

import torch
from torch import nn

from octavo.kernels import cpu as cpu_kernels
from octavo.layers.rope_params import rope_max_position
from octavo.layers.rope_scaling import rope_inv_freq


class RotaryEmbedding(nn.Module):
    """``max_position`` is the config's ``max_position_embeddings``; the table covers
    ``rope_max_position(max_position, rope_scaling)`` positions (longer for linear, dynamic
    and yarn scaling)."""

    # NeoX pairs (x[i], x[i + D/2]) over the whole head: what the kernels that rotate in a
    # projection's store (OCTAVO_FUSED_QKV_ROPE) assume.
    is_neox = True

    def __init__(self, head_dim: int, max_position: int, base: float,
                 rope_scaling: dict | None = None) -> None:
        super().__init__()
        self.head_dim = head_dim
        inv_freq, attention_factor = rope_inv_freq(rope_scaling, head_dim, base, max_position)
        self.num_positions = rope_max_position(max_position, rope_scaling)
        t = torch.arange(self.num_positions, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq.float())
        cos, sin = freqs.cos(), freqs.sin()
        if attention_factor != 1.0:  # yarn's mscale, applied to cos and sin as in HF
            cos, sin = cos * attention_factor, sin * attention_factor
        # [positions, head_dim]: cos of each frequency, then sin. One float32 table (HF computes
        # cos/sin in float32) serves the fused kernel and the torch path; at 128k positions a
        # table is 64 MiB for head_dim 128, so there is no second, duplicated layout.
        self.register_buffer("cos_sin_cache", torch.cat((cos, sin), dim=-1).contiguous(),
                             persistent=False)
        self._step_positions: torch.Tensor | None = None
        self._step_cos = self._step_sin = self.cos_sin_cache[:0]

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [T, Hq, D], k: [T, Hkv, D] -> rotated (in place with Triton on CUDA and with the
        C++ kernels on the CPU).

        One instance serves every layer (see ``get_rope``); cos/sin of a step's positions are
        gathered once and reused by the following layers."""
        if _triton_kernels(q):
            from octavo.kernels.rotary import rotary_embedding

            rotary_embedding(positions, q, k, self.cos_sin_cache, self.head_dim)
            return q, k
        ops = cpu_kernels.ops_for(q)
        if (ops is not None and q.dim() == 3 and k.dim() == 3 and q.stride(-1) == 1
                and k.stride(-1) == 1 and k.dtype == q.dtype
                and positions.dtype == torch.int64 and positions.is_contiguous()
                and self.cos_sin_cache.dtype == torch.float32):
            ops.rotary_embedding(positions, q, k, self.cos_sin_cache, self.head_dim)
            return q, k
        if self._step_positions is not positions or self._step_cos.dtype != q.dtype:
            self._step_positions = positions
            cos, sin = self.cos_sin_cache[positions].to(q.dtype).chunk(2, dim=-1)
            self._step_cos = torch.cat((cos, cos), dim=-1).unsqueeze(1)
            self._step_sin = torch.cat((sin, sin), dim=-1).unsqueeze(1)
        cos, sin = self._step_cos, self._step_sin
        return _apply(q, cos, sin), _apply(k, cos, sin)

    def rotate_and_store(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                         kv_store) -> bool:
        """On CUDA with Triton: rotate q and k in place and write k and ``kv_store.v`` into the
        paged cache in the same launch (``octavo.kernels.rotary``), so the attention backend
        does not store them again. False, with nothing done, where that kernel cannot."""
        if not _triton_kernels(q):
            return False
        from octavo.kernels.rotary import rotary_embedding, supports_kv_store

        if not supports_kv_store(q, k, self.cos_sin_cache, self.head_dim):
            return False
        rotary_embedding(positions, q, k, self.cos_sin_cache, self.head_dim, kv_store=kv_store)
        return True


def _triton_kernels(q: torch.Tensor) -> bool:
    """Whether q's rotation runs the Triton kernel (CUDA, Triton installed)."""
    if not q.is_cuda:
        return False
    from octavo.kernels.triton_utils import HAS_TRITON

    return HAS_TRITON


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
