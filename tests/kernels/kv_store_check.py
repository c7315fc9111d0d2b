"""One check shared by the kernels that rotate k and also write K/V into the paged cache
(octavo.kernels.rotary, octavo.kernels.qk_norm_rope): the fused launch must leave q/k and the
cache exactly as the plain launch followed by reshape_and_cache does."""

from __future__ import annotations

import torch


def check_kv_store_matches_reshape_and_cache(rotate, heads, device, cos_sin_cache):
    """``rotate(pos, q, k, kv_store)``: the kernel under test, in place on strided views of
    one QKV output (``kv_store`` None: rotate only). Slot -1 stores nothing."""
    from octavo.attention.backend import KVStore
    from octavo.kernels.reshape_and_cache import reshape_and_cache

    hq, hkv, d = heads
    tokens, dtype = 6, torch.bfloat16 if device.type == "cuda" else torch.float32
    pos = torch.randint(0, cos_sin_cache.shape[0], (tokens,), device=device)
    qkv = torch.randn(tokens, (hq + 2 * hkv) * d, device=device).to(dtype) * 3
    slots = torch.tensor([5, 0, -1, 13, 2, 9], device=device)
    fill = torch.full((2, 4, 4, hkv, d), 7.0, device=device, dtype=dtype)  # [K/V, blocks, ...]

    def views(t):
        return (t[:, : hq * d].view(tokens, hq, d),
                t[:, hq * d: (hq + hkv) * d].view(tokens, hkv, d),
                t[:, (hq + hkv) * d:].view(tokens, hkv, d))

    fused, fused_cache = qkv.clone(), fill.clone()
    fq, fk, fv = views(fused)
    rotate(pos, fq, fk, KVStore(fv, fused_cache[0], fused_cache[1], slots))
    plain, plain_cache = qkv.clone(), fill.clone()
    pq, pk, pv = views(plain)
    rotate(pos, pq, pk, None)
    reshape_and_cache(pk, pv, plain_cache[0], plain_cache[1], slots)
    assert torch.equal(fused, plain)
    assert torch.equal(fused_cache, plain_cache)
    assert int((fused_cache != 7.0).any(-1).any(-1).sum()) == 2 * 5  # five slots, K and V
