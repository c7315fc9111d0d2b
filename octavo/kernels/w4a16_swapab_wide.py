"""Weight-only integer GEMM for large batches (tens to hundreds of rows) on the swap-AB packed
layout (``octavo.kernels.w4a16_swapab.pack_swapab``: int16 [N / per, K], value c of int16 row
``t * 64 + r`` is output column ``t * 64 * per + c * 64 + r``, K contiguous), in the plain
orientation: ``y [M, N] = x [M, K] @ dequant(W) [K, N]`` with the batch as the MMA's M.

Why: the swap-AB GEMM puts the batch on the MMA's N side, which holds 16-64 columns; above its
range the engine dequantized each projection into a bf16 temporary and ran cuBLAS (the
dequantization alone costs about a bf16 GEMM's time: it writes 4x the bytes it reads). Here a
program takes a [BLOCK_M, BLOCK_K] activation tile and one 64-row block of int16 weights
[64, BLOCK_K]; value c of those int16s is the weight tile of output columns ``c * 64 + r``,
got by a shift and a mask, no reshape, so each thread's dequantized values stay contiguous
along K and reach shared memory in 16-byte stores for the dot. ``(q - z) * s`` is computed in
float32 as ``w4a16_gemm.dequantize_ref`` does (exact integer placement through 2**23's
mantissa, one rounding to the activations' dtype). A program owns ``CS`` of the per = 16 //
bits column blocks of its int16 rows (``CS`` accumulators [BLOCK_M, 64]); K is split over
programs where the output tiles alone would not fill the GPU (``octavo.kernels.split_k``).
"""

from __future__ import annotations

import math

import torch

from octavo.kernels import w4a16_swapab as swapab
from octavo.kernels.split_k import buffers as split_k_buffers
from octavo.kernels.split_k import counters as split_k_counters
from octavo.kernels.split_k import plan as split_k_plan
from octavo.kernels.split_k import store_or_reduce
from octavo.kernels.split_k import within as split_k_within
from octavo.kernels.triton_utils import interpreting, require_triton, tl, triton

ROWS = swapab.ROWS


@triton.jit
def _sz(s_ptr, z_ptr, g, offs_n, stride_sg, stride_sn, stride_zg, stride_zn,
        H16: tl.constexpr, dt: tl.constexpr):
    """Group ``g``'s scales and biased zero points for columns ``offs_n``: float32 with 2**23
    added to z (``_weights``' float32 path), or ``dt`` with 128 added (its 16-bit path)."""
    s = tl.load(s_ptr + g * stride_sg + offs_n * stride_sn)
    z = tl.load(z_ptr + g * stride_zg + offs_n * stride_zn).to(tl.float32)
    if H16:
        s = s.to(dt)
        z = (z + 128.0).to(dt)
    else:
        s = s.to(tl.float32)
        z = z + 8388608.0
    return s, z


@triton.jit
def _sz_all(s_ptr, z_ptr, g, offs_n0, stride_sg, stride_sn, stride_zg, stride_zn,
            PER: tl.constexpr, H16: tl.constexpr, dt: tl.constexpr, LAYOUT_ROWS: tl.constexpr):
    """``_sz`` for the tile's PER column blocks (8-bit tiles have two: the last two pairs
    repeat the first)."""
    s0, z0 = _sz(s_ptr, z_ptr, g, offs_n0, stride_sg, stride_sn, stride_zg, stride_zn, H16, dt)
    s1, z1 = _sz(s_ptr, z_ptr, g, offs_n0 + LAYOUT_ROWS, stride_sg, stride_sn, stride_zg,
                 stride_zn, H16, dt)
    if PER == 4:
        s2, z2 = _sz(s_ptr, z_ptr, g, offs_n0 + 2 * LAYOUT_ROWS, stride_sg, stride_sn,
                     stride_zg, stride_zn, H16, dt)
        s3, z3 = _sz(s_ptr, z_ptr, g, offs_n0 + 3 * LAYOUT_ROWS, stride_sg, stride_sn,
                     stride_zg, stride_zn, H16, dt)
    else:
        s2, z2, s3, z3 = s0, z0, s1, z1
    return s0, z0, s1, z1, s2, z2, s3, z3


@triton.jit
def _weights(p, c: tl.constexpr, s, z, BITS: tl.constexpr, H16: tl.constexpr,
             ASM: tl.constexpr, dt: tl.constexpr):
    """Value ``c`` of the int16 tile ``p`` [64, BLOCK_K] (int32-widened on the float32 path)
    dequantized with its columns' scales ``s`` and biased zero points ``z`` (``_sz``).

    float32: ``q`` sits in 2**23's mantissa (``0x4B000000 | q`` is 2**23 + q), so one exact
    subtraction of 2**23 + z leaves q - z; times s, rounded once to ``dt``, as
    ``w4a16_gemm.dequantize_ref``. 16-bit (bf16 4-bit): 128 + q from a register pair's int16s
    by one PTX sequence, then (v - (128 + z)) * s on pairs: q - z exact, the product rounded
    once (exact as the reference when the scales are of ``dt``)."""
    if H16:
        w = (swapab._dequant(p, c, BITS, 1, ASM, dt) - z[:, None]) * s[:, None]
    else:
        v = (((p >> (c * BITS)) & ((1 << BITS) - 1)) | 0x4B000000).to(tl.float32,
                                                                     bitcast=True)
        w = ((v - z[:, None]) * s[:, None]).to(dt)
    return w


@triton.jit
def _dot(a, w, acc, FP32_DOT: tl.constexpr):
    if FP32_DOT:
        acc = tl.dot(a, tl.trans(w), acc, input_precision="ieee")
    else:
        acc = tl.dot(a, tl.trans(w), acc)
    return acc


@triton.jit
def _wide_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, out_ptr, part_ptr, cnt_ptr,
    M, K, K_PER_SPLIT, NUM_SPLITS,
    stride_xm, stride_xk, stride_qr, stride_sg, stride_sn, stride_zg, stride_zn,
    stride_om, stride_on, stride_ps, stride_pm, stride_pn,
    GROUP: tl.constexpr, BITS: tl.constexpr, FP32_DOT: tl.constexpr, H16: tl.constexpr,
    ASM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
    LAYOUT_ROWS: tl.constexpr,
):  # fmt: skip
    # Grid (M tiles, int16 row blocks, K splits): the M tiles that share a weight tile are
    # neighbours in launch order (its second read comes from L2). BLOCK_K divides GROUP.
    pid_m = tl.program_id(0)
    pid_t = tl.program_id(1)
    pid_k = tl.program_id(2)
    PER: tl.constexpr = 16 // BITS
    dt: tl.constexpr = x_ptr.dtype.element_ty
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = offs_m < M
    offs_r = pid_t * LAYOUT_ROWS + tl.arange(0, LAYOUT_ROWS)
    offs_n0 = pid_t * LAYOUT_ROWS * PER + tl.arange(0, LAYOUT_ROWS)
    offs_kk = tl.arange(0, BLOCK_K)
    k_start = pid_k * K_PER_SPLIT
    k_end = tl.minimum(k_start + K_PER_SPLIT, K)
    acc0 = tl.zeros((BLOCK_M, LAYOUT_ROWS), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_M, LAYOUT_ROWS), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, LAYOUT_ROWS), dtype=tl.float32)
    acc3 = tl.zeros((BLOCK_M, LAYOUT_ROWS), dtype=tl.float32)
    # Each step's scales and zero points one step ahead (plain loads the pipeliner would
    # leave on the step's critical path).
    s0, z0, s1, z1, s2, z2, s3, z3 = _sz_all(
        s_ptr, z_ptr, k_start // GROUP, offs_n0, stride_sg, stride_sn, stride_zg, stride_zn,
        PER, H16, dt, LAYOUT_ROWS)
    for k0 in range(k_start, k_end, BLOCK_K):
        offs_k = tl.multiple_of(k0, BLOCK_K) + offs_kk
        a = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk,
                    mask=m_mask[:, None], other=0.0)
        p = tl.load(qw_ptr + offs_r[:, None] * stride_qr + offs_k[None, :])
        if not H16:
            p = p.to(tl.int32)
        # Past the split's end: its last group again, a harmless reload.
        g_next = tl.minimum(k0 + BLOCK_K, k_end - 1) // GROUP
        t0, y0, t1, y1, t2, y2, t3, y3 = _sz_all(
            s_ptr, z_ptr, g_next, offs_n0, stride_sg, stride_sn, stride_zg, stride_zn, PER,
            H16, dt, LAYOUT_ROWS)
        acc0 = _dot(a, _weights(p, 0, s0, z0, BITS, H16, ASM, dt), acc0, FP32_DOT)
        acc1 = _dot(a, _weights(p, 1, s1, z1, BITS, H16, ASM, dt), acc1, FP32_DOT)
        if PER == 4:
            acc2 = _dot(a, _weights(p, 2, s2, z2, BITS, H16, ASM, dt), acc2, FP32_DOT)
            acc3 = _dot(a, _weights(p, 3, s3, z3, BITS, H16, ASM, dt), acc3, FP32_DOT)
        s0, z0, s1, z1, s2, z2, s3, z3 = t0, y0, t1, y1, t2, y2, t3, y3
    tile = (pid_m * tl.num_programs(1) + pid_t) * PER
    mask = m_mask[:, None] & (offs_n0 >= 0)[None, :]
    store_or_reduce(acc0, offs_m, offs_n0, mask, out_ptr, stride_om, stride_on, part_ptr,
                    stride_ps, stride_pm, stride_pn, cnt_ptr, tile, pid_k, NUM_SPLITS)
    store_or_reduce(acc1, offs_m, offs_n0 + LAYOUT_ROWS, mask, out_ptr, stride_om, stride_on,
                    part_ptr, stride_ps, stride_pm, stride_pn, cnt_ptr, tile + 1, pid_k,
                    NUM_SPLITS)
    if PER == 4:
        store_or_reduce(acc2, offs_m, offs_n0 + 2 * LAYOUT_ROWS, mask, out_ptr, stride_om,
                        stride_on, part_ptr, stride_ps, stride_pm, stride_pn, cnt_ptr, tile + 2,
                        pid_k, NUM_SPLITS)
        store_or_reduce(acc3, offs_m, offs_n0 + 3 * LAYOUT_ROWS, mask, out_ptr, stride_om,
                        stride_on, part_ptr, stride_ps, stride_pm, stride_pn, cnt_ptr, tile + 3,
                        pid_k, NUM_SPLITS)


def uses_h16(dtype: torch.dtype, scales: torch.Tensor, bits: int) -> bool:
    """Whether the weights are dequantized in 16-bit pairs: bf16 activations and scales, 4-bit
    (``0x4300 | q`` is bf16 128 + q; q - z is exact and the product rounds once, as the float32
    reference does). Scales of another type would be rounded to bf16 first: float32 there."""
    return dtype == torch.bfloat16 and scales.dtype == torch.bfloat16 and bits == 4


def tiles(m: int) -> tuple[int, int]:
    """(BLOCK_M, warps): 128 rows on two warpgroups above 64 rows, else 64 on one."""
    return (128, 8) if m > 64 else (64, 4)


def w4a16_swapab_wide(x2: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                      zeros: torch.Tensor, group_size: int, bits: int = 4,
                      split_k: int | None = None, block_m: int | None = None,
                      block_k: int | None = None, num_warps: int | None = None,
                      num_stages: int | None = None, waves: int = 1,
                      h16: bool | None = None) -> torch.Tensor:
    """``x2 [M, K] @ dequant(W) [K, N]`` with ``qweight`` in ``pack_swapab``'s layout (int16
    [N / per, K]), in x2's dtype (float32 accumulation). The tuning arguments exist for the
    benchmark's sweeps; ``waves``: programs per SM the K split aims at."""
    require_triton("w4a16_swapab_wide")
    m, k = x2.shape
    per = 16 // bits
    n = qweight.shape[0] * per
    assert qweight.dtype == torch.int16 and qweight.shape[1] == k, (qweight.shape, k)
    assert scales.shape == zeros.shape == (k // group_size, n), (scales.shape, zeros.shape)
    if not swapab.supports(k, n, group_size, bits):
        raise ValueError(f"the swap-AB layout cannot hold K={k}, N={n}, group {group_size}")
    bm, warps = tiles(m)
    block_m = block_m or bm
    num_warps = num_warps or (warps if block_m == bm else max(4, block_m // 16))
    block_k = block_k or math.gcd(group_size, 64)
    assert group_size % block_k == 0 and block_k % 16 == 0, (group_size, block_k)
    h16 = uses_h16(x2.dtype, scales, bits) if h16 is None else h16
    m_tiles, blocks = triton.cdiv(m, block_m), qweight.shape[0] // ROWS
    if split_k is None:
        split_k = split_k_within(m_tiles * blocks, k // block_k, x2.device, waves)
    split_k, k_per_split = split_k_plan(k, block_k, split_k)
    out, partial = split_k_buffers(m, n, split_k, x2)
    _wide_kernel[(m_tiles, blocks, split_k)](
        x2, qweight, scales, zeros, out, partial,
        split_k_counters(x2.device, m_tiles * blocks * per),
        m, k, k_per_split, split_k,
        x2.stride(0), x2.stride(1), qweight.stride(0), scales.stride(0), scales.stride(1),
        zeros.stride(0), zeros.stride(1), out.stride(0), out.stride(1),
        partial.stride(0), partial.stride(1), partial.stride(2),
        GROUP=group_size, BITS=bits, FP32_DOT=x2.dtype == torch.float32, H16=h16,
        ASM=not interpreting(), BLOCK_M=block_m, BLOCK_K=block_k, LAYOUT_ROWS=ROWS,
        num_warps=num_warps, num_stages=num_stages or 3,
    )  # fmt: skip
    return out
