"""reshape_and_cache (Triton) against reshape_and_cache_ref."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from octavo.kernels.reshape_and_cache import (  # noqa: E402
    reshape_and_cache,
    reshape_and_cache_ref,
)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def run_both(key, value, key_cache, value_cache, slot_mapping):
    kc1, vc1 = key_cache.clone(), value_cache.clone()
    kc2, vc2 = key_cache.clone(), value_cache.clone()
    reshape_and_cache(key, value, kc1, vc1, slot_mapping)
    reshape_and_cache_ref(key, value, kc2, vc2, slot_mapping)
    assert torch.equal(kc1, kc2) and torch.equal(vc1, vc2)
    return kc1, vc1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(2, 16), (3, 24), (1, 64)])  # (Hkv, D)
@pytest.mark.parametrize("block_size", [4, 16])
def test_reshape_and_cache(dtype, shape, block_size, device):
    num_blocks, num_tokens = 6, 13
    key = torch.randn(num_tokens, *shape, device=device).to(dtype)
    value = torch.randn(num_tokens, *shape, device=device).to(dtype)
    key_cache = torch.zeros(num_blocks, block_size, *shape, device=device, dtype=dtype)
    value_cache = torch.zeros_like(key_cache)
    slots = torch.randperm(num_blocks * block_size, device=device)[:num_tokens]
    slots[3] = -1  # padding token: not stored
    kc, vc = run_both(key, value, key_cache, value_cache, slots)
    s = int(slots[0])
    assert torch.equal(kc[s // block_size, s % block_size], key[0])
    assert torch.equal(vc[s // block_size, s % block_size], value[0])
    assert int((kc != 0).any(-1).any(-1).sum()) == num_tokens - 1


def test_strided_key_value_from_fused_qkv(device):
    # K and V as views into a fused [T, H + 2*Hkv, D] projection output.
    qkv = torch.randn(7, 4 + 2 + 2, 16, device=device)
    key, value = qkv[:, 4:6], qkv[:, 6:8]
    key_cache = torch.zeros(3, 4, 2, 16, device=device)
    slots = torch.tensor([0, 5, 6, 7, 1, 11, 2], device=device)
    run_both(key, value, key_cache, key_cache.clone(), slots)


@pytest.mark.gpu
@needs_cuda
def test_gpu_real_shapes():
    num_tokens, shape, block_size = 4096, (8, 128), 16
    key = torch.randn(num_tokens, *shape, device="cuda", dtype=torch.bfloat16)
    value = torch.randn_like(key)
    key_cache = torch.zeros(1024, block_size, *shape, device="cuda", dtype=torch.bfloat16)
    slots = torch.randperm(1024 * block_size, device="cuda")[:num_tokens]
    run_both(key, value, key_cache, key_cache.clone(), slots)
