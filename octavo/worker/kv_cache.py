"""KV cache tensors: one [2, num_blocks, block_size, Hkv, D] tensor per layer, and sizing."""

from __future__ import annotations

import mmap
import warnings

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
    if device.type == "cpu":
        return [lazy_zeros(shape, dtype) for _ in range(num_layers)]
    return [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]


def lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zeroed CPU tensor on an anonymous memory map: the OS hands out zero pages as they are
    first touched, so the KV pool's resident memory follows the blocks requests actually use
    (torch.zeros writes every page: a 4 GiB pool was 4 GiB of RSS before the first request)."""
    n = 1
    for s in shape:
        n *= s
    nbytes = n * torch.empty((), dtype=dtype).element_size()
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    buf = mmap.mmap(-1, nbytes)  # the tensor keeps the map alive
    with warnings.catch_warnings():  # "non-writable buffer" is about read-only ones: not ours
        warnings.simplefilter("ignore")
        return torch.frombuffer(buf, dtype=dtype).view(shape)
