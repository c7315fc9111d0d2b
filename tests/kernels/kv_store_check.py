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

    def views(t):
        return (t[:, : hq * d].view(tokens, hq, d),
                t[:, hq * d: (hq + hkv) * d].view(tokens, hkv, d),
                t[:, (hq + hkv) * d:].view(tokens, hkv, d))

    # [K/V, blocks, block_size, heads, d], and the head-major layout ([K/V, blocks, heads,
    # block_size, d]) that the kernels see as a strided view of that shape.
    for head_major in (False, True):
        shape = (2, 4, hkv, 4, d) if head_major else (2, 4, 4, hkv, d)
        fill = torch.full(shape, 7.0, device=device, dtype=dtype)

        def kv(cache, head_major=head_major):
            return (cache[0].transpose(1, 2), cache[1].transpose(1, 2)) if head_major \
                else (cache[0], cache[1])

        fused, fused_cache = qkv.clone(), fill.clone()
        fq, fk, fv = views(fused)
        rotate(pos, fq, fk, KVStore(fv, *kv(fused_cache), slots))
        plain, plain_cache = qkv.clone(), fill.clone()
        pq, pk, pv = views(plain)
        rotate(pos, pq, pk, None)
        reshape_and_cache(pk, pv, *kv(plain_cache), slots)
        assert torch.equal(fused, plain)
        assert torch.equal(fused_cache, plain_cache)
        written = (torch.stack(kv(fused_cache)) != 7.0).any(-1).any(-1)
        assert int(written.sum()) == 2 * 5  # five slots, K and V
