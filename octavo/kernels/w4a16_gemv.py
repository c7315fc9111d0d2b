"""Weight-only integer GEMV for decode batches (M = 1..4): ``y = x @ dequant(W)`` on CUDA cores,
for the packed layout of ``octavo.kernels.w4a16_gemm`` (int32 [K / pack, N] packed along K,
float scales and zeros [K / group, N]).

At batch 1 a decode step reads each weight once, so the kernel must run at memory speed; the
instructions spent per weight value are what limit it, not the multiply
(``scripts/triton_sass.py`` counts them). So:

- No tensor cores: ``tl.dot`` would pad M to 16 and convert every dequantized value to bf16.
- No conversion instruction: a shift and a mask-or place the value ``q`` in the mantissa of
  1.0, giving the float ``v = 1 + q * 2**(p - 23)`` (``p``: the value's lowest bit there), and
  one FMA adds ``x * v``; ``sum x q`` comes back from ``sum x v - sum x``. For 4-bit weights
  and 16-bit activations (``PAIRED``) two neighbouring values share one shift, one landing at
  bit 12 and one at bit 16 (the activation of the lower one scaled by 16 to match): half the
  shifts, at ~2**-13 relative rounding, far below the output's bf16 / fp16 rounding. 8-bit
  weights with 16-bit activations (``BYTES``) place each value, a whole byte, at bits 8-15 of
  1.0f with one byte permute (PRMT, inline PTX; the interpreter runs the shift-and-mask
  equivalent), at the same order of rounding. Float32 activations keep every value at the top
  of the mantissa (one shift each).
- The activations of a step are one contiguous [P, PACK] tile (vector loads), split into its
  PACK columns in registers.
- Scales and zeros applied per group, not per value: inside one group
  ``sum_k x[k] (q[k,n] - z[n]) s[n] = s[n] (sum_k x[k] q[k,n] - z[n] sum_k x[k])``; the FMAs
  accumulate a whole group before the scale is applied.
- Warps lie along N only, so each thread holds every packed row of a step for its columns:
  the activations of a step are loaded once per thread for 4 * BLOCK_N / (128 * warps)
  columns each, and the sum over rows stays inside the thread.
- The next step's weights are loaded before this step's arithmetic (registers, double-buffered
  by hand: Triton does not pipeline loads that feed no dot), so a program keeps a load in
  flight while it computes.
- Split-K when the output alone has too few tiles to fill the GPU; the last program of each
  tile adds the float32 partial sums (``octavo.kernels.split_k``: no second launch).
"""

from __future__ import annotations

import torch

from octavo import envs
from octavo.kernels.pdl import begin as pdl_begin
from octavo.kernels.pdl import launch_args as pdl_args
from octavo.kernels.split_k import buffers as split_k_buffers
from octavo.kernels.split_k import counters as split_k_counters
from octavo.kernels.split_k import plan as split_k_plan
from octavo.kernels.split_k import store_or_reduce
from octavo.kernels.triton_utils import interpreting, num_compute_units, require_triton, tl, triton

MAX_M = 4  # larger batches go to the tensor-core kernel
WAVES = 4  # programs per SM the split-K choice aims for at M = 1
# Steps ahead the weights are loaded, by bits. H200, Llama-3.1-8B shapes at one row
# (benchmarks/gemv_scaling.py, docs/benchmarks.md session 22): two steps ahead moved the
# 8-bit GEMV from 69% to 73% of HBM (W8A16 batch 1 3.554 -> 3.225 ms per token) and the
# 4-bit one nowhere (2.797 -> 2.816).
PREFETCH = {4: 1, 8: 2}


@triton.jit
def _ref(BITS: tl.constexpr, PAIRED: tl.constexpr, BYTES: tl.constexpr):
    """The mantissa bit every value's lowest bit counts at (x is scaled to match): bit 16 for
    pairs of 4-bit values, bit 8 for whole bytes (8-bit values: one byte permute places a
    value), else the top of the mantissa."""
    if PAIRED:
        return 16
    elif BYTES:
        return 8
    else:
        return 23 - BITS


@triton.jit
def _byte_value(packed, ONE_BITS, j: tl.constexpr):
    """Byte ``j`` of each int32 at bits 8-15 of the float 1.0: one PRMT (bytes 0, 2, 3 from
    1.0f's bits, byte 1 from ``packed``)."""
    if j == 0:
        code: tl.constexpr = "prmt.b32 $0, $1, $2, 0x7604;"
    elif j == 1:
        code: tl.constexpr = "prmt.b32 $0, $1, $2, 0x7614;"
    elif j == 2:
        code: tl.constexpr = "prmt.b32 $0, $1, $2, 0x7624;"
    else:
        code: tl.constexpr = "prmt.b32 $0, $1, $2, 0x7634;"
    return tl.inline_asm_elementwise(code, "=r,r,r", [packed, ONE_BITS], dtype=tl.int32,
                                     is_pure=True, pack=1)


@triton.jit
def _pick4(a, b, c, d, j: tl.constexpr):
    """The j-th of four tensors (j a compile-time constant)."""
    if j == 0:
        r = a
    elif j == 1:
        r = b
    elif j == 2:
        r = c
    else:
        r = d
    return r


@triton.jit
def _row_step(packed, x_row, acc, xs, xs_scaled, ONE_BITS, BLOCK_P: tl.constexpr,
              PACK: tl.constexpr, BITS: tl.constexpr, PAIRED: tl.constexpr,
              BYTES: tl.constexpr, ASM: tl.constexpr):
    """Add one step of one row of x (``x_row``: its first value of the step, stride 1):
    acc [P, N] += x'[k] * v[k, n] over the step's rows k, xs [P, 1] += x, xs_scaled [P, 1] += x'
    (x' = x * 2**(REF - p): every value then counts q * 2**(REF - 23) above x')."""
    REF: tl.constexpr = _ref(BITS, PAIRED, BYTES)
    rows = tl.arange(0, BLOCK_P) * PACK
    # The step's activations as one [P, PACK] tile (contiguous: vector loads), split into
    # its PACK columns.
    xt = tl.load(x_row + rows[:, None] + tl.arange(0, PACK)[None, :])
    if PACK == 8:
        a0, a1 = tl.split(xt.reshape(BLOCK_P, 2, 2, 2))
        a00, a01 = tl.split(a0)
        a10, a11 = tl.split(a1)
        c0, c4 = tl.split(a00)
        c2, c6 = tl.split(a01)
        c1, c5 = tl.split(a10)
        c3, c7 = tl.split(a11)
    else:
        a0, a1 = tl.split(xt.reshape(BLOCK_P, 2, 2))
        c0, c2 = tl.split(a0)
        c1, c3 = tl.split(a1)
        c4, c5, c6, c7 = c0, c1, c2, c3
    for j in tl.static_range(PACK):
        # The lowest mantissa bit value j is moved to, and the shift that moves it there:
        # compile-time constants (j is one).
        p = (12 + 4 * (j % 2)) if PAIRED else REF
        if ASM and BYTES:
            v = _byte_value(packed, ONE_BITS, j).to(tl.float32, bitcast=True)
        else:
            shift = p - j * BITS
            if shift > 0:
                t = packed << shift
            elif shift < 0:
                t = packed >> (-shift)  # arithmetic: the mask drops the sign bits
            else:
                t = packed
            v = ((t & (((1 << BITS) - 1) << p)) | ONE_BITS).to(tl.float32, bitcast=True)
        if j < 4:
            xj = _pick4(c0, c1, c2, c3, j)
        else:
            xj = _pick4(c4, c5, c6, c7, j - 4)
        xj = xj.to(tl.float32)[:, None]
        xs += xj
        if REF > p:
            xj = xj * (1 << (REF - p))
        xs_scaled += xj
        acc += xj * v
    return acc, xs, xs_scaled


@triton.jit
def _flush(acc, xs, xs_scaled, s, z, BITS: tl.constexpr, PAIRED: tl.constexpr,
           BYTES: tl.constexpr):
    """One group's share of the output [1, N]: s (sum x q - z sum x), with
    sum x q = 2**(23 - REF) (sum x' v - sum x')."""
    SCALE: tl.constexpr = 1 << (23 - _ref(BITS, PAIRED, BYTES))
    d = tl.sum(acc, axis=0, keep_dims=True)
    c = tl.sum(xs_scaled, axis=0, keep_dims=True) * SCALE
    return s * (d * SCALE - c - z * tl.sum(xs, axis=0, keep_dims=True))


@triton.jit
def _int_weight_gemv_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, out_ptr, part_ptr, cnt_ptr,
    M, N, K, K_PER_SPLIT, NUM_SPLITS, ONE_BITS,
    stride_xm, stride_qk, stride_qn, stride_sg, stride_sn,
    stride_zg, stride_zn, stride_om, stride_on, stride_ps, stride_pm, stride_pn,
    rows_ptr, experts_ptr, stride_qe, stride_se, stride_ze,
    GROUP: tl.constexpr, FLUSH: tl.constexpr, BITS: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_P: tl.constexpr, PAIRED: tl.constexpr, BYTES: tl.constexpr,
    ASM: tl.constexpr, PREFETCH: tl.constexpr, PDL: tl.constexpr, GROUPED: tl.constexpr,
):  # fmt: skip
    # ONE_BITS: 0x3F800000, the bits of 1.0f, passed at run time: as a constant, ptxas
    # re-materializes a mask into a register before every mask-or (one move per weight).
    # Grid (N tiles, K splits). A step covers BLOCK_P packed rows (BLOCK_P * PACK input rows);
    # FLUSH input rows (a multiple of the step dividing GROUP) are summed before the scales
    # are applied; K_PER_SPLIT is a multiple of FLUSH. BLOCK_M is 1, 2 or 4, one accumulator
    # per row of x (rows past M read row 0 and are not stored).
    # GROUPED (mixture-of-experts decode): grid (N tiles, K splits, M); output row m is x row
    # rows[m] times expert experts[m]'s weight ([E, K / pack, N] and [E, groups, N] through
    # the stride_*e strides); BLOCK_M is 1.
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    tile = pid_n
    if GROUPED:
        pid_m = tl.program_id(2)
        x_ptr += tl.load(rows_ptr + pid_m).to(tl.int64) * stride_xm
        expert = tl.load(experts_ptr + pid_m).to(tl.int64)
        qw_ptr += expert * stride_qe
        s_ptr += expert * stride_se
        z_ptr += expert * stride_ze
        tile = pid_m * tl.num_programs(0) + pid_n
    PACK: tl.constexpr = 32 // BITS
    STEP: tl.constexpr = BLOCK_P * PACK
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N))[None, :]  # [1, N]: the tile's layout
    n_mask = offs_n < N
    x1 = x_ptr + tl.minimum(1, M - 1) * stride_xm
    x2 = x_ptr + tl.minimum(2, M - 1) * stride_xm
    x3 = x_ptr + tl.minimum(3, M - 1) * stride_xm
    out0 = tl.zeros((1, BLOCK_N), dtype=tl.float32)
    out1 = tl.zeros((1, BLOCK_N), dtype=tl.float32)
    out2 = tl.zeros((1, BLOCK_N), dtype=tl.float32)
    out3 = tl.zeros((1, BLOCK_N), dtype=tl.float32)
    k_start = pid_k * K_PER_SPLIT
    k_end = tl.minimum(k_start + K_PER_SPLIT, K)
    q_offs = tl.arange(0, BLOCK_P)[:, None] * stride_qk + offs_n * stride_qn
    packed = tl.load(qw_ptr + (k_start // PACK) * stride_qk + q_offs, mask=n_mask, other=0)
    # The steps after (PREFETCH - 1 of them) loaded here too: packed1 and packed2 unused
    # where PREFETCH is smaller.
    packed1 = packed
    packed2 = packed
    if PREFETCH > 1:
        packed1 = tl.load(qw_ptr + (k_start // PACK + BLOCK_P) * stride_qk + q_offs,
                          mask=n_mask & ((offs_n * 0 + k_start + STEP) < k_end), other=0)
    if PREFETCH > 2:
        packed2 = tl.load(qw_ptr + (k_start // PACK + 2 * BLOCK_P) * stride_qk + q_offs,
                          mask=n_mask & ((offs_n * 0 + k_start + 2 * STEP) < k_end), other=0)
    pdl_begin(PDL)  # the first weights are on their way while the previous kernel ends
    for g0 in range(k_start, k_end, FLUSH):
        g = g0 // GROUP
        s = tl.load(s_ptr + g * stride_sg + offs_n * stride_sn, mask=n_mask,
                    other=0.0).to(tl.float32)
        z = tl.load(z_ptr + g * stride_zg + offs_n * stride_zn, mask=n_mask,
                    other=0.0).to(tl.float32)
        acc0 = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
        acc1 = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
        acc2 = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
        acc3 = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
        xs0 = tl.zeros((BLOCK_P, 1), dtype=tl.float32)
        xt0 = tl.zeros((BLOCK_P, 1), dtype=tl.float32)
        xs1 = tl.zeros((BLOCK_P, 1), dtype=tl.float32)
        xt1 = tl.zeros((BLOCK_P, 1), dtype=tl.float32)
        xs2 = tl.zeros((BLOCK_P, 1), dtype=tl.float32)
        xt2 = tl.zeros((BLOCK_P, 1), dtype=tl.float32)
        xs3 = tl.zeros((BLOCK_P, 1), dtype=tl.float32)
        xt3 = tl.zeros((BLOCK_P, 1), dtype=tl.float32)
        for k0 in range(g0, g0 + FLUSH, STEP):
            # The weights PREFETCH steps ahead first (none past this split's end).
            more = n_mask & ((offs_n * 0 + k0 + PREFETCH * STEP) < k_end)  # a tensor mask
            packed_next = tl.load(
                qw_ptr + (k0 // PACK + PREFETCH * BLOCK_P) * stride_qk + q_offs,
                mask=more, other=0)
            acc0, xs0, xt0 = _row_step(packed, x_ptr + k0, acc0, xs0, xt0, ONE_BITS, BLOCK_P,
                                       PACK, BITS, PAIRED, BYTES, ASM)
            if BLOCK_M > 1:
                acc1, xs1, xt1 = _row_step(packed, x1 + k0, acc1, xs1, xt1, ONE_BITS, BLOCK_P,
                                           PACK, BITS, PAIRED, BYTES, ASM)
            if BLOCK_M > 2:
                acc2, xs2, xt2 = _row_step(packed, x2 + k0, acc2, xs2, xt2, ONE_BITS, BLOCK_P,
                                           PACK, BITS, PAIRED, BYTES, ASM)
                acc3, xs3, xt3 = _row_step(packed, x3 + k0, acc3, xs3, xt3, ONE_BITS, BLOCK_P,
                                           PACK, BITS, PAIRED, BYTES, ASM)
            if PREFETCH == 3:
                packed = packed1
                packed1 = packed2
                packed2 = packed_next
            elif PREFETCH == 2:
                packed = packed1
                packed1 = packed_next
            else:
                packed = packed_next
        out0 += _flush(acc0, xs0, xt0, s, z, BITS, PAIRED, BYTES)
        if BLOCK_M > 1:
            out1 += _flush(acc1, xs1, xt1, s, z, BITS, PAIRED, BYTES)
        if BLOCK_M > 2:
            out2 += _flush(acc2, xs2, xt2, s, z, BITS, PAIRED, BYTES)
            out3 += _flush(acc3, xs3, xt3, s, z, BITS, PAIRED, BYTES)
    offs_m = tl.arange(0, BLOCK_M)
    res = tl.where(offs_m[:, None] == 0, out0, 0.0)
    if GROUPED:
        offs_m += pid_m
    if BLOCK_M > 1:
        res = tl.where(offs_m[:, None] == 1, out1, res)
    if BLOCK_M > 2:
        res = tl.where(offs_m[:, None] == 2, out2, res)
        res = tl.where(offs_m[:, None] == 3, out3, res)
    offs_n = offs_n.reshape(BLOCK_N)
    store_or_reduce(res, offs_m, offs_n, (offs_m[:, None] < M) & (offs_n < N)[None, :], out_ptr,
                    stride_om, stride_on, part_ptr, stride_ps, stride_pm, stride_pn, cnt_ptr,
                    tile, pid_k, NUM_SPLITS)


def supports(m: int, k: int, group_size: int, bits: int) -> bool:
    pack = 32 // bits
    return 1 <= m <= MAX_M and group_size % pack == 0 and k % group_size == 0


def _block_p(group_size: int, pack: int, want: int) -> int:
    """Packed rows per step: up to ``want``, dividing one group's packed rows."""
    rows_per_group = group_size // pack
    bp = 1
    while bp * 2 <= want and rows_per_group % (bp * 2) == 0:
        bp *= 2
    return bp


def _flush_len(group_size: int, step: int, most: int, k: int, splits: int) -> int:
    """Input rows summed before the scales are applied: a multiple of ``step`` dividing the
    group, at most ``most`` (a group of all of K is flushed in parts), and halved while K
    holds fewer than ``splits`` of them (so K can be split over that many programs)."""
    f = group_size
    while f % 2 == 0 and (f // 2) % step == 0 and (f > most or k // f < splits):
        f //= 2
    return f


def w4a16_gemv(x2: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
               zeros: torch.Tensor, group_size: int, bits: int, split_k: int | None = None,
               block_n: int | None = None, block_p: int | None = None,
               num_warps: int | None = None, flush: int | None = None,
               waves: int | None = None, paired: bool | None = None,
               maxnreg: int | None = None, prefetch: int | None = None,
               rows: torch.Tensor | None = None,
               experts: torch.Tensor | None = None) -> torch.Tensor:
    """``x2 [M, K] @ dequant(W) [K, N]`` for M <= MAX_M, in x2's dtype. The tuning arguments
    (None: chosen here) exist for the benchmark's sweeps and the tests (``maxnreg``: a cap on
    registers per thread, for occupancy; ``prefetch``: how many steps ahead the weights are
    loaded, 1-3).

    Grouped (mixture-of-experts decode): with ``experts`` (int32 [R]) the weight, scales and
    zeros are stacked per expert ([E, K / pack, N], [E, groups, N]) and the result is
    [R, N], row r being ``x2[rows[r]] @ dequant(W[experts[r]])`` (``rows`` int32 [R]; any
    R)."""
    require_triton("w4a16_gemv")
    if x2.stride(1) != 1:  # the kernel reads each row of x with stride 1
        x2 = x2.contiguous()
    grouped = experts is not None
    k = x2.shape[1]
    pack = 32 // bits
    if grouped:
        _check_grouped(x2, qweight, scales, zeros, group_size, bits, rows, experts)
        # Expert 0's [K / pack, N] and [groups, N] views; the kernel steps by these strides.
        expert_strides = (qweight.stride(0), scales.stride(0), zeros.stride(0))
        qweight, scales, zeros = qweight[0], scales[0], zeros[0]
        m = experts.numel()
    else:
        expert_strides = (0, 0, 0)
        m = x2.shape[0]
    n = qweight.shape[1]
    block_m = 1 if m == 1 or grouped else (2 if m == 2 else 4)
    num_warps = num_warps or 4
    # Each thread holds 4 (one 16-byte load) x BLOCK_N / (128 x warps) columns of BLOCK_P rows.
    # Defaults from benchmarks/quantized_gemm.py --sweep on an H200 (Llama-8B projections):
    # at M = 1, 512 columns and 4 programs per SM are the best or within 2% of it on three of
    # the four shapes, 4- and 8-bit (o_proj 11.7 vs 10.3 us); at M = 2, 2 programs per SM and
    # 1024 columns for the wide projections (within 2% of the best on all four, 4-bit).
    # Grouped rows take M = 1's (unmeasured there; sm_90 SASS: 3.7 loop instructions a weight
    # at 512 columns against 4.7 at 128, where each thread holds one column).
    block_n = block_n or (256 if block_m == 4 else
                          (1024 if m > 1 and n >= 16384 and not grouped else 512))
    block_p = _block_p(group_size, pack, block_p or 4)
    step = block_p * pack
    assert group_size % step == 0 and k % group_size == 0, (group_size, step, k)
    # Pairs of 4-bit values only (two 8-bit values do not fit bits 12-22).
    paired = bits == 4 and (x2.dtype != torch.float32 if paired is None else paired)
    n_tiles = triton.cdiv(n, block_n)
    tiles = n_tiles * m if grouped else n_tiles  # output tiles, one split-K counter each
    if split_k is None:  # enough programs to fill the GPU
        waves = waves or (WAVES if block_m == 1 else 2)
        split_k = max(1, triton.cdiv(waves * num_compute_units(x2.device), tiles))
    flush = _flush_len(group_size, step, flush or 512, k, split_k)
    split_k, k_per_split = split_k_plan(k, flush, split_k)
    out, partial = split_k_buffers(m, n, split_k, x2)
    if grouped and m == 0:
        return out
    _int_weight_gemv_kernel[(n_tiles, split_k, m) if grouped else (n_tiles, split_k)](
        x2, qweight, scales, zeros, out, partial, split_k_counters(x2.device, tiles),
        m, n, k, k_per_split, split_k, 0x3F800000,
        x2.stride(0), qweight.stride(0), qweight.stride(1),
        scales.stride(0), scales.stride(1), zeros.stride(0), zeros.stride(1),
        out.stride(0), out.stride(1), partial.stride(0), partial.stride(1), partial.stride(2),
        rows, experts, *expert_strides,
        GROUP=group_size, FLUSH=flush, BITS=bits, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_P=block_p, PAIRED=bool(paired), BYTES=bits == 8 and x2.dtype != torch.float32,
        ASM=not interpreting(), PREFETCH=prefetch or envs.gemv_prefetch(PREFETCH[bits]),
        GROUPED=grouped, num_warps=num_warps, num_stages=1,
        **pdl_args(x2.device), **({"maxnreg": maxnreg} if maxnreg else {}),
    )  # fmt: skip
    return out


def _check_grouped(x2, qweight, scales, zeros, group_size, bits, rows, experts) -> None:
    """A grouped call's shapes: stacked [E, K / pack, N] weights with [E, K / group, N] scales
    and zeros, one x row index per expert index."""
    r = experts.numel()
    e, kp, n = qweight.shape
    k = x2.shape[1]
    if kp * (32 // bits) != k or tuple(scales.shape) != (e, k // group_size, n) or \
            scales.shape != zeros.shape or rows is None or rows.numel() != r:
        raise ValueError(f"w4a16_gemv (grouped): x {tuple(x2.shape)}, qweight "
                         f"{tuple(qweight.shape)}, scales {tuple(scales.shape)}, zeros "
                         f"{tuple(zeros.shape)}, {r} experts, "
                         f"{None if rows is None else rows.numel()} rows do not fit")
