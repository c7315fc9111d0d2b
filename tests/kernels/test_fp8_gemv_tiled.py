"""The FP8 GEMV on a pre-tiled weight (octavo/kernels/fp8_tiled.py, ``_fp8_gemv_kernel``'s
TILED): only the weight's addresses change, so the output is the untiled kernel's bit for bit
(plain, GLU, ROPE, with split-K and two steps in flight), and the tiling a pure permutation
of the bytes; small shapes through the Triton interpreter on the CPU, Llama-8B shapes on the
GPU."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from octavo.attention.backend import KVStore  # noqa: E402
from octavo.kernels.fp8_gemv import fp8_gemv, fp8_gemv_qkv_rope, fp8_gemv_ref  # noqa: E402
from octavo.kernels.fp8_tiled import kernel_rows, tile_fp8_weight, tiled_plan  # noqa: E402
from octavo.layers.rotary import RotaryEmbedding  # noqa: E402
from tests.kernels.test_fp8_gemv import (  # noqa: E402  (one set of cases for both)
    CONVERSIONS,
    DEVICE,
    FP8,
    _case,
    _rel_err,
    _skip_cvt_off_gpu,
)

# (k, n, block_n, block_k, tuning): N and K multiples of the tile (TILED requires it)
CASES = [
    (128, 32, 8, 16, {"split_k": 1}),                # 8 steps, one program per tile
    (128, 32, 8, 16, {"split_k": 3}),                # splits of 3, 3 and 2 steps
    (128, 16, 16, 16, {"split_k": 8}),               # a step per split
    (160, 16, 8, 16, {"split_k": 1, "stages": 3}),   # 10 steps, two in flight
    (192, 16, 8, 32, {"split_k": 2, "stages": 3}),   # 3 steps per split, two in flight
    (64, 24, 8, 64, {"split_k": 1}),                 # one step
    (128, 32, 16, 32, {}),                           # split-K as the launch picks it
]


@pytest.mark.parametrize("bits", CONVERSIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("glu", [False, True])
@pytest.mark.parametrize("k,n,bn,bk,tuning", CASES)
def test_tiled_is_the_untiled_gemv(k, n, bn, bk, tuning, glu, m, dtype, bits):
    """Same tile, same splits: the tiled weight gives the untiled kernel's output bit for
    bit, plain and GLU (the layout already in GLU's gate / up column order)."""
    _skip_cvt_off_gpu(bits)
    x, weight, scale = _case(m, k, n, dtype)
    tuning = dict(tuning, bits=bits, glu=glu)
    plain = fp8_gemv(x, weight, scale, block_n=bn, block_k=bk, **tuning)
    tiled = fp8_gemv(x, tile_fp8_weight(weight, bn, bk, glu=glu), scale, tiled=(bn, bk),
                     **tuning)
    assert tiled.shape == plain.shape == (m, n // 2 if glu else n)
    assert tiled.dtype == dtype
    assert torch.equal(tiled, plain)
    ref = fp8_gemv_ref(x.float(), weight, scale)
    if glu:
        ref = torch.nn.functional.silu(ref[:, : n // 2]) * ref[:, n // 2:]
    assert _rel_err(tiled, ref) < (1e-5 if dtype == torch.float32 else 2.0**-6)


def test_tiled_split_k_leaves_counters_zeroed():
    from octavo.kernels.split_k import counters

    x, weight, scale = _case(2, 128, 32, torch.float32)
    w = tile_fp8_weight(weight, 16, 16)
    a = fp8_gemv(x, w, scale, split_k=4, tiled=(16, 16))
    assert int(counters(x.device, 2).abs().sum()) == 0
    assert torch.equal(a, fp8_gemv(x, w, scale, split_k=4, tiled=(16, 16)))


BLOCKS, BLOCK_SIZE = 4, 4


@pytest.mark.parametrize("m,slots", [(1, [5]), (2, [5, 14]), (2, [-1, 0])])
@pytest.mark.parametrize("hq,hkv,d,k,bn,bk", [
    (4, 2, 16, 64, 16, 32),     # 2 K steps
    (4, 2, 16, 64, 64, 16),     # a tile over q, k and v heads, 4 steps
    (2, 1, 24, 48, 8, 16),      # D / 2 = 12: tiles across heads
])
def test_tiled_rope_is_the_untiled_rope(hq, hkv, d, k, bn, bk, m, slots):
    """fp8_gemv_qkv_rope on a weight tiled with ``rope``: q and the cache bit for bit those
    of the untiled weight."""
    g = torch.Generator().manual_seed(0)
    n = (hq + 2 * hkv) * d
    weight = (torch.randn(n, k, generator=g) * 100).clamp(-448, 448).to(FP8).to(DEVICE)
    scale = (torch.rand(n, generator=g) * 0.01 + 1e-4).to(DEVICE)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16).to(DEVICE)
    table = RotaryEmbedding(d, 4096, 10000.0).cos_sin_cache.to(DEVICE)
    pos = torch.tensor([3000, 17][:m], device=DEVICE)
    slots = torch.tensor(slots, device=DEVICE)
    caches = [torch.full((2, BLOCKS, BLOCK_SIZE, hkv, d), 7.0, dtype=torch.bfloat16,
                         device=DEVICE) for _ in range(2)]
    w_tiled = tile_fp8_weight(weight, bn, bk, rope=(hq, hkv, d))
    outs = []
    for w, cache, tiled in ((weight, caches[0], None), (w_tiled, caches[1], (bn, bk))):
        q = fp8_gemv_qkv_rope(x, w, scale, pos, table, hq, hkv, d,
                              KVStore(None, cache[0], cache[1], slots), block_n=bn,
                              block_k=bk, tiled=tiled)
        assert q is not None
        outs.append(q)
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(caches[0], caches[1])


def test_tiling_is_a_permutation_of_the_bytes():
    g = torch.Generator().manual_seed(3)
    weight = torch.randint(0, 256, (48, 64), generator=g, dtype=torch.uint8).view(FP8)
    for kw in ({}, {"glu": True}, {"rope": (2, 1, 12)}):
        t = tile_fp8_weight(weight, 8, 16, **kw)
        assert t.shape == (6, 4, 8, 16) and t.dtype == FP8 and t.is_contiguous()
        assert torch.equal(t.view(torch.uint8).flatten().sort().values,
                           weight.view(torch.uint8).flatten().sort().values)
        rows = kernel_rows(48, **kw)
        assert torch.equal(rows.sort().values, torch.arange(48))
        # element [t, s, r, j] is weight[rows[t * 8 + r], s * 16 + j]
        back = t.view(torch.uint8).permute(0, 2, 1, 3).reshape(48, 64)
        assert torch.equal(back, weight.view(torch.uint8)[rows])


def test_where_an_element_lands():
    """A hand-checked small case: weight[n, k] = 8 n + k, N = 4, K = 8, tile 2 x 4."""
    weight = torch.arange(32, dtype=torch.uint8).reshape(4, 8).view(FP8)
    plain = tile_fp8_weight(weight, 2, 4).view(torch.uint8)
    assert plain.shape == (2, 2, 2, 4)
    assert plain[0, 0].tolist() == [[0, 1, 2, 3], [8, 9, 10, 11]]
    assert plain[0, 1].tolist() == [[4, 5, 6, 7], [12, 13, 14, 15]]
    assert plain[1, 0].tolist() == [[16, 17, 18, 19], [24, 25, 26, 27]]
    assert plain[1, 1, 1, 2] == 8 * 3 + 6  # (n, k) = (3, 6): tile 1, step 1, row 1, byte 2
    assert plain.flatten().tolist()[:12] == [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7]
    # GLU ([gate | up], I = 2): columns gate 0, up 0, gate 1, up 1 = rows 0, 2, 1, 3
    glu = tile_fp8_weight(weight, 2, 4, glu=True).view(torch.uint8)
    assert glu[0, 0].tolist() == [[0, 1, 2, 3], [16, 17, 18, 19]]
    assert glu[1, 1].tolist() == [[12, 13, 14, 15], [28, 29, 30, 31]]
    # ROPE, one q and one k head of D = 4, one v head: pairs (0, 2), (1, 3) per head
    assert kernel_rows(12, rope=(1, 1, 4)).tolist() == [0, 2, 1, 3, 4, 6, 5, 7,
                                                       8, 9, 10, 11]


def test_wrong_blocks_raise():
    x, weight, scale = _case(1, 64, 16, torch.float32)
    w = tile_fp8_weight(weight, 8, 16)
    assert torch.equal(fp8_gemv(x, w, scale, tiled=(8, 16)),
                       fp8_gemv(x, weight, scale, block_n=8, block_k=16))
    for bad in ((16, 16), (8, 32), (4, 16)):  # not the blocks the layout was made with
        with pytest.raises(AssertionError):
            fp8_gemv(x, w, scale, tiled=bad)
    with pytest.raises(AssertionError):  # a block size against the layout's
        fp8_gemv(x, w, scale, tiled=(8, 16), block_k=32)
    with pytest.raises(AssertionError):  # the layout read as an [N, K] weight
        fp8_gemv(x, w, scale)
    with pytest.raises(AssertionError):  # an [N, K] weight read as tiled
        fp8_gemv(x, weight, scale, tiled=(8, 16))
    for bn, bk in ((6, 16), (8, 48), (8, 6)):  # not dividing N = 16 / K = 64, bk % 4
        with pytest.raises(AssertionError):
            tile_fp8_weight(weight, bn, bk)


def test_tiled_plan_is_the_default_plan():
    assert tiled_plan(28672, 4096) == (32, 256)   # gate_up
    assert tiled_plan(4096, 14336) == (16, 1024)  # down
    assert tiled_plan(4096, 4096) == (8, 512)     # o
    assert tiled_plan(6144, 4096) == (16, 512)    # qkv
    assert tiled_plan(6144, 4000) is None         # K not a multiple of 512


@pytest.mark.gpu
@pytest.mark.parametrize("bits", [False, True])
@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("k,n,glu", [
    (4096, 28672, False), (4096, 28672, True),   # gate_up
    (14336, 4096, False),                        # down
    (4096, 4096, False), (4096, 6144, False),    # o (two steps in flight), qkv
])
def test_real_shapes_gpu(k, n, glu, m, bits):
    x, weight, scale = _case(m, k, n, torch.bfloat16, device=torch.device("cuda"))
    blocks = tiled_plan(n, k)
    plain = fp8_gemv(x, weight, scale, bits=bits, glu=glu)
    tiled = fp8_gemv(x, tile_fp8_weight(weight, *blocks, glu=glu), scale, bits=bits,
                     glu=glu, tiled=blocks)
    assert torch.equal(tiled, plain)
