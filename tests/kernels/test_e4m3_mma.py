"""The FP8 x FP8 decode GEMM (octavo/kernels/e4m3_mma.py, cuda/e4m3_mma.cu) on the CPU: the
launch plan, the nvcc build (no spills), and the kernel's walk emulated lane by lane (its
pointer arithmetic over tiles and K ranges, the fragment mapping of mma.m16n8k32, the split
sums and the output offsets) against x @ W^T. The GPU side is test_e4m3_mma_gpu.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from octavo.kernels import cuda_module, e4m3_mma
from octavo.kernels.e4m3_mma import STEP_K, STEPS_BUILT, plan, supports
from tests.kernels import cuda_checks
from tests.kernels.cuda_checks import G, T
from tests.kernels.test_dense_mma import REAL_SHAPES

NAMES = [f"e4m3_mma_{t}_s{s}" for t in ("bf16", "f16") for s in STEPS_BUILT]


@pytest.mark.parametrize("n,k", REAL_SHAPES + [(64, 256), (48, 128), (16, 128), (160, 4224)])
@pytest.mark.parametrize("m", [1, 2, 5, 8])
@pytest.mark.parametrize("sms,per_sm,steps", [(132, 16, None), (132, 4, 2), (132, 32, 8),
                                              (4, 16, None), (1, 1, 2)])
def test_plan_covers_every_tile_and_k_once(n, k, m, sms, per_sm, steps):
    p = plan(m, k, n, sms, per_sm, steps)
    chunk = STEP_K * p.steps
    assert p.steps in STEPS_BUILT and k % chunk == 0 and p.k_per_split % chunk == 0
    assert p.splits * p.k_per_split >= k > (p.splits - 1) * p.k_per_split  # no empty split
    assert 1 <= p.warps <= 8
    assert p.ctas * p.warps >= 1 and p.ctas * p.warps - p.warps < n // 16  # no idle CTA
    assert p.shared_bytes == m * p.k_per_split <= e4m3_mma.SHARED_LIMIT
    assert p.kernel(torch.bfloat16) in NAMES and p.kernel(torch.float16) in NAMES


def test_plan_shapes_and_refusals():
    # Llama-3.1-8B's gate_up: enough tiles for one warp each, K not split.
    p = plan(1, 4096, 28672, 132)
    assert (p.splits, p.ctas * p.warps) == (1, 28672 // 16)
    # down: 256 tiles, K split to fill the SMs.
    p = plan(1, 14336, 4096, 132)
    assert p.splits == 8 and p.ctas * p.warps == 256
    # many tiles on few SMs: several tiles per warp
    p = plan(1, 1024, 8192, 2, 4)
    assert p.ctas * p.warps < 8192 // 16
    with pytest.raises(ValueError, match="multiple"):
        plan(1, 64, 64, 132)  # one step of 64: no chunk of two
    assert supports(8, 4096, 4096, torch.bfloat16)
    assert not supports(9, 4096, 4096, torch.bfloat16)
    assert not supports(1, 4096 + 32, 4096, torch.bfloat16)
    assert not supports(1, 4096, 4096 + 8, torch.bfloat16)
    assert not supports(1, 4096, 4096, torch.float32)


def test_flags():
    assert e4m3_mma.flags(False, False, "clamp") == 0
    assert e4m3_mma.flags(True, False, "clamp") == e4m3_mma.STATIC
    assert e4m3_mma.flags(False, True, "replace") == e4m3_mma.PER_TENSOR | e4m3_mma.REPLACE
    with pytest.raises(AssertionError):
        e4m3_mma.flags(False, False, "round")


@pytest.mark.skipif(cuda_module.nvcc_path() is None, reason="no nvcc on this machine")
def test_the_source_builds_for_hopper_without_spills(tmp_path, monkeypatch):
    spills = cuda_checks.build_once(e4m3_mma.SOURCE, NAMES, tmp_path, monkeypatch)
    assert not any(spills.values()), spills


def test_unavailable_without_a_gpu(monkeypatch):
    monkeypatch.setenv("OCTAVO_E4M3_MMA", "1")
    assert not e4m3_mma.available(torch.device("cpu"))
    x = torch.zeros(1, 128, dtype=torch.bfloat16)
    w = torch.zeros(16, 128, dtype=e4m3_mma.FP8)
    with pytest.raises(RuntimeError, match="unavailable"):
        e4m3_mma.e4m3_mma(x, w, torch.ones(16))


# --- the kernel's walk, emulated ------------------------------------------------------------

def mma16832(d, a, b):
    """``mma.sync.m16n8k32.row.col`` (8-bit operands) of one warp on float64 values, from the
    PTX ISA's fragment layouts (a register holds four consecutive values): A [16, 32]
    row-major: a0 (row g, cols 4t..4t+3), a1 (row g+8, the same cols), a2 (row g, cols
    16+4t..16+4t+3), a3 (row g+8, those); B [32, 8]: b0 (rows 4t..4t+3, col g), b1 (rows
    16+4t.., col g); C / D as m16n8k16's. a: [32, 4, 4], b: [32, 2, 4], d: [32, 4]."""
    A, B = np.zeros((16, 32)), np.zeros((32, 8))
    for e in range(4):
        A[G, 4 * T + e] = a[:, 0, e]
        A[G + 8, 4 * T + e] = a[:, 1, e]
        A[G, 16 + 4 * T + e] = a[:, 2, e]
        A[G + 8, 16 + 4 * T + e] = a[:, 3, e]
        B[4 * T + e, G] = b[:, 0, e]
        B[16 + 4 * T + e, G] = b[:, 1, e]
    D = A @ B
    d[:, 0] += D[G, 2 * T]
    d[:, 1] += D[G, 2 * T + 1]
    d[:, 2] += D[G + 8, 2 * T]
    d[:, 3] += D[G + 8, 2 * T + 1]


def _emulate(xq, sx, w, sw, p):
    """What cuda/e4m3_mma.cu computes from the quantized activations ``xq`` [M, K] (values),
    their scales ``sx`` [M], the weight values ``w`` [N, K] and row scales ``sw`` [N]: each
    warp's tiles and chunks by the kernel's own pointer walk (lp, lk, next_tile, in 16-byte
    units), each lane's 16-byte loads as words of four values, the products' operands, the
    shared copy of the CTA's K range, the split partials and the final scaling."""
    m, k = xq.shape
    n = w.shape[0]
    w_flat = w.reshape(-1)
    chunk = STEP_K * p.steps
    row_words = k // 16
    tiles = n // 16
    part = np.full((p.splits, m, n), np.nan)
    writes = np.zeros((p.splits, m, n), int)
    for by in range(p.splits):
        kb = by * p.k_per_split
        kn = min(p.k_per_split, k - kb)
        cpt = kn // chunk
        shared = np.zeros((m, p.k_per_split))
        shared[:, :kn] = xq[:, kb:kb + kn]
        for bx in range(p.ctas):
            for warp in range(p.warps):
                first, stride = bx * p.warps + warp, p.ctas * p.warps
                mine = (tiles - 1 - first) // stride + 1 if first < tiles else 0
                lp = G * row_words + T + first * 16 * row_words + kb // 16  # per lane
                lk = 0
                next_tile = stride * 16 * row_words - (cpt - 1) * (chunk // 16)
                tile, pk = first, 0
                acc = np.zeros((32, 4))
                for _ in range(mine * cpt):
                    ra = [w_flat[16 * (lp + 4 * s)[:, None] + np.arange(16)]
                          for s in range(p.steps)]
                    rb = [w_flat[16 * (lp + 8 * row_words + 4 * s)[:, None] + np.arange(16)]
                          for s in range(p.steps)]
                    lk += 1
                    if lk == cpt:
                        lk, lp = 0, lp + next_tile
                    else:
                        lp = lp + chunk // 16
                    for s in range(p.steps):
                        off = pk * chunk + 64 * s + 16 * T
                        xv = np.where((G < m)[:, None],
                                      shared[np.minimum(G, m - 1)[:, None],
                                             off[:, None] + np.arange(16)], 0.0)
                        for q in range(2):  # words 2q, 2q + 1 of each 16 bytes
                            lo, hi = slice(8 * q, 8 * q + 4), slice(8 * q + 4, 8 * q + 8)
                            a = np.stack([ra[s][:, lo], rb[s][:, lo], ra[s][:, hi],
                                          rb[s][:, hi]], 1)
                            b = np.stack([xv[:, lo], xv[:, hi]], 1)
                            mma16832(acc, a, b)
                    pk += 1
                    if pk == cpt:
                        for r in range(4):
                            rows = 2 * T + (r & 1)
                            feats = tile * 16 + G + (0 if r < 2 else 8)
                            ok = rows < m
                            part[by, rows[ok], feats[ok]] = acc[ok, r]
                            np.add.at(writes[by], (rows[ok], feats[ok]), 1)
                        acc[:] = 0
                        pk, tile = 0, tile + stride
    assert (writes == 1).all()  # each output once per split
    return part.sum(0) * sx[:, None] * sw[None, :]


@pytest.mark.parametrize("m", [1, 2, 3, 8])
@pytest.mark.parametrize("n,k,sms,per_sm,steps", [
    (32, 256, 132, 16, 2),  # one warp per tile, K in one range
    (48, 1024, 2, 16, 2),  # split over K ranges
    (64, 512, 1, 1, 2),  # one warp walking every tile
    (96, 768, 1, 2, 4),  # several tiles per warp and several ranges (the last one short)
])
def test_the_walk_and_the_fragment_mapping_compute_x_at_w_transposed(m, n, k, sms, per_sm,
                                                                     steps):
    rng = np.random.default_rng(m * 1000 + n + k)
    w = rng.integers(-20, 21, size=(n, k)).astype(np.float64)
    xq = rng.integers(-20, 21, size=(m, k)).astype(np.float64)
    sx, sw = rng.uniform(0.5, 2.0, m), rng.uniform(0.5, 2.0, n)
    p = plan(m, k, n, sms, per_sm, steps)
    got = _emulate(xq, sx, w, sw, p)
    np.testing.assert_allclose(got, (xq * sx[:, None]) @ (w * sw[:, None]).T, rtol=1e-12,
                               atol=1e-9)
