"""Attention backend interface: the KV cache layout, per-step metadata, and the per-layer impl."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class AttentionMetadata:
    """Per-step batch layout, built once per step and shared by every layer.

    Token t of the flat batch belongs to request b with query_start_loc[b] <= t <
    query_start_loc[b+1]; request b's context (cached + new) is seq_lens[b] tokens long.
    """

    num_tokens: int
    num_reqs: int
    query_start_loc: torch.Tensor  # int32 [B+1], device
    seq_lens: torch.Tensor  # int32 [B], device
    block_tables: torch.Tensor  # int32 [B, max_blocks], device
    slot_mapping: torch.Tensor  # int64 [T], device; -1 = do not store
    max_query_len: int
    max_seq_len: int
    # Host copies for backends that loop on the CPU side.
    query_start_loc_cpu: list[int]
    seq_lens_cpu: list[int]
    # Tensors a backend derives from the above once per step and reuses in every layer
    # (slot rows, gather indices, masks). Lives and dies with this step's metadata. Beware:
    # the CUDA graph runner warms up eagerly and then captures with one metadata object, so
    # a tensor cached during warm-up would be read by the graph after it is freed; a backend
    # that caches here on a captured path must key the entry by
    # torch.cuda.is_current_stream_capturing() (this aborted the engine once, session 14).
    derived: dict = field(default_factory=dict)

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1


@dataclass
class KVStore:
    """Where a step's new K/V go (``v`` [T, Hkv, D], the caches [num_blocks, block_size, Hkv,
    D], ``slots`` [T], -1 = not stored), for a kernel before attention that writes them
    itself (fused with the rotation), so the backend does not. ``v`` None: the kernel computes
    v itself (the qkv projection's store, ``QKVParallelLinear.forward_rope``)."""

    v: torch.Tensor | None
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    slots: torch.Tensor


class AttentionImpl:
    """One attention layer's computation: store new K/V, attend over the paged cache."""

    # Whether forward(..., kv_stored=True) is allowed: K/V stored by the caller (KVStore).
    accepts_stored_kv = False

    def __init__(self, num_heads: int, head_dim: int, scale: float, num_kv_heads: int) -> None:
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.scale = scale
        self.num_kv_heads = num_kv_heads

    def forward(self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None,
                kv_cache: torch.Tensor, meta: AttentionMetadata,
                kv_stored: bool = False) -> torch.Tensor:
        """q [T, Hq, D], k/v [T, Hkv, D], kv_cache [2, num_blocks, block_size, Hkv, D]
        -> [T, Hq, D]. ``kv_stored``: the caller already wrote k/v into the cache (only
        where ``accepts_stored_kv``); k and v may then be None (the fused qkv projection
        keeps no k or v)."""
        raise NotImplementedError


class AttentionBackend:
    name: str = ""
    impl_cls: type[AttentionImpl] = AttentionImpl

    @staticmethod
    def kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int,
                       head_dim: int) -> tuple[int, ...]:
        return (2, num_blocks, block_size, num_kv_heads, head_dim)

    @classmethod
    def make_impl(cls, num_heads: int, head_dim: int, scale: float,
                  num_kv_heads: int) -> AttentionImpl:
        return cls.impl_cls(num_heads, head_dim, scale, num_kv_heads)

    @staticmethod
    def supports(device: torch.device) -> bool:
        return True
