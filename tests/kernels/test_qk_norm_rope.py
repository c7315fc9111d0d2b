"""qk_norm_rope (Qwen3's per-head q/k RMSNorm + rotary in one launch) against the unfused
references and against the separate Triton kernels it replaces, on strided QKV slices."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from octavo.kernels.qk_norm_rope import qk_norm_rope, qk_norm_rope_ref  # noqa: E402
from octavo.kernels.rms_norm import rms_norm  # noqa: E402
from octavo.kernels.rotary import rotary_embedding  # noqa: E402
from tests.kernels.kv_store_check import check_kv_store_matches_reshape_and_cache  # noqa: E402
from tests.kernels.test_rotary import cos_sin_cache  # noqa: E402

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def _qkv(tokens, hq, hkv, d, dtype, device):
    qkv = torch.randn(tokens, (hq + 2 * hkv) * d, device=device).to(dtype) * 3
    q = qkv[:, : hq * d].view(tokens, hq, d)
    k = qkv[:, hq * d: (hq + hkv) * d].view(tokens, hkv, d)
    return qkv, q, k


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads", [(4, 2, 32), (6, 1, 16), (3, 3, 8)])
def test_matches_reference_and_the_separate_kernels(dtype, heads, device):
    hq, hkv, d = heads
    tokens = 7
    cache = cos_sin_cache(64, d, device=device)
    pos = torch.randint(0, 64, (tokens,), device=device)
    qw = (torch.rand(d, device=device) + 0.5).to(dtype)
    kw = (torch.rand(d, device=device) + 0.5).to(dtype)
    qkv, q, k = _qkv(tokens, hq, hkv, d, dtype, device)
    v_before = qkv[:, (hq + hkv) * d:].clone()

    fused = qkv.clone()
    fq = fused[:, : hq * d].view(tokens, hq, d)
    fk = fused[:, hq * d: (hq + hkv) * d].view(tokens, hkv, d)
    qk_norm_rope(pos, fq, fk, qw, kw, 1e-6, cache)

    ref = qkv.clone()
    rq = ref[:, : hq * d].view(tokens, hq, d)
    rk = ref[:, hq * d: (hq + hkv) * d].view(tokens, hkv, d)
    qk_norm_rope_ref(pos, rq, rk, qw, kw, 1e-6, cache)
    torch.testing.assert_close(fq, rq, **TOL[dtype])
    torch.testing.assert_close(fk, rk, **TOL[dtype])
    assert torch.equal(fused[:, (hq + hkv) * d:], v_before)  # v untouched

    # The kernels it replaces: the same values up to the order of the variance's sum (the
    # fused kernel adds the two halves of a head).
    sq, sk = rms_norm(q, qw, 1e-6), rms_norm(k, kw, 1e-6)
    rotary_embedding(pos, sq, sk, cache, d)
    tight = dict(atol=1e-6, rtol=1e-6) if dtype == torch.float32 else dict(atol=0.0, rtol=8e-3)
    torch.testing.assert_close(fq, sq, **tight)
    torch.testing.assert_close(fk, sk, **tight)


def test_no_tokens_is_a_no_op(device):
    cache = cos_sin_cache(8, 16, device=device)
    q = torch.empty(0, 2, 16, device=device)
    k = torch.empty(0, 1, 16, device=device)
    w = torch.ones(16, device=device)
    qk_norm_rope(torch.empty(0, dtype=torch.long, device=device), q, k, w, w, 1e-6, cache)


@pytest.mark.parametrize("heads", [(4, 2, 32), (6, 3, 16)])
def test_kv_store_writes_what_reshape_and_cache_would(heads, device):
    """With a KVStore the launch also writes the rotated k and the untouched v into the
    paged cache at each token's slot (slot -1: nothing), exactly as reshape_and_cache does
    after the unfused kernel; q/k in place are unchanged by the store."""
    d = heads[2]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    qw = (torch.rand(d, device=device) + 0.5).to(dtype)
    kw = (torch.rand(d, device=device) + 0.5).to(dtype)
    cache = cos_sin_cache(64, d, device=device)
    check_kv_store_matches_reshape_and_cache(
        lambda pos, q, k, store: qk_norm_rope(pos, q, k, qw, kw, 1e-6, cache, kv_store=store),
        heads, device, cache)
