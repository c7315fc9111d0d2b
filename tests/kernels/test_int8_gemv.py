"""The 8-bit integer GEMV on the rows layout (octavo/kernels/int8_gemv.py: the FP8 GEMV's kernel
in its U8 mode) against the float32 dequantize-then-matmul reference, its fused stores (the
MLP's activation, the qkv rotary) against the unfused paths bit for bit, and the layout's
larger batches through the along-K kernels' strides. Small shapes through the Triton
interpreter on the CPU (where the byte placement is shifts; PRMTs on the GPU), Llama-8B shapes
on the GPU."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from octavo.attention.backend import KVStore  # noqa: E402
from octavo.kernels import int_weight_layout as layout  # noqa: E402
from octavo.kernels.int8_gemv import (  # noqa: E402
    as_along_k,
    dequantize_rows,
    int8_gemv,
    int8_gemv_qkv_rope,
    int8_gemv_ref,
    pack_rows,
    supports,
)
from octavo.kernels.w4a16_gemm import dequantize, dequantize_ref, pack_along_k  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _case(m, k, n, group, sym, dtype, seed=0, device=DEVICE):
    """x [m, k]; a rows weight of random bytes; fp16 scales per (group, row); the zero 128
    (symmetric: one number) or random zeros [G, N] (a float tensor of integers)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 256, (k, n), generator=g)
    scales = (torch.rand(k // group, n, generator=g) * 0.01 + 1e-3).to(torch.float16)
    zeros = 128.0 if sym else torch.randint(0, 256, (k // group, n), generator=g).to(
        torch.float16).to(device)
    x = torch.randn(m, k, generator=g).to(dtype)
    return x.to(device), pack_rows(q).to(device), scales.to(device), zeros, q


def _rel_err(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp(min=1e-12)).item()


def _tol(dtype, exact):
    # float32: exact q - z (the default there) is float32's own rounding; the 1.0-offset sums
    # (1 + q 2**-15) keep ~2**-16 of the result. 16-bit outputs are rounded once more.
    if dtype != torch.float32:
        return 2.0**-7
    return 1e-4 if exact is False else 1e-6


def test_plan_steps_within_a_group():
    """Each K step lies inside one group; 128-wide steps spread over about 4 programs per
    SM."""
    from octavo.kernels.fp8_gemv import _plan as fp8_plan
    from octavo.kernels.fp8_gemv import group_plan as _plan

    assert _plan(6144, 4096, 4096) == fp8_plan(6144, 4096)  # one group per row
    assert _plan(6144, 4096, 128) == (64, 128, 4, 4, 2)
    assert _plan(4096, 14336, 128) == (32, 128, 4, 4, 2)
    for group in (32, 64, 128, 256):
        assert group % _plan(4096, 4096, group)[1] == 0


@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("sym", [True, False])
@pytest.mark.parametrize("exact", [None, True, False])
@pytest.mark.parametrize("k,n,group,tuning", [
    (128, 24, 32, {}),                                     # N not a multiple of the tile
    (256, 40, 64, {"split_k": 2}),                         # two K splits
    (256, 16, 256, {"block_k": 64, "block_n": 16}),        # one group per row (per channel)
    (192, 8, 64, {"block_k": 32, "stages": 3}),            # two steps ahead, 6 steps
    (160, 8, 32, {"block_k": 32, "split_k": 1}),           # 5 steps: the unrolled loop's tail
])
def test_matches_reference(m, k, n, group, tuning, sym, exact):
    for dtype in (torch.float32, torch.bfloat16):
        x, w, s, z, _ = _case(m, k, n, group, sym, dtype)
        out = int8_gemv(x, w, s, z, group, exact=exact, **tuning)
        assert out.shape == (m, n) and out.dtype == dtype
        assert _rel_err(out, int8_gemv_ref(x, w, s, z, group)) < _tol(dtype, exact)


@pytest.mark.parametrize("glu", [False, True])
def test_tiled_bytes_give_the_same_bits(glu):
    """The bytes pre-tiled by fp8_tiled.tile_fp8_weight (the TILED addressing, scales per
    original row): bit for bit the untiled GEMV."""
    from octavo.kernels.fp8_tiled import tile_fp8_weight

    x, w, s, z, _ = _case(2, 256, 32, 64, False, torch.bfloat16, seed=2)
    tiled = tile_fp8_weight(w, 16, 64, glu=glu)
    plain = int8_gemv(x, w, s, z, 64, glu=glu, block_n=16, block_k=64, split_k=2)
    assert torch.equal(int8_gemv(x, tiled, s, z, 64, glu=glu, tiled=(16, 64), split_k=2), plain)


def test_every_byte_value_and_extremes():
    """Each of the 256 byte values in each byte position of a word (rows n: q[n, k] =
    (n + 37 k) % 256), with the zero at both ends (q - z from -255 to 255): a one-hot x
    gives exact integers times a power-of-two scale."""
    k, n, group = 32, 256, 32
    q = (torch.arange(n)[None, :] + 37 * torch.arange(k)[:, None]) % 256  # [K, N]
    w = pack_rows(q).to(DEVICE)
    s = torch.full((1, n), 2.0**-4, dtype=torch.float16, device=DEVICE)
    for zero in (0.0, 255.0):
        for j in range(8):  # two words: every byte position twice
            x = torch.zeros(1, k, device=DEVICE)
            x[0, j] = 1.0
            for exact in (True, False):
                out = int8_gemv(x, w, s, zero, group, exact=exact)
                assert torch.equal(out[0].cpu(), (q[j].float() - zero) * 2.0**-4), (zero, j)


def test_layout_is_the_along_k_packing_through_strides():
    """The rows bytes viewed as int32 and transposed are pack_along_k's 8-bit words, and
    dequantize(rows_out=True) gives the reference weight as a view of a row-major [N, K]."""
    g = torch.Generator().manual_seed(3)
    k, n, group = 256, 48, 64
    q = torch.randint(0, 256, (k, n), generator=g)
    w = pack_rows(q)
    assert w.dtype == torch.uint8 and w.shape == (n, k)
    assert torch.equal(as_along_k(w), pack_along_k(q, 8))
    s = torch.rand(k // group, n, generator=g) + 0.5
    z = torch.randint(0, 256, (k // group, n), generator=g).float()
    words = as_along_k(w.to(DEVICE))
    got = dequantize(words, s.to(DEVICE), z.to(DEVICE), group, 8, torch.float32, rows_out=True)
    want = dequantize_ref(pack_along_k(q, 8).to(DEVICE), s.to(DEVICE), z.to(DEVICE), group, 8,
                          torch.float32)
    assert got.shape == (k, n) and got.t().is_contiguous() and torch.equal(got, want)
    assert torch.allclose(dequantize_rows(w, s, z, group), want.cpu())


def test_supports():
    from octavo.kernels.int8_gemv import runs_full_steps

    assert supports(1, 4096, 128) and supports(2, 4096, 4096) and supports(2, 96, 32)
    assert runs_full_steps(6144, 4096, 4096) and runs_full_steps(4096, 14336, 14336)
    assert not runs_full_steps(6144, 4096, 128)  # g128: steps shorter than the FP8 GEMV's
    assert runs_full_steps(128, 128, 128)  # one group per row, K shorter than a step
    assert not supports(3, 4096, 128)   # three rows: the along-K kernels
    assert not supports(1, 4096, 16)    # a group shorter than the smallest step
    assert not supports(1, 4000, 128)   # K not in whole groups
    with pytest.raises(ValueError, match="K=6"):
        pack_rows(torch.zeros(6, 4, dtype=torch.int64))


@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("k,inter,group,tuning", [
    (128, 20, 32, {}),
    (256, 12, 64, {"block_k": 32, "split_k": 2}),          # two splits: the last program stores
])
def test_glu_is_the_unfused_projection_then_silu_and_mul(m, k, inter, group, tuning):
    from octavo.kernels.activation import silu_and_mul

    for dtype in (torch.float32, torch.bfloat16):
        x, w, s, z, _ = _case(m, k, 2 * inter, group, False, dtype)
        fused = int8_gemv(x, w, s, z, group, glu=True, **tuning)
        assert fused.shape == (m, inter) and fused.dtype == dtype
        assert torch.equal(fused, silu_and_mul(int8_gemv(x, w, s, z, group, **tuning)))


@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("sym", [True, False])
def test_qkv_rope_is_the_gemv_then_the_rotary(m, sym):
    """q and the paged cache, bit for bit, as the plain GEMV (one split, the same tile)
    followed by the rotary kernel that stores k / v."""
    from octavo.kernels.rotary import rotary_embedding
    from octavo.layers.rotary import RotaryEmbedding

    hq, hkv, d, k, group = 4, 2, 16, 128, 128
    n = (hq + 2 * hkv) * d
    for dtype in (torch.float32, torch.bfloat16):
        x, w, s, z, _ = _case(m, k, n, group, sym, dtype, seed=5)
        table = RotaryEmbedding(d, 4096, 10000.0).cos_sin_cache.to(DEVICE)
        pos = torch.tensor([3000, 17][:m], device=DEVICE)
        slots = torch.tensor([5, -1][:m], device=DEVICE)
        cache = torch.full((2, 4, 4, hkv, d), 7.0, dtype=dtype, device=DEVICE)
        plain_cache = cache.clone()
        qkv = int8_gemv(x, w, s, z, group, split_k=1)
        q = qkv[:, : hq * d].view(m, hq, d)
        kk = qkv[:, hq * d: (hq + hkv) * d].view(m, hkv, d)
        v = qkv[:, (hq + hkv) * d:].view(m, hkv, d)
        rotary_embedding(pos, q, kk, table, d,
                         kv_store=KVStore(v, plain_cache[0], plain_cache[1], slots))
        fused = int8_gemv_qkv_rope(x, w, s, z, group, pos, table, hq, hkv, d,
                                   KVStore(None, cache[0], cache[1], slots))
        assert torch.equal(fused, qkv[:, : hq * d])
        assert torch.equal(cache, plain_cache)
        assert int((cache != 7.0).any(-1).any(-1).sum()) == 2  # K and V of the one slot
    # Groups shorter than the FP8 GEMV's steps: the rotary keeps its own launch.
    x, w, s, z, _ = _case(m, k, n, 32, sym, torch.float32, seed=5)
    assert int8_gemv_qkv_rope(x, w, s, z, 32, pos, table, hq, hkv, d,
                              KVStore(None, cache[0], cache[1], slots)) is None


@pytest.mark.parametrize("m", [1, 2, 5, 130])  # the GEMV, the tensor-core kernel, dequantize
def test_rows_layout_linear_every_batch_size(m):
    k, n, group = 128, 64, 32
    g = torch.Generator().manual_seed(1)
    q = torch.randint(0, 256, (k, n), generator=g)
    s = (torch.rand(k // group, n, generator=g) * 0.02 + 0.001).to(DEVICE)
    z = torch.randint(0, 257, (k // group, n), generator=g).float().to(DEVICE)
    w = layout.pack(q, 8, layout.ROWS).to(DEVICE)
    x = torch.randn(2, m, k, device=DEVICE)
    ref = x @ dequantize_ref(pack_along_k(q, 8).to(DEVICE), s, z, group, 8, torch.float32)
    out = layout.linear(x, w, s, z, group, 8, layout.ROWS)
    assert out.shape == (2, m, n) and _rel_err(out, ref) < 1e-4
    zs = torch.full_like(z, 128.0)  # one zero for all: passed as a number
    ref = x @ dequantize_ref(pack_along_k(q, 8).to(DEVICE), s, zs, group, 8, torch.float32)
    assert _rel_err(layout.linear(x, w, s, zs, group, 8, layout.ROWS, 128.0), ref) < 1e-4


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("k,n", [(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096)])
def test_real_shapes_gpu(m, k, n):
    for sym, group in ((True, 128), (False, 128), (True, k), (False, k)):
        x, w, s, z, _ = _case(m, k, n, group, sym, torch.bfloat16, device=torch.device("cuda"))
        for exact in (True, False):
            out = int8_gemv(x, w, s, z, group, exact=exact)
            assert _rel_err(out, int8_gemv_ref(x, w, s, z, group)) < 2.0**-7
