"""The Attention module models use: looks up its layer's KV cache in the step context."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from octavo.attention.backend import AttentionMetadata, KVStore


@dataclass
class ForwardContext:
    """Explicit per-step state handed down the model: metadata and the per-layer KV caches."""

    attn_metadata: AttentionMetadata
    kv_caches: list[torch.Tensor]


class Attention(nn.Module):
    def __init__(self, layer_idx: int, num_heads: int, head_dim: int, scale: float,
                 num_kv_heads: int, backend) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.impl = backend.make_impl(num_heads, head_dim, scale, num_kv_heads)

    def kv_store(self, v: torch.Tensor | None, ctx: ForwardContext,
                 num_tokens: int | None = None) -> KVStore | None:
        """Where this step's new K/V go, for a kernel that writes them itself before
        attention (then ``forward(..., kv_stored=True)``); None where the backend stores them
        (or the slot mapping does not cover every token). ``v`` None: the kernel computes v
        itself (the qkv projection's, ``QKVParallelLinear.forward_rope``), for
        ``num_tokens`` tokens."""
        if not self.impl.accepts_stored_kv:
            return None
        slots = ctx.attn_metadata.slot_mapping
        t = v.shape[0] if v is not None else num_tokens
        if slots.shape[0] < t:
            return None
        kv_cache = ctx.kv_caches[self.layer_idx]
        return KVStore(v, kv_cache[0], kv_cache[1], slots[:t])

    def forward(self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None,
                ctx: ForwardContext, kv_stored: bool = False) -> torch.Tensor:
        """k and v may be None where ``kv_stored`` (nothing reads them then)."""
        return self.impl.forward(q, k, v, ctx.kv_caches[self.layer_idx], ctx.attn_metadata,
                                 kv_stored=kv_stored)
