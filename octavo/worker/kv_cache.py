"""KV cache tensors: one [2, num_blocks, block_size, Hkv, D] tensor per layer, and sizing."""

from __future__ import annotations

import torch


def kv_bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                       dtype: torch.dtype) -> int:
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * block_size * num_kv_heads * head_dim * elem


def allocate_kv_caches(backend, num_layers: int, num_blocks: int, block_size: int,
                       num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                       device: torch.device) -> list[torch.Tensor]:
    shape = backend.kv_cache_shape(num_blocks, block_size, num_kv_heads, head_dim)
    # Zeroed: padded gathers read unused slots, which must hold finite values.
    return [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
