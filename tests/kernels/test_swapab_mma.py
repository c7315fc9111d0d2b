"""The CUDA C++ 4- and 8-bit swap-AB GEMM (octavo/kernels/swapab_mma.py, cuda/swapab_mma.cu):
the launch plan and the nvcc build on any machine with nvcc; the kernel's bit operations
(int -> bf16 / fp16 operand) and fragment mapping emulated lane by lane on the CPU; against the
float64 reference on the GPU (every batch size 1-16, group sizes, split and unsplit tiles, PDL,
graph replays)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from octavo.kernels import cuda_module, swapab_mma
from octavo.kernels.swapab_mma import plan, supports
from tests.kernels import cuda_checks

NAMES = [f"swapab_mma_{t}_{sc}_w{b}_m{m}_s{s}" for t in ("bf16", "f16")
         for sc in ("bf16", "f16") for b in (4, 8) for m in (8, 16) for s in (1, 2, 4)] + [
    f"swapab_mma_{t}_{sc}_w{b}_m{m}_s4_p{p}" for t in ("bf16", "f16")
    for sc in ("bf16", "f16") for b in (4, 8) for m in (8, 16) for p in (3, 4)] + [
    f"swapab_mma_{t}_{sc}_w{b}_m{m}_s4_glu" for t in ("bf16", "f16") for sc in ("bf16", "f16")
    for b in (4, 8) for m in (8, 16)]


@pytest.mark.parametrize("k,n,group", [(4096, 28672, 128), (4096, 4096, 128),
                                       (14336, 4096, 128), (4096, 6144, 128), (256, 256, 32),
                                       (192, 512, 64), (4096, 4096, 4096), (128, 256, 128)])
@pytest.mark.parametrize("sms,per_sm", [(132, 16), (132, 8), (4, 16)])
def test_plan_covers_k_once_in_whole_chunks_of_one_group(k, n, group, sms, per_sm):
    p = plan(k, n, group, sms, per_sm)
    assert group % p.chunk == 0 and p.k_per_warp % p.chunk == 0
    assert 1 <= p.warps <= swapab_mma.MAX_WARPS
    covered = p.warps * p.splits * p.k_per_warp
    assert covered >= k
    assert (p.splits - 1) * p.warps * p.k_per_warp < k  # no CTA of idle warps only
    tiles = n // 64
    assert tiles * p.warps * p.splits <= max(per_sm * sms, tiles) * 2


def test_plan_fills_the_gpu_with_k_splits_where_there_are_few_tiles():
    o_proj = plan(4096, 4096, 128, 132, split_ctas=True)  # 64 tiles: about 6 warps per SM in all
    assert 132 * 5 <= o_proj.warps * o_proj.splits * 64 <= 132 * 8 and o_proj.splits > 1
    gate_up = plan(4096, 28672, 128, 132)  # 448 tiles: a few warps each, one CTA
    assert gate_up.splits == 1


@pytest.mark.parametrize("k,n,group", [(4096, 4096, 128), (14336, 4096, 128), (4096, 6144, 128),
                                       (4096, 28672, 128), (4096, 1024, 128), (192, 512, 64)])
def test_a_plan_without_cta_splits_keeps_each_tile_in_one_cta_where_tiles_fill_the_sms(k, n,
                                                                                      group):
    split = plan(k, n, group, 132, split_ctas=True)
    whole = plan(k, n, group, 132, split_ctas=False)
    tiles = n // 64
    if split.splits == 1 or tiles * swapab_mma.MAX_WARPS < 132:
        assert whole == split  # nothing to change, or too few tiles to fill the SMs alone
        return
    assert whole.splits == 1 and whole.warps <= swapab_mma.MAX_WARPS
    assert whole.k_per_warp % whole.chunk == 0 and group % whole.chunk == 0
    assert whole.warps * whole.k_per_warp >= k > (whole.warps - 1) * whole.k_per_warp


def test_by_default_a_tile_stays_in_one_cta_where_its_warps_walk_few_chunks():
    o_proj = plan(4096, 4096, 128, 132)  # one CTA: 8 warps of 4 chunks (was 2 CTAs of 6)
    assert o_proj == plan(4096, 4096, 128, 132, split_ctas=False) and o_proj.splits == 1
    down = plan(14336, 4096, 128, 132)  # one CTA would mean 14 chunks a warp: split
    assert down == plan(14336, 4096, 128, 132, split_ctas=True) and down.splits > 1
    assert plan(4096, 1024, 128, 132).splits > 1  # 16 tiles cannot fill 132 SMs alone


def test_the_engine_plan_follows_its_switches(monkeypatch):
    assert swapab_mma.engine_plan() == {"warps_per_sm": swapab_mma.WARPS_PER_SM,
                                        "split_ctas": None, "stages": None}
    monkeypatch.setenv("OCTAVO_SWAPAB_SPLIT_CTAS", "1")
    assert swapab_mma.engine_plan()["split_ctas"] is True
    monkeypatch.setenv("OCTAVO_SWAPAB_SPLIT_CTAS", "0")
    monkeypatch.setenv("OCTAVO_SWAPAB_WARPS_PER_SM", "4")
    assert swapab_mma.engine_plan() == {"warps_per_sm": 4, "split_ctas": False,
                                        "stages": None}
    monkeypatch.setenv("OCTAVO_SWAPAB_WARPS_PER_SM", "four")
    with pytest.raises(ValueError, match="OCTAVO_SWAPAB_WARPS_PER_SM"):
        swapab_mma.engine_plan()


def test_a_layer_plan_overrides_one_shape(monkeypatch):
    """OCTAVO_SWAPAB_LAYER_PLAN: the named shapes' warps per SM (and stages where given)
    over the global switches; other shapes, bits and calls without a shape keep those."""
    monkeypatch.setenv("OCTAVO_SWAPAB_WARPS_PER_SM", "6")
    monkeypatch.setenv("OCTAVO_SWAPAB_LAYER_PLAN", " 4096,6144,4=16/3; 4096,4096,4=4 ;")
    assert swapab_mma.engine_plan(4096, 6144, 4) == {"warps_per_sm": 16, "split_ctas": None,
                                                    "stages": 3}
    assert swapab_mma.engine_plan(4096, 4096, 4) == {"warps_per_sm": 4, "split_ctas": None,
                                                    "stages": None}
    for other in ((4096, 6144, 8), (14336, 4096, 4)):
        assert swapab_mma.engine_plan(*other)["warps_per_sm"] == 6
    assert swapab_mma.engine_plan()["warps_per_sm"] == 6
    for bad in ("4096,6144=16", "4096,6144,4=0", "4096,6144,4=8/2", "4096,6144,3=8",
                "4096,6144,4=eight", "4096,6144,4"):
        monkeypatch.setenv("OCTAVO_SWAPAB_LAYER_PLAN", bad)
        with pytest.raises(ValueError, match="OCTAVO_SWAPAB_LAYER_PLAN"):
            swapab_mma.engine_plan(4096, 6144, 4)


def test_8_bit_gated_launches_of_few_rows_aim_at_more_warps(monkeypatch):
    """An 8-bit gated launch (gate_up) of 1-8 rows aims at GLU8_WARPS_PER_SM warps per SM
    (session 62); plain launches, 4-bit ones and more rows keep WARPS_PER_SM; the global
    switch and a layer plan still override it."""
    monkeypatch.delenv("OCTAVO_SWAPAB_WARPS_PER_SM", raising=False)
    monkeypatch.delenv("OCTAVO_SWAPAB_LAYER_PLAN", raising=False)
    gate_up = (4096, 28672)
    for m in (1, 8):
        assert swapab_mma.engine_plan(*gate_up, 8, m, glu=True)["warps_per_sm"] == 16
    for args, glu in (((8, 9), True), ((8, 1), False), ((4, 1), True), ((8, None), True)):
        assert swapab_mma.engine_plan(*gate_up, *args, glu=glu)["warps_per_sm"] == 6
    monkeypatch.setenv("OCTAVO_SWAPAB_LAYER_PLAN", "4096,28672,8=12")
    assert swapab_mma.engine_plan(*gate_up, 8, 1, glu=True)["warps_per_sm"] == 12
    monkeypatch.delenv("OCTAVO_SWAPAB_LAYER_PLAN")
    monkeypatch.setenv("OCTAVO_SWAPAB_WARPS_PER_SM", "6")
    assert swapab_mma.engine_plan(*gate_up, 8, 1, glu=True)["warps_per_sm"] == 6


@pytest.mark.parametrize("glu", [False, True])
def test_the_engine_s_calls_carry_their_layer_plan(glu, monkeypatch):
    """int_weight_layout's plain and gated entries hand the kernel the plan of their own
    weight shape (the kernel recorded, the CUDA path forced on CPU tensors)."""
    from octavo.kernels import int_weight_layout

    calls = []
    monkeypatch.setattr(swapab_mma, "available", lambda device: True)
    monkeypatch.setattr(swapab_mma, "swapab_mma", lambda x2, qw, *a, **kw: calls.append(
        (qw.shape[0], kw)) or torch.zeros(x2.shape[0], qw.shape[0] * 2 // (2 if kw.get(
            "glu") else 1)))
    monkeypatch.setenv("OCTAVO_SWAPAB_LAYER_PLAN", "256,512,8=12/3")
    k, n, bits = 256, 512, 8
    qw = torch.zeros(n // 2, k, dtype=torch.int16)
    sz = torch.ones(k // 128, n)
    x = torch.randn(1, k).to(torch.bfloat16)
    if glu:
        int_weight_layout.gated_blocked(x, qw, sz, sz, 128, bits, swapab_mma.GLU_BLOCKS[8])
    else:
        int_weight_layout.linear(x, qw, sz, sz, 128, bits, int_weight_layout.SWAPAB)
    assert len(calls) == 1 and calls[0][1]["warps_per_sm"] == 12 and calls[0][1]["stages"] == 3
    assert calls[0][1].get("glu", False) is glu
    monkeypatch.setenv("OCTAVO_SWAPAB_LAYER_PLAN", "256,512,4=12/3")  # another bits: not ours
    int_weight_layout.linear(x, qw, sz, sz, 128, bits, int_weight_layout.SWAPAB)
    assert calls[-1][1]["warps_per_sm"] == swapab_mma.WARPS_PER_SM
    # Without a plan for the shape: the plain call keeps the default, the gated one of one
    # row (8-bit) aims at GLU8_WARPS_PER_SM.
    if glu:
        int_weight_layout.gated_blocked(x, qw, sz, sz, 128, bits, swapab_mma.GLU_BLOCKS[8])
        assert calls[-1][1]["warps_per_sm"] == swapab_mma.GLU8_WARPS_PER_SM


def test_supports():
    assert supports(1, 4096, 4096, 128, 4, torch.bfloat16)
    assert supports(16, 4096, 6144, 32, 4, torch.float16)
    assert not supports(17, 4096, 4096, 128, 4, torch.bfloat16)  # batch
    assert supports(1, 4096, 4224, 128, 8, torch.bfloat16)  # 8-bit tiles: 128 columns
    assert not supports(1, 4096, 4096, 128, 3, torch.bfloat16)  # bits
    assert not supports(1, 4096, 4096, 128, 4, torch.float32)  # dtype
    assert not supports(1, 4096, 4224, 128, 4, torch.bfloat16)  # N % 256 (4-bit)
    assert not supports(1, 4096, 4096, 16, 4, torch.bfloat16)  # group % 32


def test_available_where_built_unless_turned_off(monkeypatch):
    cuda_checks.check_switch(monkeypatch, swapab_mma, "OCTAVO_CUDA_KERNELS", default=True)


@pytest.mark.skipif(cuda_module.nvcc_path() is None, reason="no nvcc on this machine")
def test_the_source_builds_for_hopper_without_spills(tmp_path, monkeypatch):
    spills = cuda_checks.build_once(swapab_mma.SOURCE, NAMES, tmp_path, monkeypatch)
    # The batch-8 kernels (up to 8 rows: the decode path) spill nothing; the 16-row ones at
    # most a word or two (ptxas chose 128 registers for one, 4 bytes spilled).
    for name, spilled in spills.items():
        assert spilled <= (0 if "_m8_" in name else 8), (name, spilled)


@pytest.mark.parametrize("bits", [4, 8])
def test_a_stage_s_scale_segments_hold_every_lane_s_columns(bits):
    """The staged kernels copy a tile's scales and zeros as VALUES segments of 16 columns,
    col0 + 64 c + [0, 16) (col0 the column of the tile's first int16 row), and lane g reads
    entries g and g + 8 of each: those must be the columns of its rows (n0 + 64 c,
    n1 + 64 c), for every tile of a wide layer."""
    values = 16 // bits
    for tile in range(64):
        col0 = _column(bits, tile * 16)
        for g in range(8):
            n0, n1 = _column(bits, tile * 16 + g), _column(bits, tile * 16 + g + 8)
            for c in range(values):
                assert col0 + 64 * c + g == n0 + 64 * c and col0 + 64 * c + g + 8 == n1 + 64 * c
    src = cuda_checks.source_text(swapab_mma.SOURCE)
    assert "col0 + 64 * ((lane >> 1) % VALUES) + 8 * (lane & 1)" in src
    assert "sv[c][0] = sz[16 * c + g]; sv[c][1] = sz[16 * c + g + 8];" in src


@pytest.mark.parametrize("m,bits", [(1, 4), (8, 4), (9, 4), (16, 4), (16, 8)])
def test_staged_ctas_fit_the_shared_memory(m, bits):
    limit = 227 * 1024
    for stages in (3, 4):
        warps = swapab_mma.staged_warps(m, 4, bits, stages, 8, limit)
        assert 1 <= warps <= 8
        assert warps * stages * swapab_mma.stage_bytes(m, 4, bits) <= limit
        # The reduction of the CTA's warps reuses the rings: (warps - 1) x the accumulators.
        acc_bytes = (1 if m <= 8 else 2) * (16 // bits) * 4 * 32 * 4
        assert (warps - 1) * acc_bytes <= warps * stages * swapab_mma.stage_bytes(m, 4, bits)
    assert swapab_mma.stage_bytes(16, 4, 4) == 16 * (256 + 256 + 16)  # the source's STAGE
    assert swapab_mma.staged_warps(16, 4, 4, 4, 8, limit) == 6  # 8 would need 264 KiB


def test_stages_outside_the_choices_are_refused(monkeypatch):
    monkeypatch.setenv("OCTAVO_SWAPAB_STAGES", "2")
    with pytest.raises(ValueError, match="OCTAVO_SWAPAB_STAGES must be 0, 3 or 4, got 2"):
        swapab_mma.engine_plan()
    monkeypatch.setenv("OCTAVO_SWAPAB_STAGES", "3")
    assert swapab_mma.engine_plan()["stages"] == 3
    monkeypatch.setenv("OCTAVO_SWAPAB_STAGES", "0")
    assert swapab_mma.engine_plan()["stages"] == 0


def test_by_default_stages_run_on_few_tiles_at_one_to_eight_rows():
    for m in (1, 8):
        assert swapab_mma.default_stages(m, 6144, 4) == 3  # qkv: 96 tiles
        assert swapab_mma.default_stages(m, 4096, 4) == 3  # o, down
        assert swapab_mma.default_stages(m, 28672, 4) == 0  # gate_up: 448 tiles
        assert swapab_mma.default_stages(m, 4096, 8) == 3  # 8-bit: 128-column tiles
    assert swapab_mma.default_stages(9, 4096, 4) == 0
    assert swapab_mma.default_stages(16, 6144, 4) == 0


def test_a_source_that_does_not_compile_names_nvcc_s_error(tmp_path, monkeypatch):
    if cuda_module.nvcc_path() is None:
        pytest.skip("no nvcc on this machine")
    monkeypatch.setenv("OCTAVO_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cuda_module, "SOURCE_DIR", tmp_path)
    (tmp_path / "broken.cu").write_text("extern \"C\" __global__ void k() { undefined_x; }\n")
    with pytest.raises(cuda_module.CudaError, match="(?s)nvcc failed on broken.cu.*undefined_x"):
        cuda_module.build("broken.cu", "sm_90")


# --- the kernel's bit operations and fragment mapping, emulated on the CPU ----------------

G, T = cuda_checks.G, cuda_checks.T
U32 = np.uint32


def _lop3(a, b, c, lut):
    """PTX lop3.b32: each result bit is bit (a << 2 | b << 1 | c) of ``lut``."""
    a, b, c = (np.asarray(v, dtype=np.uint64) & 0xFFFFFFFF for v in (a, b, c))
    out = np.zeros(np.broadcast(a, b, c).shape, dtype=np.uint64)
    for i in range(8):
        if lut >> i & 1:
            sa = a if i & 4 else ~a
            sb = b if i & 2 else ~b
            sc = c if i & 1 else ~c
            out |= sa & sb & sc
    return (out & 0xFFFFFFFF).astype(U32)


def _prmt(a, b, sel):
    """PTX prmt.b32 (default mode): result byte i is byte (sel >> 4i) & 7 of b:a."""
    src = (np.asarray(b, dtype=np.uint64) << 32) | np.asarray(a, dtype=np.uint64)
    out = np.zeros(src.shape, dtype=np.uint64)
    for i in range(4):
        out |= ((src >> (8 * ((sel >> 4 * i) & 7))) & 0xFF) << (8 * i)
    return out.astype(U32)


def _halves(r, dtype):
    """A 32-bit register's two 16-bit floats (low half first) as float64, [..., 2]."""
    r = np.asarray(r, dtype=U32)
    h = np.stack([r & 0xFFFF, r >> 16], -1).astype(np.uint16)
    if dtype == torch.float16:
        return h.view(np.float16).astype(np.float64)
    return (h.astype(U32) << 16).view(np.float32).astype(np.float64)


def _bf16x2(v):
    """float64 pairs [..., 2] rounded to bf16 (nearest even) as a register."""
    t = torch.from_numpy(np.ascontiguousarray(v)).to(torch.bfloat16).view(torch.int16)
    h = t.numpy().astype(np.uint16).astype(U32)
    return h[..., 0] | (h[..., 1] << 16)


# swapab_mma.cu's conversions, step by step (the constants are checked against the source in
# test_the_emulated_constants_are_the_source_s). Knobs make the wrong variants the mapping
# test must reject.
BYTE_SEL = (0x4240, 0x4341)  # fp16: prmt selectors of byte 0 / byte 1 of each int16


def _nibbles(v, c, dtype):
    magic = 0x43004300 if dtype == torch.bfloat16 else 0x64006400
    return _lop3(np.asarray(v, dtype=U32) >> U32(4 * c), 0x000F000F, magic, 0xEA)


def _bytes(v, c, dtype, sel=BYTE_SEL, shift=8, y_lut=0x6A):
    v = np.asarray(v, dtype=U32)
    if dtype == torch.float16:
        return _prmt(v, 0x64646464, sel[c])
    if c:
        v = v >> U32(shift)
    lo = _lop3(v, 0x007F007F, 0x43004300, 0xEA)  # 128 + (q & 127)
    y = _lop3(v, 0x00800080, 0x43804380, y_lut)  # 256 or 128
    # fma.rn.bf16x2 y, -1, lo: exact product and sum in float64, one rounding to bf16.
    return _bf16x2(_halves(y, dtype) * -1.0 + _halves(lo, dtype))


def _bias(bits, dtype):  # what each operand holds beyond q (the kernel's BIAS)
    if bits == 4:
        return 128.0 if dtype == torch.bfloat16 else 1024.0
    return -128.0 if dtype == torch.bfloat16 else 1024.0


def _column(bits, row):
    return (row >> 6) * (256 if bits == 4 else 128) + (row & 63)


def _emulate(x, packed, scales, zeros, group, bits, dtype, steps, convert=None, bias=None,
             swap_halves=False):
    """What cuda/swapab_mma.cu computes for x [M, K] (float64 values of ``dtype``) over
    ``pack_swapab``'s int16 [N / per, K], one warp per 16-row tile over all of K: each
    lane's 16-byte loads of rows g and g + 8 at k + 8t (words 2h, 2h + 1 of a step's uint4 are
    physical K 8t + 4h + {0, 1} and {2, 3}), the operands converted by the kernel's bit
    operations, the mma per block and on the ones operand, the fold once per group
    (s (tmp - (z + bias) xs)) and the output offsets. float64 throughout."""
    convert = convert or (_nibbles if bits == 4 else _bytes)
    bias = _bias(bits, dtype) if bias is None else bias
    values = 16 // bits
    m, k = x.shape
    rows = packed.shape[0]
    n = rows * values
    u16 = packed.numpy().view(np.uint16).astype(U32)
    words = u16[:, 0::2] | (u16[:, 1::2] << 16)  # [rows, K / 2]: K pairs, low half first
    s64, z64 = scales.double().numpy(), zeros.double().numpy()
    out = np.full((m, n), np.nan)
    ones = np.ones((32, 4, 2))
    chunk = 32 * steps
    for tile in range(rows // 16):
        ra_row, rb_row = tile * 16 + G, tile * 16 + 8 + G
        n0, n1 = _column(bits, ra_row), _column(bits, rb_row)
        for mt in range(1 if m <= 8 else 2):
            xrow = mt * 8 + G
            acc = np.zeros((values, 32, 4))
            tmp = np.zeros((values, 32, 4))
            xs = np.zeros((32, 4))
            for kk in range(0, k, chunk):
                for i in range(steps):
                    for h in range(2):
                        kw = kk + 32 * i + 8 * T + 4 * h  # this lane's physical K
                        w = (kw // 2)
                        ra0, ra1 = words[ra_row, w], words[ra_row, w + 1]
                        rb0, rb1 = words[rb_row, w], words[rb_row, w + 1]
                        xv = np.where((xrow < m)[:, None],
                                      x[np.minimum(xrow, m - 1)[:, None], kw[:, None]
                                        + np.arange(4)], 0.0)
                        b = np.stack([xv[:, 0:2], xv[:, 2:4]], 1)
                        for c in range(values):
                            a = np.stack([_halves(convert(r, c, dtype), dtype)
                                          for r in (ra0, rb0, ra1, rb1)], 1)
                            if swap_halves:
                                a = a[:, :, ::-1]
                            cuda_checks.mma16816(tmp[c], a, b)
                        cuda_checks.mma16816(xs, ones, b)
                if (kk + chunk) % group == 0 or kk + chunk >= k:
                    grp = kk // group
                    for c in range(values):
                        for i in range(4):
                            col = (n0 if i < 2 else n1) + 64 * c
                            s, z = s64[grp, col], z64[grp, col] + bias
                            acc[c][:, i] += s * (tmp[c][:, i] - z * xs[:, i])
                    tmp[:] = 0.0
                    xs[:] = 0.0
            for i in range(4):
                row = mt * 8 + 2 * T + (i & 1)
                ok = row < m
                for c in range(values):
                    col = (n0 if i < 2 else n1) + 64 * c
                    out[row[ok], col[ok]] = acc[c][ok, i]
    return out


def _data(m, k, n, group, bits, dtype, seed=0):
    """Integer activations (exact in bf16 / fp16 and in every float64 sum), integer zeros,
    power-of-two scales: the emulation must equal the reference exactly."""
    from octavo.kernels.w4a16_swapab import pack_swapab

    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 2**bits, (k, n), generator=g)
    q[:2, :4] = torch.tensor([[0, 2**bits - 1, 2**(bits - 1) - 1, 2**(bits - 1)]] * 2)
    scales = 2.0 ** -torch.randint(4, 9, (k // group, n), generator=g).double()
    zeros = torch.randint(0, 2**bits + 1, (k // group, n), generator=g).double()
    x = torch.randint(-8, 9, (m, k), generator=g).double()
    ref = x @ ((q.double() - zeros.repeat_interleave(group, 0))
               * scales.repeat_interleave(group, 0))
    return x.numpy(), pack_swapab(q, bits), scales.to(dtype), zeros.to(dtype), ref.numpy()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bits", [4, 8])
def test_every_value_converts_to_exactly_bias_plus_q(bits, dtype):
    """Every value in every position of a 32-bit word (two int16 of 16 / bits values each),
    under random bits elsewhere, becomes exactly bias + q in its half of the operand."""
    rng = np.random.default_rng(bits)
    convert = _nibbles if bits == 4 else _bytes
    per = 16 // bits
    for c in range(per):
        lo, hi = np.meshgrid(np.arange(2**bits), np.arange(2**bits), indexing="ij")
        lo, hi = lo.ravel().astype(U32), hi.ravel().astype(U32)
        junk = rng.integers(0, 2**32, lo.shape, dtype=np.uint64).astype(U32)
        keep = U32(((1 << bits) - 1) << (bits * c))
        keep = keep | (keep << U32(16))
        v = (junk & ~keep) | (lo << U32(bits * c)) | (hi << U32(16 + bits * c))
        got = _halves(convert(v, c, dtype), dtype)
        np.testing.assert_array_equal(got, np.stack([lo, hi], -1) + _bias(bits, dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("m,k,n,group,steps", [(1, 128, 256, 32, 1), (3, 256, 256, 128, 4),
                                               (9, 192, 512, 64, 2), (16, 64, 256, 64, 2)])
def test_the_fragment_mapping_computes_x_at_dequantized_w(bits, dtype, m, k, n, group, steps):
    x, packed, scales, zeros, ref = _data(m, k, n, group, bits, dtype)
    got = _emulate(x, packed, scales, zeros, group, bits, dtype, steps)
    np.testing.assert_array_equal(got, ref)


WRONG = {  # a mistake in the 8-bit conversion or the mapping, per activation dtype
    "fp16 bytes swapped": (torch.float16, dict(convert=lambda v, c, d: _bytes(
        v, c, d, sel=BYTE_SEL[::-1]))),
    "fp16 K pair of byte 1 swapped": (torch.float16, dict(convert=lambda v, c, d: _bytes(
        v, c, d, sel=(0x4240, 0x4143)))),
    "fp16 bias": (torch.float16, dict(bias=1023.0)),
    "bf16 byte 1 unshifted": (torch.bfloat16, dict(convert=lambda v, c, d: _bytes(
        v, c, d, shift=0))),
    "bf16 top bit or-ed": (torch.bfloat16, dict(convert=lambda v, c, d: _bytes(
        v, c, d, y_lut=0xEA))),
    "bf16 bias of 4-bit": (torch.bfloat16, dict(bias=128.0)),
    "bf16 K pair swapped": (torch.bfloat16, dict(swap_halves=True)),
}


@pytest.mark.parametrize("wrong", sorted(WRONG))
def test_a_wrong_8_bit_conversion_or_mapping_fails(wrong):
    dtype, kw = WRONG[wrong]
    x, packed, scales, zeros, ref = _data(2, 128, 256, 64, 8, dtype, seed=3)
    got = _emulate(x, packed, scales, zeros, 64, 8, dtype, 2, **kw)
    assert np.abs(got - ref).max() > 1e-3, wrong


def test_the_emulated_constants_are_the_source_s():
    """The emulation's operations are the kernel's: its selectors, masks, magics, LOP3
    tables, the fma's -1 and the biases, read from swapab_mma.cu."""
    src = cuda_checks.source_text(swapab_mma.SOURCE)
    body = src[src.index("__device__ __forceinline__ uint32_t bytes("):]
    body = body[:body.index("\n}\n")]
    assert f'"n"(C ? {BYTE_SEL[1]:#06x} : {BYTE_SEL[0]:#06x})' in body
    assert '"r"(0x64646464u)' in body and "if (C) v >>= 8;" in body
    assert re.search(r'lop3\.b32 %0, %1, %2, %3, 0xea;" : "=r"\(lo\) : "r"\(v\), '
                     r'"n"\(0x007F007F\), "n"\(0x43004300\)', body)
    assert re.search(r'lop3\.b32 %0, %1, %2, %3, 0x6a;" : "=r"\(y\) : "r"\(v\), '
                     r'"n"\(0x00800080\), "n"\(0x43804380\)', body)
    assert re.search(r'fma\.rn\.bf16x2 %0, %1, %2, %3;" : "=r"\(r\) : "r"\(y\), '
                     r'"r"\(0xBF80BF80u\), "r"\(lo\)', body)
    assert "kBias = Type<T>::kBf16 ? -128.0f : 1024.0f;" in src  # Byte<T>
    assert "kMagic = kBf16 ? 0x43004300u : 0x64006400u;" in src  # nibbles
    assert "kBias = kBf16 ? 128.0f : 1024.0f;" in src
    assert '"n"(0x000F000F), "n"(Type<T>::kMagic)' in src


# --- on the GPU ---------------------------------------------------------------------------

def _case(m, k, n, group, dtype, seed=0, bits=4, scale_dtype=None):
    from octavo.kernels.w4a16_swapab import pack_swapab

    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 2**bits, (k, n), generator=g)
    scales = torch.rand(k // group, n, generator=g) * 0.02 + 0.001
    zeros = torch.randint(0, 2**bits + 1, (k // group, n), generator=g).float()
    x = torch.randn(m, k, generator=g)
    xs, ss, zs = x.to(dtype), scales.to(scale_dtype or dtype), zeros.to(scale_dtype or dtype)
    ref = xs.double() @ ((q.double() - zs.double().repeat_interleave(group, 0))
                         * ss.double().repeat_interleave(group, 0))
    return (xs.cuda(), pack_swapab(q, bits).cuda(), ss.cuda(), zs.cuda(), ref)


def _rel(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm()).item()


gpu = cuda_checks.needs_build(swapab_mma.SOURCE)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [1, 2, 3, 7, 8, 9, 15, 16])
@pytest.mark.parametrize("k,n,group", [(256, 256, 32), (512, 768, 64), (1024, 512, 128),
                                       (4096, 4096, 128), (768, 1024, 256)])
def test_matches_the_float64_reference_gpu(bits, dtype, m, k, n, group):
    x, qw, s, z, ref = _case(m, k, n, group, dtype, bits=bits)
    out = swapab_mma.swapab_mma(x, qw, s, z, group, bits)
    assert out.dtype == dtype and out.shape == (m, n)
    assert torch.isfinite(out).all()
    # The output's own rounding (bf16: 2**-9) dominates; a wrong nibble, column or group
    # gives errors of order 1.
    assert _rel(out, ref) < (8e-3 if dtype == torch.bfloat16 else 2e-3)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("stages", [3, 4])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype,scale_dtype", [(torch.bfloat16, torch.bfloat16),
                                               (torch.float16, torch.float16),
                                               (torch.bfloat16, torch.float16)])
@pytest.mark.parametrize("m", [1, 2, 7, 8, 9, 16])
def test_staged_kernels_match_the_float64_reference_gpu(stages, bits, dtype, scale_dtype, m):
    """The shared-memory pipeline (cp.async, ``stages`` chunks in flight): Llama shapes,
    groups of 128 and 256 and one group per column, one CTA or K split over CTAs, fewer
    chunks than stages, and bit-equal to the registers' pipeline on the same plan."""
    for k, n, group, per_sm, most in [(4096, 4096, 128, 6, 8), (14336, 4096, 128, 6, 8),
                                      (1024, 512, 256, 64, 8), (256, 512, 128, 6, 8),
                                      (2048, 1024, 2048, 6, 8), (2048, 1024, 128, 200, 2)]:
        x, qw, s, z, ref = _case(m, k, n, group, dtype, seed=m, bits=bits,
                                 scale_dtype=scale_dtype)
        out = swapab_mma.swapab_mma(x, qw, s, z, group, bits, warps_per_sm=per_sm,
                                    most_warps=most, stages=stages)
        assert out.dtype == dtype and out.shape == (m, n) and torch.isfinite(out).all()
        assert _rel(out, ref) < (8e-3 if dtype == torch.bfloat16 else 2e-3), (k, n, group)
        plain = swapab_mma.swapab_mma(x, qw, s, z, group, bits, warps_per_sm=per_sm,
                                      most_warps=swapab_mma.staged_warps(
                                          m, 4, bits, stages, most, 227 * 1024), stages=0)
        assert torch.equal(out, plain), (k, n, group)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("scale_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", range(1, 17))
def test_8_bit_at_every_batch_and_scale_dtype_gpu(m, dtype, scale_dtype):
    """The 8-bit path (one bf16 / fp16 operand per byte) against the float64 reference:
    every batch 1-16, both activation and both scale dtypes, groups of 32-256, split and
    unsplit plans."""
    for k, n, group in [(256, 256, 32), (1024, 384, 128), (4096, 1024, 128), (768, 512, 256)]:
        x, qw, s, z, ref = _case(m, k, n, group, dtype, seed=m, bits=8,
                                 scale_dtype=scale_dtype)
        out = swapab_mma.swapab_mma(x, qw, s, z, group, 8)
        assert out.dtype == dtype and out.shape == (m, n) and torch.isfinite(out).all()
        assert _rel(out, ref) < (8e-3 if dtype == torch.bfloat16 else 2e-3), (k, n, group)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("scale_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("m", range(1, 17))
def test_exact_on_integer_data_gpu(m, bits, dtype, scale_dtype):
    """Integer activations (-3..3), integer zeros, power-of-two scales, K 512: every float32
    sum the kernel forms is an exact integer multiple of 2**-8 below 2**24, so its output is
    the float64 reference rounded once to the dtype, bit for bit (every value 0..255 and the
    extremes of both ends of the range in the weights). A wrong operand bit or bias is off."""
    from octavo.kernels.w4a16_swapab import pack_swapab

    for k, n, group, seed in [(512, 384 if bits == 8 else 512, 128, 0), (256, 256, 32, 1)]:
        g = torch.Generator().manual_seed(seed * 100 + m)
        q = torch.randint(0, 2**bits, (k, n), generator=g)
        q[:2 ** bits, 0] = torch.arange(2 ** bits)
        scales = 2.0 ** -torch.randint(4, 9, (k // group, n), generator=g).double()
        zeros = torch.randint(0, 2**bits + 1, (k // group, n), generator=g).double()
        x = torch.randint(-3, 4, (m, k), generator=g).double()
        ref = x @ ((q.double() - zeros.repeat_interleave(group, 0))
                   * scales.repeat_interleave(group, 0))
        out = swapab_mma.swapab_mma(x.to(dtype).cuda(), pack_swapab(q, bits).cuda(),
                                    scales.to(scale_dtype).cuda(),
                                    zeros.to(scale_dtype).cuda(), group, bits)
        assert torch.equal(out.cpu(), ref.to(dtype)), (k, n, group)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("per_sm,most_warps,steps", [(1, 1, 1), (4, 2, 2), (64, 8, 4),
                                                     (16, 3, None), (200, 8, 1)])
@pytest.mark.parametrize("bits", [4, 8])
def test_every_split_and_cta_shape_gives_the_same_answer_gpu(per_sm, most_warps, steps, bits):
    """Plans from one warp per tile to K split over several CTAs (the last-ticket sum),
    with idle warps in the last CTA."""
    x, qw, s, z, ref = _case(5, 2048, 1024, 128, torch.bfloat16, seed=1, bits=bits)
    out = swapab_mma.swapab_mma(x, qw, s, z, 128, bits, warps_per_sm=per_sm, steps=steps,
                                most_warps=most_warps)
    assert _rel(out, ref) < 8e-3
    from octavo.kernels import split_k

    torch.cuda.synchronize()
    assert not split_k.counters(x.device, 1).any()  # every ticket counter back at zero


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype,scale_dtype", [(torch.bfloat16, torch.float16),
                                               (torch.float16, torch.bfloat16)])
@pytest.mark.parametrize("bits", [4, 8])
def test_scales_in_the_other_16_bit_dtype_read_as_stored_gpu(dtype, scale_dtype, bits):
    """GPTQ keeps float16 scales under a bf16 model: read as they are (no conversion per
    call, no bf16 rounding of an fp16 scale)."""
    x, qw, s, z, ref = _case(3, 1024, 512, 128, dtype, bits=bits, scale_dtype=scale_dtype)
    assert s.dtype == scale_dtype
    out = swapab_mma.swapab_mma(x, qw, s, z, 128, bits)
    assert out.dtype == dtype and _rel(out, ref) < 8e-3


@pytest.mark.gpu
@gpu
def test_strided_rows_and_graph_replays_gpu():
    from tests.quantization.gemm_checks import check_graph_replays

    x, qw, s, z, _ = _case(4, 4096, 4096, 128, torch.bfloat16, seed=2)
    wide = torch.randn(4, 4096 + 64, device="cuda", dtype=torch.bfloat16)
    view = wide[:, 64:]  # row stride 4160: 16-byte aligned rows, not contiguous
    ref_w = swapab_mma.swapab_mma(view.contiguous(), qw, s, z, 128)
    assert torch.equal(swapab_mma.swapab_mma(view, qw, s, z, 128), ref_w)

    def ref(xx):
        from octavo.kernels.w4a16_swapab import dequantize_swapab

        return (xx.float() @ dequantize_swapab(qw, s, z, 128, 4, torch.float32))

    check_graph_replays(lambda xx: swapab_mma.swapab_mma(xx, qw, s, z, 128), ref, x)


@pytest.mark.gpu
@gpu
def test_engine_decode_through_the_kernel_matches_the_triton_kernels_gpu(tmp_path, monkeypatch):
    """A bf16 GPTQ 4-bit Llama (dummy weights, every projection 256-column aligned) decodes
    through the CUDA kernel (calls counted) with the logprobs of the Triton kernels' engine
    (OCTAVO_CUDA_KERNELS=0), step by step while the two agree on the token."""
    cuda_checks.gptq_llama(tmp_path, group_size=64)
    calls = cuda_checks.count_rows(monkeypatch, swapab_mma, "swapab_mma")

    monkeypatch.setenv("OCTAVO_INT_WEIGHT_LAYOUT", "swapab")  # layers below the size rule's

    def run(cuda: bool):
        monkeypatch.setenv("OCTAVO_CUDA_KERNELS", "1" if cuda else "0")
        return cuda_checks.greedy_decode(tmp_path, cuda_checks.liven_int)

    triton_out = run(False)
    assert not calls
    cuda_out = run(True)
    assert calls and max(calls) <= len(cuda_checks.PROMPTS)  # the decode steps' batches
    for (t_ids, _), (c_ids, _) in zip(triton_out, cuda_out):
        assert c_ids[0] == t_ids[0]  # the prefill's token (not this kernel)
    compared = cuda_checks.compare_decodes(triton_out, cuda_out, first=1)
    assert compared >= 3 * len(cuda_checks.PROMPTS)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("k,n", [(4096, 4096), (14336, 4096), (1024, 512)])
def test_plans_without_cta_splits_match_the_reference_gpu(k, n):
    for m in (1, 3, 8):
        x, qw, s, z, ref = _case(m, k, n, 128, torch.bfloat16, scale_dtype=torch.float16)
        for per_sm in (4, 6, 12):
            out = swapab_mma.swapab_mma(x, qw, s, z, 128, warps_per_sm=per_sm,
                                        split_ctas=False)
            assert _rel(out, ref) < 8e-3, (m, per_sm)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("per_sm", [6, 200])
def test_writes_into_rows_of_a_given_output_gpu(per_sm):
    """``out=``: the kernel writes its rows of a larger batch's output (one CTA a tile, or K
    split over CTAs with partials of their own), leaving the other rows alone."""
    x, qw, s, z, ref = _case(16, 2048, 1024, 128, torch.bfloat16, seed=3)
    big = torch.full((40, 1024), 7.0, device="cuda", dtype=torch.bfloat16)
    got = swapab_mma.swapab_mma(x, qw, s, z, 128, 4, warps_per_sm=per_sm, out=big[8:24])
    assert got.data_ptr() == big[8:24].data_ptr()
    assert torch.equal(big[8:24], swapab_mma.swapab_mma(x, qw, s, z, 128, 4,
                                                        warps_per_sm=per_sm))
    assert (big[:8] == 7).all() and (big[24:] == 7).all()
    assert _rel(big[8:24], ref) < 8e-3


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("m", [17, 24, 33, 64, 100, 128])
@pytest.mark.parametrize("per_sm", [6, 200])
def test_batches_past_16_rows_in_chunks_of_one_launch_gpu(m, per_sm):
    """17-128 rows: 16-row chunks of one launch (a tile's side by side), each with its own outputs,
    partials and tickets; each chunk's rows bit-equal to a 16-row launch of them."""
    x, qw, s, z, ref = _case(m, 2048, 1024, 128, torch.bfloat16, seed=m)
    out = swapab_mma.swapab_mma(x, qw, s, z, 128, 4, warps_per_sm=per_sm)
    assert out.shape == (m, 1024) and _rel(out, ref) < 8e-3
    for i in range(0, m, 16):
        one = swapab_mma.swapab_mma(x[i:i + 16], qw, s, z, 128, 4, warps_per_sm=per_sm,
                                    stages=0)
        if i + 16 <= m:  # the same 16-row kernel: the same sums
            assert torch.equal(out[i:i + 16], one), i
        else:  # a short last chunk: the 16-row kernel here, the 8-row one alone
            assert _rel(out[i:], one) < 1e-3, i
    from octavo.kernels import split_k

    torch.cuda.synchronize()
    assert not split_k.counters(x.device, 1).any()
    with pytest.raises(ValueError, match="M=129"):
        swapab_mma.swapab_mma(torch.zeros(129, 2048, device="cuda", dtype=torch.bfloat16),
                              qw, s, z, 128, 4)
