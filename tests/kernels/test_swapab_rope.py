"""The qkv projection's rotary and KV-cache store in the CUDA 4-bit decode kernel
(``swapab_mma(rope=...)``, ``OCTAVO_SWAPAB_ROPE``): the pairs a lane holds, the switch, and
on the GPU the same q and cache contents as the plain kernel followed by the rotary kernel."""

from __future__ import annotations

import pytest
import torch

from octavo.kernels import int_weight_layout, swapab_mma
from tests.kernels import cuda_checks


def test_a_lane_holds_each_of_its_heads_rotary_pairs():
    """Transcribed from the source: values 2h and 2h + 1 of a lane's int16 row are columns d
    and d + 64 of one head of 128 (the rotary's pair), and over the tiles every column of
    [q | k | v] is stored exactly once."""
    text = cuda_checks.source_text(swapab_mma.SOURCE)
    assert "const int col = nb + 128 * h;  // d = r of head col / 128" in text
    assert "acc[mt][2 * h][i]" in text and "acc[mt][2 * h + 1][i]" in text
    assert "q[64] = " in text and "k[64] = " in text and "v[64] = " in text
    n = 6 * 256  # e.g. 8 q heads, 2 k, 2 v
    seen = []
    for tile in range(n // 64):
        for g in range(8):
            for row in (tile * 16 + g, tile * 16 + g + 8):
                nb = cuda_checks.swapab_column4(row)
                r = nb & 63
                for h in range(2):
                    col = nb + 128 * h
                    assert col // 128 == (col + 64) // 128 and col % 128 == r < 64
                    assert nb + 64 * (2 * h) == col and nb + 64 * (2 * h + 1) == col + 64
                    seen += [col, col + 64]
    assert sorted(seen) == list(range(n))


def test_supports_rope_and_the_switch(monkeypatch):
    from octavo import envs

    ok = dict(m=1, k=4096, n=6144, group_size=128, bits=4, dtype=torch.bfloat16,
              head_dim=128)
    assert swapab_mma.supports_rope(**ok)
    for bad in ({"m": 17}, {"bits": 8}, {"group_size": 64}, {"head_dim": 64},
                {"dtype": torch.float32}):
        assert not swapab_mma.supports_rope(**{**ok, **bad}), bad
    monkeypatch.delenv("OCTAVO_SWAPAB_ROPE", raising=False)
    assert envs.swapab_rope() is False
    assert not int_weight_layout.has_qkv_rope("swapab", 4096, 6144, 128, 4)
    monkeypatch.setenv("OCTAVO_SWAPAB_ROPE", "1")
    assert int_weight_layout.has_qkv_rope("swapab", 4096, 6144, 128, 4)
    assert not int_weight_layout.has_qkv_rope("swapab", 4096, 6144, 64, 4)
    assert not int_weight_layout.has_qkv_rope("along_k", 4096, 6144, 128, 4)


# --- on the GPU ---------------------------------------------------------------------------

gpu = cuda_checks.needs_build(swapab_mma.SOURCE)


class _Store:
    def __init__(self, kc, vc, slots):
        self.key_cache, self.value_cache, self.slots, self.v = kc, vc, slots, None


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype,scale_dtype", [(torch.bfloat16, torch.bfloat16),
                                               (torch.bfloat16, torch.float16),
                                               (torch.float16, torch.float16)])
@pytest.mark.parametrize("m", [1, 3, 8, 9, 16])
@pytest.mark.parametrize("per_sm", [6, 200])
def test_the_rotary_store_is_the_plain_store_then_the_rotary_kernel_gpu(dtype, scale_dtype,
                                                                       m, per_sm, monkeypatch):
    """q, and the k / v the cache receives, against the plain kernel's [q | k | v] rotated by
    ``rotary_embedding`` and stored by its KV store; a slot of -1 stores nothing."""
    from octavo.kernels.rotary import rotary_embedding
    from octavo.kernels.w4a16_swapab import pack_swapab

    monkeypatch.setenv("OCTAVO_SWAPAB_ROPE", "1")
    heads, kv_heads, d, k = 8, 2, 128, 1024
    n = (heads + 2 * kv_heads) * d
    g = torch.Generator().manual_seed(m)
    qw = pack_swapab(torch.randint(0, 16, (k, n), generator=g), 4).cuda()
    s = (torch.rand(k // 128, n, generator=g) * 0.02 + 0.001).to(scale_dtype).cuda()
    z = torch.randint(0, 17, (k // 128, n), generator=g).to(scale_dtype).cuda()
    x = torch.randn(m, k, generator=g).to(dtype).cuda()
    pos = torch.randint(0, 500, (m,), generator=g).cuda()
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    ang = torch.arange(512).float()[:, None] * inv[None, :]
    cs = torch.cat([ang.cos(), ang.sin()], dim=1).cuda()
    blocks, bs = 8, 16
    slots = torch.randperm(blocks * bs, generator=g)[:m].cuda()
    slots[0] = -1  # a padded row
    caches = [torch.zeros(blocks, bs, kv_heads, d, dtype=dtype, device="cuda") for _ in range(4)]

    plain = swapab_mma.swapab_mma(x, qw, s, z, 128, 4, warps_per_sm=per_sm)
    q_ref = plain[:, :heads * d].reshape(m, heads, d).clone()
    k_ref = plain[:, heads * d:(heads + kv_heads) * d].reshape(m, kv_heads, d).clone()
    v_ref = plain[:, (heads + kv_heads) * d:].reshape(m, kv_heads, d).contiguous()
    rotary_embedding(pos, q_ref, k_ref, cs, d)  # in place, then the cache as the store does
    flat = slots.clamp(min=0)
    keep = slots >= 0
    caches[0].view(-1, kv_heads, d)[flat[keep]] = k_ref[keep]
    caches[1].view(-1, kv_heads, d)[flat[keep]] = v_ref[keep]

    q = int_weight_layout.qkv_rope(x, qw, s, z, 128, "swapab", None, None, pos, cs, heads,
                                   kv_heads, d, _Store(caches[2], caches[3], slots))
    assert q is not None and q.shape == (m, heads * d)
    torch.testing.assert_close(q.view(m, heads, d), q_ref, atol=1e-2, rtol=1e-2)
    assert (q.view(m, heads, d) != q_ref).float().mean().item() < 0.02
    torch.testing.assert_close(caches[2], caches[0], atol=1e-2, rtol=1e-2)
    assert torch.equal(caches[3], caches[1])  # v: the plain store's bits
    from octavo.kernels import split_k

    torch.cuda.synchronize()
    assert not split_k.counters(x.device, 1).any()


@pytest.mark.gpu
@gpu
def test_engine_decode_with_the_rotary_store_matches_it_off_gpu(tmp_path, monkeypatch):
    """A bf16 GPTQ 4-bit Llama (head_dim 128) decodes through the rotary store (calls
    counted) with the logprobs of the engine without it."""
    import json

    cuda_checks.gptq_llama(tmp_path, group_size=128)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.update(hidden_size=1024, num_attention_heads=8, num_key_value_heads=2)  # head_dim 128
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    monkeypatch.setenv("OCTAVO_INT_WEIGHT_LAYOUT", "swapab")
    cuda_checks.check_switch_decodes(tmp_path, monkeypatch, swapab_mma, "swapab_mma",
                                     "OCTAVO_SWAPAB_ROPE", lambda kw: kw.get("rope") is not None)
