"""The CUDA C++ 4-bit wide-tile GEMM (octavo/kernels/swapab_wide.py, cuda/swapab_wide.cu): the
launch plan and the nvcc build on any machine with nvcc; the kernel's fragment mapping, shared
memory layout (swizzled activation pieces, the group's scales and zeros), dequantization and
split sums emulated lane by lane on the CPU; against the float64 reference on the GPU."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from octavo.kernels import cuda_module, int_weight_layout, swapab_wide
from octavo.kernels.swapab_wide import plan, supports
from tests.kernels import cuda_checks
from tests.kernels.test_swapab_mma import _case, _data, _halves, _nibbles, _rel

NAMES = [f"swapab_wide_{t}_{sc}_m{nt}_w{w}_p{st}" + ("_ws" if ws else "")
         for t in ("bf16", "f16") for sc in ("bf16", "f16")
         for nt, w, st, ws in sorted(swapab_wide.BUILT)]
SRC = Path(swapab_wide.__file__).parent / "cuda" / swapab_wide.SOURCE


@pytest.mark.parametrize("m", [17, 32, 33, 64, 65, 128, 200, 256])
@pytest.mark.parametrize("k,n", [(4096, 28672), (4096, 6144), (4096, 4096), (14336, 4096),
                                 (256, 512), (192, 256)])
@pytest.mark.parametrize("sms", [132, 4])
def test_plan_covers_every_row_column_and_k_once(m, k, n, sms):
    p = plan(m, k, n, sms)
    assert p.nt == (4 if m <= 32 else 8)
    assert p.blocks * 64 * p.warps == n and (p.row_tiles - 1) * 8 * p.nt < m <= p.row_tiles * 8 * p.nt
    assert p.k_per_split % 64 == 0
    assert p.splits * p.k_per_split >= k > (p.splits - 1) * p.k_per_split  # none empty
    assert p.splits == 1 or p.blocks * p.row_tiles * (p.splits - 1) < 2 * sms  # ~2 per SM


def test_plan_splits_only_where_the_tiles_leave_sms_idle():
    assert plan(256, 4096, 28672, 132).splits == 1  # 112 x 4 CTAs
    down = plan(256, 14336, 4096, 132)  # 16 x 4 CTAs: split to about 2 per SM
    assert down.splits == 5 and down.k_per_split == 2880
    assert plan(256, 14336, 4096, 132, splits=2).splits == 2
    with pytest.raises(ValueError, match="batch tiles"):
        plan(64, 4096, 4096, 132, nt=2)
    assert plan(64, 4096, 4096, 132, warps=8).blocks == 8  # two layout blocks a CTA
    with pytest.raises(ValueError, match="multiple of 64 x warps"):
        plan(64, 4096, 768, 132, warps=8)


def test_supports():
    assert supports(256, 4096, 28672, 128, 4, torch.bfloat16)
    assert supports(17, 4096, 4096, 64, 4, torch.float16)
    assert not supports(64, 4096, 4096, 128, 8, torch.bfloat16)  # 4-bit only
    assert not supports(64, 4096, 4096, 32, 4, torch.bfloat16)  # a chunk inside one group
    assert not supports(64, 4096, 4224, 128, 4, torch.bfloat16)  # N % 256
    assert not supports(64, 4096, 4096, 128, 4, torch.float32)


def test_the_engine_plan_follows_the_switch_and_only_names_built_kernels(monkeypatch):
    monkeypatch.delenv("OCTAVO_SWAPAB_WIDE_PLAN", raising=False)
    assert swapab_wide.engine_plan(20, 4096) == {"nt": 4, "warps": 4, "wsmem": False,
                                                 "ctas_per_sm": 2}
    monkeypatch.setenv("OCTAVO_SWAPAB_WIDE_PLAN", "8,1,3")
    for m, n in ((17, 4096), (200, 4096), (200, 768)):
        p = swapab_wide.engine_plan(m, n)
        assert p["ctas_per_sm"] == 3 and p["wsmem"]
        assert (p["nt"], p["warps"], 4, True) in swapab_wide.BUILT  # no (4, 8, 4, True)
        assert n % (64 * p["warps"]) == 0  # 768 columns: 4 warps
    for bad in ("8,0", "6,0,2", "4,2,2", "4,0,0", "x"):
        monkeypatch.setenv("OCTAVO_SWAPAB_WIDE_PLAN", bad)
        with pytest.raises(ValueError, match="OCTAVO_SWAPAB_WIDE_PLAN"):
            swapab_wide.engine_plan(64, 4096)


def test_available_where_built_unless_turned_off(monkeypatch):
    cuda_checks.check_switch(monkeypatch, swapab_wide, "OCTAVO_CUDA_KERNELS", default=True)


@pytest.mark.skipif(cuda_module.nvcc_path() is None, reason="no nvcc on this machine")
def test_the_source_builds_for_hopper_without_spills(tmp_path, monkeypatch):
    spills = cuda_checks.build_once(swapab_wide.SOURCE, NAMES, tmp_path, monkeypatch)
    assert not any(spills.values()), spills


def test_the_emulated_constants_are_the_source_s():
    src = SRC.read_text()
    assert "constexpr int kChunk = 64;" in src and swapab_wide.CHUNK == 64
    assert "constexpr int COLS = 64 * WARPS;" in src
    # The swizzle: written and read with the same piece ^ 4 (row & 1).
    assert len(re.findall(r"\^ \(\(r & 1\) << 2\)", src)) == 2
    for nt, warps, stages, ws in sorted(swapab_wide.BUILT):
        suffix = "true, _ws" if ws else "false, "
        assert f"OCTAVO_SWAPAB_WIDE(TN, T, SN, S, {nt}, {warps}, {stages}, {suffix})" in src
    # The staged weights: each lane reads back the pieces it copied.
    assert src.count("(2 * i) * 32 + lane") == 2 and src.count("(2 * i + 1) * 32 + lane") == 2
    assert ("return 8 * NT * kChunk / 8 + 2 * (64 * WARPS / 8) + (WSMEM ? WARPS * 128 : 0);"
            in src)
    assert swapab_wide.stage_bytes(8, 4, True) == 16 * (512 + 64 + 512)


# --- the kernel's mapping, emulated on the CPU ----------------------------------------------

G, T = cuda_checks.G, cuda_checks.T


def _stage(x, scales, zeros, m0, bm, k, col0, cols, group):
    """One stage of shared memory as ``issue`` fills it: [bm * 8 + cols / 4] pieces of 8
    values (the activations' piece p of row r at r * 8 + (p ^ 4 (r & 1)), zeros past M; then
    the CTA's ``cols`` scales and as many zeros of the chunk's group, 8 columns a piece)."""
    m = x.shape[0]
    sz = cols // 8
    st = np.full((bm * 8 + 2 * sz, 8), np.nan)
    for r in range(bm):
        for p in range(8):
            st[r * 8 + (p ^ ((r & 1) << 2))] = (x[m0 + r, k + 8 * p:k + 8 * p + 8]
                                                if m0 + r < m else 0.0)
    grp = k // group
    for i in range(2 * sz):
        src = scales if i < sz else zeros
        st[bm * 8 + i] = src[grp, col0 + 8 * (i % sz):col0 + 8 * (i % sz) + 8]
    return st


def _emulate(x, packed, scales, zeros, group, dtype, p):
    """What cuda/swapab_wide.cu computes for x [M, K] over ``pack_swapab``'s 4-bit int16
    [N / 4, K] under plan ``p``: per CTA (block, row tile, split) and warp, the lanes' weight
    loads (rows g, g + 8 at k + 8t; words 2h, 2h + 1 of a step are K 8t + 4h + {0, 1}, {2, 3}),
    bias + q by the kernel's bit operations, (v - (bias + z)) s per pair, the activations read
    back from the swizzled stage, the mma per value and batch tile, the splits' partials added
    in order and the output offsets. float64 throughout (the data keep every value exact)."""
    m, k = x.shape
    n = packed.shape[0] * 4
    bias = 128.0 if dtype == torch.bfloat16 else 1024.0
    u16 = packed.numpy().view(np.uint16).astype(np.uint32)
    words = u16[:, 0::2] | (u16[:, 1::2] << 16)
    s64, z64 = scales.double().numpy(), zeros.double().numpy()
    bm = 8 * p.nt
    cols = 64 * p.warps
    out = np.full((m, n), np.nan)
    for block in range(p.blocks):
        col0 = block * cols
        for rt in range(p.row_tiles):
            m0 = rt * bm
            for warp in range(p.warps):
                total = np.zeros((p.nt, 4, 32, 4))
                for split in range(p.splits):
                    acc = np.zeros((p.nt, 4, 32, 4))
                    k_begin = split * p.k_per_split
                    k_end = min(k_begin + p.k_per_split, k)
                    ra_row = block * 16 * p.warps + warp * 16 + G
                    rb_row = ra_row + 8
                    n0 = (ra_row >> 6) * 256 + (ra_row & 63)
                    for kc in range(k_begin, k_end, 64):
                        st = _stage(x, s64, z64, m0, bm, kc, col0, cols, group)
                        sz = st[bm * 8:].reshape(-1)  # the ushort view: scales, then zeros
                        sc = np.zeros((4, 2, 32))
                        zb = np.zeros((4, 2, 32))
                        for c in range(4):
                            for r in range(2):
                                col = n0 - col0 + 8 * r + 64 * c
                                sc[c, r], zb[c, r] = sz[col], sz[cols + col] + bias
                        for i in range(2):
                            a = np.zeros((2, 4, 32, 4, 2))
                            for h in range(2):
                                w = (kc + 32 * i + 8 * T + 4 * h) // 2
                                regs = (words[ra_row, w], words[rb_row, w],
                                        words[ra_row, w + 1], words[rb_row, w + 1])
                                for c in range(4):
                                    for j, reg in enumerate(regs):
                                        v = _halves(_nibbles(reg, c, dtype), dtype)
                                        row = j & 1  # registers 0, 2: row g; 1, 3: row g + 8
                                        a[h, c, :, j] = ((v - zb[c, row][:, None])
                                                         * sc[c, row][:, None])
                            for jt in range(p.nt):
                                r = jt * 8 + G
                                xv = st[r * 8 + ((4 * i + T) ^ ((r & 1) << 2))]  # [32, 8]
                                for h in range(2):
                                    b = np.stack([xv[:, 4 * h:4 * h + 2],
                                                  xv[:, 4 * h + 2:4 * h + 4]], 1)
                                    for c in range(4):
                                        cuda_checks.mma16816(acc[jt, c], a[h, c], b)
                    total += acc  # the last ticket's sum, in split order
                for jt in range(p.nt):
                    for i in range(4):
                        row = m0 + jt * 8 + 2 * T + (i & 1)
                        ok = row < m
                        for c in range(4):
                            col = (n0 if i < 2 else n0 + 8) + 64 * c
                            out[row[ok], col[ok]] = total[jt, c][ok, i]
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m,k,n,group,splits,warps", [
    (5, 128, 256, 64, 1, 4),  # one partial row tile
    (33, 256, 512, 128, 2, 4),  # 8 batch tiles, two CTAs, a split inside a group
    (70, 192, 256, 64, 3, 4),  # two row tiles (the second partial), three splits
    (20, 128, 1024, 64, 2, 8),  # 8 warps: two layout blocks a CTA
    (40, 192, 512, 64, 1, 8),
])
def test_the_fragment_mapping_computes_x_at_dequantized_w(dtype, m, k, n, group, splits,
                                                          warps):
    x, packed, scales, zeros, ref = _data(m, k, n, group, 4, dtype)
    p = plan(m, k, n, 132, splits=splits, warps=warps)
    assert p.splits == splits
    got = _emulate(x, packed, scales, zeros, group, dtype, p)
    np.testing.assert_array_equal(got, ref)


def test_a_wrong_swizzle_read_fails():
    x, packed, scales, zeros, ref = _data(16, 64, 256, 64, 4, torch.bfloat16)
    p = plan(16, 64, 256, 132)
    st = _stage(x, scales.double().numpy(), zeros.double().numpy(), 0, 32, 0, 0, 256, 64)
    r = 1 * 8 + G  # batch tile 1: rows 8-15, odd rows swizzled
    right = st[r * 8 + ((4 * 0 + T) ^ ((r & 1) << 2))]
    wrong = st[r * 8 + (4 * 0 + T)]
    np.testing.assert_array_equal(right, x[r[:, None], 8 * T[:, None] + np.arange(8)])
    assert not np.array_equal(wrong, right)
    assert p.nt == 4


# --- on the GPU ---------------------------------------------------------------------------

gpu = pytest.mark.skipif(not torch.cuda.is_available()
                         or cuda_module.module(swapab_wide.SOURCE, torch.device("cuda")) is None,
                         reason="needs an NVIDIA GPU and nvcc")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype,scale_dtype", [(torch.bfloat16, None), (torch.float16, None),
                                               (torch.bfloat16, torch.float16)])
@pytest.mark.parametrize("m", [17, 32, 33, 64, 100, 129, 256])
@pytest.mark.parametrize("k,n,group", [(512, 768, 64), (1024, 512, 128), (4096, 4096, 128),
                                       (14336, 1024, 128)])
def test_matches_the_float64_reference_gpu(dtype, scale_dtype, m, k, n, group):
    x, qw, s, z, ref = _case(m, k, n, group, dtype, scale_dtype=scale_dtype)
    out = swapab_wide.swapab_wide(x, qw, s, z, group)
    assert out.dtype == dtype and out.shape == (m, n) and torch.isfinite(out).all()
    assert _rel(out, ref) < (8e-3 if dtype == torch.bfloat16 else 2e-3)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("splits", [1, 2, 7])
@pytest.mark.parametrize("nt,warps,stages,wsmem", sorted(swapab_wide.BUILT))
def test_every_plan_gives_the_same_answer_and_leaves_the_counters_zeroed_gpu(splits, nt,
                                                                             warps, stages,
                                                                             wsmem):
    from octavo.kernels import split_k

    x, qw, s, z, ref = _case(80, 2048, 1024, 128, torch.bfloat16)
    kw = {"nt": nt, "splits": splits, "warps": warps, "wsmem": wsmem}
    out = swapab_wide.swapab_wide(x, qw, s, z, 128, **kw)
    assert _rel(out, ref) < 8e-3
    again = swapab_wide.swapab_wide(x, qw, s, z, 128, **kw)
    assert torch.equal(again, out)  # the split sums in a fixed order
    torch.cuda.synchronize()
    assert not split_k.counters(x.device, 1).any()


@pytest.mark.gpu
@gpu
def test_the_engine_routes_the_opted_in_rows_and_graph_replays_match_gpu(monkeypatch):
    from octavo.kernels.w4a16_swapab import dequantize_swapab
    from tests.quantization.gemm_checks import check_graph_replays

    x, qw, s, z, ref = _case(200, 1024, 1024, 128, torch.bfloat16)
    calls = cuda_checks.count_rows(monkeypatch, swapab_wide, "swapab_wide")
    monkeypatch.setenv("OCTAVO_SWAPAB_WIDE_MIN_M", "129")
    out = int_weight_layout.linear(x, qw, s, z, 128, 4, int_weight_layout.SWAPAB)
    int_weight_layout.linear(x[:64], qw, s, z, 128, 4, int_weight_layout.SWAPAB)
    assert calls == [200] and _rel(out, ref) < 8e-3
    wd = dequantize_swapab(qw, s, z, 128, 4, torch.float32).double()  # [K, N]
    check_graph_replays(lambda xx: swapab_wide.swapab_wide(xx, qw, s, z, 128),
                        lambda xx: xx.double() @ wd, x[:40].clone())
