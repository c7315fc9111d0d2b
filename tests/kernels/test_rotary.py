"""rotary_embedding (Triton) against rotary_embedding_ref and the Hugging Face formula."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from octavo.kernels.rotary import rotary_embedding, rotary_embedding_ref  # noqa: E402

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
TOL = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}


def cos_sin_cache(max_pos, rot_dim, base=10000.0, device="cpu"):
    inv_freq = 1.0 / base ** (torch.arange(0, rot_dim, 2, dtype=torch.float32) / rot_dim)
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(device)


def hf_rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def run_both(positions, q, k, cache, head_dim, is_neox):
    q1, k1 = q.clone(), k.clone() if k is not None else None
    rotary_embedding(positions, q1, k1, cache, head_dim, is_neox)
    q2, k2 = q.clone(), k.clone() if k is not None else None
    rotary_embedding_ref(positions, q2, k2, cache, head_dim, is_neox)
    return q1, k1, q2, k2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("layout", ["flat", "3d"])
@pytest.mark.parametrize("heads", [(4, 2, 32), (6, 1, 16)])  # H, Hkv, D
def test_rotary(dtype, is_neox, layout, heads, device):
    num_heads, num_kv_heads, head_dim = heads
    num_tokens = 11
    cache = cos_sin_cache(64, head_dim, device=device)
    positions = torch.randint(0, 64, (num_tokens,), device=device)
    q = torch.randn(num_tokens, num_heads, head_dim, device=device).to(dtype)
    k = torch.randn(num_tokens, num_kv_heads, head_dim, device=device).to(dtype)
    if layout == "flat":
        q, k = q.flatten(1), k.flatten(1)
    q1, k1, q2, k2 = run_both(positions, q, k, cache, head_dim, is_neox)
    torch.testing.assert_close(q1, q2, **TOL[dtype])
    torch.testing.assert_close(k1, k2, **TOL[dtype])


def test_neox_matches_hugging_face_formula(device):
    head_dim = 32
    cache = cos_sin_cache(40, head_dim, device=device)
    positions = torch.arange(9, device=device) * 3
    q = torch.randn(9, 4, head_dim, device=device)
    k = torch.randn(9, 2, head_dim, device=device)
    q1, k1 = q.clone(), k.clone()
    rotary_embedding(positions, q1, k1, cache, head_dim, True)
    cos = torch.cat([cache[positions, :16]] * 2, dim=-1)[:, None]  # HF duplicates halves
    sin = torch.cat([cache[positions, 16:]] * 2, dim=-1)[:, None]
    torch.testing.assert_close(q1, q * cos + hf_rotate_half(q) * sin, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k1, k * cos + hf_rotate_half(k) * sin, atol=1e-5, rtol=1e-5)


def test_views_into_fused_qkv_and_partial_rotary(device):
    # q/k are column slices of one QKV output; only the first 16 of 32 features rotate.
    head_dim, qkv = 32, torch.randn(7, (4 + 2 + 2) * 32, device=device)
    q, k = qkv[:, : 4 * head_dim], qkv[:, 4 * head_dim : 6 * head_dim]
    v_before = qkv[:, 6 * head_dim :].clone()
    cache = cos_sin_cache(20, 16, device=device)
    positions = torch.arange(7, device=device)
    expect = qkv.clone()
    rotary_embedding_ref(
        positions,
        expect[:, : 4 * head_dim],
        expect[:, 4 * head_dim : 6 * head_dim],
        cache,
        head_dim,
    )
    rotary_embedding(positions, q, k, cache, head_dim)
    torch.testing.assert_close(qkv, expect, atol=1e-5, rtol=1e-5)
    assert torch.equal(qkv[:, 6 * head_dim :], v_before)
    assert torch.equal(qkv[:, 16:32], expect[:, 16:32])


def test_key_optional(device):
    cache = cos_sin_cache(8, 16, device=device)
    q = torch.randn(3, 2, 16, device=device)
    positions = torch.tensor([0, 5, 7], device=device)
    q1, _, q2, _ = run_both(positions, q, None, cache, 16, True)
    torch.testing.assert_close(q1, q2)
    torch.testing.assert_close(q1[0], q[0])  # position 0 is the identity


@pytest.mark.gpu
@needs_cuda
def test_gpu_real_shapes():
    head_dim, num_tokens = 128, 4096
    cache = cos_sin_cache(8192, head_dim, base=1e6, device="cuda")
    positions = torch.randint(0, 8192, (num_tokens,), device="cuda")
    q = torch.randn(num_tokens, 32 * head_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(num_tokens, 8 * head_dim, device="cuda", dtype=torch.bfloat16)
    q1, k1, q2, k2 = run_both(positions, q, k, cache, head_dim, True)
    torch.testing.assert_close(q1, q2, **TOL[q.dtype])
    torch.testing.assert_close(k1, k2, **TOL[q.dtype])


@pytest.mark.parametrize("heads", [(4, 2, 32), (6, 3, 16)])
def test_kv_store_writes_what_reshape_and_cache_would(heads, device):
    """With a KVStore the rotary launch also writes the rotated k and the untouched v into the
    paged cache at each token's slot (slot -1: nothing), exactly as reshape_and_cache does
    after the plain launch; q/k in place are unchanged by the store."""
    from tests.kernels.kv_store_check import check_kv_store_matches_reshape_and_cache

    d = heads[2]
    cache = cos_sin_cache(64, d, device=device)
    check_kv_store_matches_reshape_and_cache(
        lambda pos, q, k, store: rotary_embedding(pos, q, k, cache, d, kv_store=store),
        heads, device, cache)


def test_kv_store_needs_the_whole_head_rotated(device):
    from octavo.kernels.rotary import supports_kv_store

    q, k = torch.empty(2, 4, 32, device=device), torch.empty(2, 2, 32, device=device)
    assert supports_kv_store(q, k, cos_sin_cache(8, 32, device=device), 32)
    assert not supports_kv_store(q, k, cos_sin_cache(8, 16, device=device), 32)  # partial
    assert not supports_kv_store(q.view(2, 128), k, cos_sin_cache(8, 32, device=device), 32)
