"""Weight-only integer GEMV for decode batches (M = 1..2) on CUDA cores, reading the swap-AB
packed layout (``octavo.kernels.w4a16_swapab.pack_swapab``: int16 [N / per, K], K contiguous,
``per = 16 // bits`` values per int16 packed along N), plus a dequantize kernel for that layout.

Why: the swap-AB wgmma kernel is the fast path for batches of ~3-32 rows, but at batch 1 it
is slower than the CUDA-core GEMV of ``w4a16_gemv`` (which reads ``pack_along_k``'s layout);
keeping both layouts for one layer would double its weight memory. This kernel serves batch
1-2 from the swap-AB copy, and ``dequantize_swapab`` serves large batches (dequantize, then
cuBLAS), so one copy of the weight serves every batch size.

How (``scripts/triton_sass.py`` counts the instructions; a decode GEMV at memory speed has
~3 per weight to spend):

- A thread reads 16 bytes of one int16 row per step: 8 consecutive k for ``per`` output
  columns, as 4 int32 registers of two int16 each (k even in the low half, k odd in the high
  half). Every value of one int16 multiplies the same ``x[k]``, so the shifts and masks are
  the same for every register.
- No conversion instruction for the weights: a mask-or (one LOP3) places a value ``q`` sitting
  at bits ``p .. p + bits - 1`` under the exponent of a power of two ``B``, giving the float
  ``B (1 + q 2**(p - 23))``, and one FFMA adds ``x * v``. For 4-bit weights and 16-bit
  activations every value is brought to ``p = 12`` (with ``B = 16``) or ``p = 16`` (``B = 1``):
  both then count ``q * 2**-7`` above ``B``, so values at either position share one accumulator
  without scaling ``x``. Of the 8 values of a register, two are already there (the low half's
  value 3 at bit 12, the high half's value 0 at bit 16), ``<< 12`` and ``>> 8`` bring two more
  each, and one byte permute (PRMT) the last two (the low half's value 2 to bit 16, the high
  half's value 3 to bit 12): 3 instructions per 8 weights besides the LOP3 and FFMA of each.
  An 8-bit value is one byte: one PRMT puts it under the bytes of 1.0f (``0x3F80 | q << 8``,
  ``1 + q 2**-15``), no shift and no mask. The rounding of the large ``B`` part leaves ~2**-13
  (4-bit) / ~2**-9 (8-bit) of a quantization step per term: far below bf16 / fp16 output
  rounding. Float32 activations keep each value at the top of the mantissa (one shift each,
  ``PRECISE``).
- ``sum_k x q = 2**(23 - p) (sum_k x v - sum_k x B)``: the second sum depends on the column's
  value position only through the parity of k, so two running sums of x (even and odd k) per
  row of x serve every column. Scales and zeros are applied once per fold of FLUSH k:
  ``sum_k x (q - z) s = s (sum_k x q - z sum_k x)``.
- A thread holds ``rows_per_thread`` int16 rows (4 * rows_per_thread columns per row of x), so
  the activations of a step (one 16-byte load of int32 pairs, converted once) serve 32 weights
  per row. ``threads_k`` threads share a row, each taking whole FLUSH-long chunks of K in turn:
  every thread folds whole chunks (its scales and zeros loaded once per chunk) and the shares
  are added once, at the end, so a program of 4 warps covers 512 4-bit columns, as
  ``w4a16_gemv``'s, and writes no more split-K partials.
- Two steps per loop iteration on two register buffers: one step's weights are in flight while
  the other's are used (Triton does not pipeline loads that feed no dot), with no register
  moves; split-K over programs (``octavo.kernels.split_k``) and programmatic dependent launch
  (``octavo.kernels.pdl``) as in ``w4a16_gemv``.

SASS for sm_90 (Triton 3.9, group 128, bf16, 4 warps, the defaults: 4 rows per thread at M = 1,
2 at M = 2, 4 threads per row; the loop plus its fold, per weight per thread; ``w4a16_gemv``'s
defaults compiled the same way in brackets): 4-bit M = 1 2.8 (3.9), 128 registers; 4-bit M = 2
4.5 (6.1); 8-bit M = 1 2.7 (4.5); 8-bit M = 2 4.9 (6.4); no spills.

Reached through ``w4a16_gemm(..., path="swapab_gemv")`` (and ``path="swapab_dequant"``) with
the ``pack_swapab`` tensor.
"""

from __future__ import annotations

import math
import os

import torch

from octavo.kernels.pdl import begin as pdl_begin
from octavo.kernels.pdl import launch_args as pdl_args
from octavo.kernels.split_k import buffers as split_k_buffers
from octavo.kernels.split_k import counters as split_k_counters
from octavo.kernels.split_k import plan as split_k_plan
from octavo.kernels.split_k import store_or_reduce
from octavo.kernels.triton_utils import num_compute_units, require_triton, tl, triton

MAX_M = 2  # larger batches go to the swap-AB tensor-core kernel
ROWS = 64  # int16 rows per swap-AB tile (pack_swapab): value c of row r is column c * 64 + r
WAVES = 4  # programs per SM the split-K choice aims for
ONE = 0x3F800000  # the bits of 1.0f
SIXTEEN = 0x41800000  # the bits of 16.0f

_constexpr = tl.constexpr if tl is not None else (lambda v: v)
TILE = _constexpr(ROWS)  # ROWS, for the kernels
# Bytes 3 and 1 of a register to bytes 1 and 2: the high half's 4-bit value 3 (bits 28-31) to
# bits 12-15, the low half's value 2 (bits 8-11) to bits 16-19.
PRMT_3120 = _constexpr("prmt.b32 $0, $1, 0, 0x0130;")
# 8-bit: byte c of a register under the bytes of 1.0f (``$2``): 0x3F80 | q << 8, the float
# 1 + q 2**-15 in one instruction (no shift, no mask).
PRMT_BYTE = [_constexpr(f"prmt.b32 $0, $1, $2, {0x7604 | c << 4:#06x};") for c in range(4)]
PRMT_BYTE0, PRMT_BYTE1, PRMT_BYTE2, PRMT_BYTE3 = PRMT_BYTE


@triton.jit
def _prmt(w, ASM: tl.constexpr):
    if ASM:
        t = tl.inline_asm_elementwise(PRMT_3120, "=r,r", [w], dtype=tl.int32, is_pure=True,
                                      pack=1)
    else:  # the interpreter runs no inline asm: the same bytes by shifts
        t = ((w >> 16) & 0xFF00) | ((w << 8) & 0xFF0000)
    return t


@triton.jit
def _byte(w, c: tl.constexpr, one, ASM: tl.constexpr):
    """Byte c of ``w`` at bits 8-15 under the exponent bits ``one``: 1 + q 2**-15."""
    if ASM:
        if c == 0:
            code: tl.constexpr = PRMT_BYTE0
        elif c == 1:
            code: tl.constexpr = PRMT_BYTE1
        elif c == 2:
            code: tl.constexpr = PRMT_BYTE2
        else:
            code: tl.constexpr = PRMT_BYTE3
        t = tl.inline_asm_elementwise(code, "=r,r,r", [w, one], dtype=tl.int32, is_pure=True,
                                      pack=1)
    else:
        t = (((w >> (8 * c)) & 0xFF) << 8) | one
    return t.to(tl.float32, bitcast=True)


@triton.jit
def _val(t, P: tl.constexpr, BITS: tl.constexpr, one):
    """The value at bits P .. P + BITS - 1 of ``t`` under the exponent bits ``one``: the float
    B (1 + q 2**(P - 23))."""
    MASK: tl.constexpr = ((1 << BITS) - 1) << P
    return ((t & MASK) | one).to(tl.float32, bitcast=True)


@triton.jit
def _shift(w, S: tl.constexpr):
    """w << S (S > 0) or w >> -S (arithmetic: the masks drop the sign bits)."""
    if S > 0:
        t = w << S
    elif S < 0:
        t = w >> (-S)
    else:
        t = w
    return t


@triton.jit
def _top(w, c: tl.constexpr, hi: tl.constexpr, BITS: tl.constexpr, one):
    """PRECISE: value c of the low (hi=0) or high (hi=1) int16 at the top of the mantissa."""
    P: tl.constexpr = 23 - BITS
    return _val(_shift(w, P - (hi * 16 + c * BITS)), P, BITS, one)


@triton.jit
def _reg_step(w, xl, xh, a0, a1, a2, a3, one, sixteen, BITS: tl.constexpr,
              PRECISE: tl.constexpr, ASM: tl.constexpr):
    """Add one int32 register of every row (two int16: k even in the low half with x ``xl``,
    k odd in the high half with ``xh``) to the per-value accumulators a0..a3 (value c of an
    int16 is column c * 64 + r)."""
    if PRECISE:
        a0 += xl * _top(w, 0, 0, BITS, one)
        a0 += xh * _top(w, 0, 1, BITS, one)
        a1 += xl * _top(w, 1, 0, BITS, one)
        a1 += xh * _top(w, 1, 1, BITS, one)
        if BITS == 4:
            a2 += xl * _top(w, 2, 0, BITS, one)
            a2 += xh * _top(w, 2, 1, BITS, one)
            a3 += xl * _top(w, 3, 0, BITS, one)
            a3 += xh * _top(w, 3, 1, BITS, one)
    elif BITS == 4:
        # Every value at p = 12 (exponent of 16) or p = 16 (of 1): q * 2**-7 above either.
        s12 = w << 12  # low 0 -> 12, low 1 -> 16
        s8 = w >> 8  # high 1 -> 12, high 2 -> 16
        sp = _prmt(w, ASM)  # high 3 -> 12, low 2 -> 16
        a0 += xl * _val(s12, 12, 4, sixteen)
        a0 += xh * _val(w, 16, 4, one)
        a1 += xl * _val(s12, 16, 4, one)
        a1 += xh * _val(s8, 12, 4, sixteen)
        a2 += xl * _val(sp, 16, 4, one)
        a2 += xh * _val(s8, 16, 4, one)
        a3 += xl * _val(w, 12, 4, sixteen)
        a3 += xh * _val(sp, 12, 4, sixteen)
    else:
        # 8-bit: every value at p = 8 (exponent of 1): q * 2**-15 above 1, one byte permute.
        a0 += xl * _byte(w, 0, one, ASM)
        a0 += xh * _byte(w, 2, one, ASM)
        a1 += xl * _byte(w, 1, one, ASM)
        a1 += xh * _byte(w, 3, one, ASM)
    return a0, a1, a2, a3


@triton.jit
def _split4(p, BLOCK_R: tl.constexpr, TK: tl.constexpr):
    """[BLOCK_R, 4 TK] (4 consecutive int32 per thread: one 16-byte load) -> 4 x [BLOCK_R, TK],
    piece j holding column 4 t + j (register moves only)."""
    a, b = tl.split(tl.reshape(p, (BLOCK_R, TK, 2, 2)))
    w0, w2 = tl.split(a)
    w1, w3 = tl.split(b)
    return w0, w1, w2, w3


@triton.jit
def _x_step(xp, x_offs, x_mask, TK: tl.constexpr, DT: tl.constexpr):
    """A step's activations: for each of the 4 int32 registers j of a thread's weights (k and
    k + 1 at ``x_offs`` [1, 4 TK], in int32 pairs from ``xp``, x's row), x at the low and high
    halves as float32 [1, TK] (zero where ``x_mask`` is false)."""
    if DT == tl.float32:
        lo = tl.load(xp + 2 * x_offs, mask=x_mask, other=0.0)
        hi = tl.load(xp + 2 * x_offs + 1, mask=x_mask, other=0.0)
    else:
        xi = tl.load(xp.to(tl.pointer_type(tl.int32), bitcast=True) + x_offs, mask=x_mask,
                     other=0)
        if DT == tl.bfloat16:  # bf16 -> f32 is a 16-bit shift
            lo = (xi << 16).to(tl.float32, bitcast=True)
            hi = (xi & -65536).to(tl.float32, bitcast=True)
        else:
            lo = xi.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
            hi = (xi >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    l0, l1, l2, l3 = _split4(lo, 1, TK)
    h0, h1, h2, h3 = _split4(hi, 1, TK)
    return l0, l1, l2, l3, h0, h1, h2, h3


@triton.jit
def _row_step(w0, w1, w2, w3, xp, x_offs, x_mask, a0, a1, a2, a3, xe, xo, one, sixteen,
              BITS: tl.constexpr, PRECISE: tl.constexpr, ASM: tl.constexpr, TK: tl.constexpr,
              DT: tl.constexpr):
    """One step (8 k per thread) for one row of x; w0..w3: the weight tile's registers."""
    l0, l1, l2, l3, h0, h1, h2, h3 = _x_step(xp, x_offs, x_mask, TK, DT)
    xe += (l0 + l1) + (l2 + l3)
    xo += (h0 + h1) + (h2 + h3)
    a0, a1, a2, a3 = _reg_step(w0, l0, h0, a0, a1, a2, a3, one, sixteen, BITS, PRECISE, ASM)
    a0, a1, a2, a3 = _reg_step(w1, l1, h1, a0, a1, a2, a3, one, sixteen, BITS, PRECISE, ASM)
    a0, a1, a2, a3 = _reg_step(w2, l2, h2, a0, a1, a2, a3, one, sixteen, BITS, PRECISE, ASM)
    a0, a1, a2, a3 = _reg_step(w3, l3, h3, a0, a1, a2, a3, one, sixteen, BITS, PRECISE, ASM)
    return a0, a1, a2, a3, xe, xo


@triton.jit
def _load_sz(s_ptr, z_ptr, g, offs_n, stride_sg, stride_sn, BITS: tl.constexpr):
    """A chunk's scales and zeros for value c = 0..3 of the thread's rows (``offs_n``
    [BLOCK_R, TK]: each K thread loads its own, in the accumulators' layout, no conversion);
    loaded before the chunk's loop, so that they arrive while it runs."""
    off = g * stride_sg + offs_n * stride_sn  # z has s's strides (one set of offsets)
    s0 = tl.load(s_ptr + off)
    z0 = tl.load(z_ptr + off)
    s1 = tl.load(s_ptr + off + TILE * stride_sn)
    z1 = tl.load(z_ptr + off + TILE * stride_sn)
    if BITS == 4:
        s2 = tl.load(s_ptr + off + 2 * TILE * stride_sn)
        z2 = tl.load(z_ptr + off + 2 * TILE * stride_sn)
        s3 = tl.load(s_ptr + off + 3 * TILE * stride_sn)
        z3 = tl.load(z_ptr + off + 3 * TILE * stride_sn)
    else:
        s2 = s0
        z2 = z0
        s3 = s0
        z3 = z0
    return s0, z0, s1, z1, s2, z2, s3, z3


@triton.jit
def _fold(out, acc, base, xs, s, z, SCALE: tl.constexpr):
    """out += s (sum x q - z sum x), sum x q = SCALE (acc - base)."""
    s = s.to(tl.float32)
    z = z.to(tl.float32)
    return out + s * (acc * SCALE - base * SCALE - z * xs)


@triton.jit
def _fold_row(o0, o1, o2, o3, a0, a1, a2, a3, xe, xo, s0, z0, s1, z1, s2, z2, s3, z3,
              BITS: tl.constexpr, PRECISE: tl.constexpr):
    """Fold one row of x's partial sums (this thread's chunk) into its outputs."""
    xs = xe + xo
    if PRECISE:
        SCALE: tl.constexpr = 1 << BITS  # q * 2**(23 - BITS - 23) above 1
        b0 = xs
        b1 = xs
        b2 = xs
        b3 = xs
    elif BITS == 4:  # q * 2**-7 above 16 (p = 12) or 1 (p = 16), see _reg_step
        SCALE: tl.constexpr = 128
        b0 = 16.0 * xe + xo
        b1 = xe + 16.0 * xo
        b2 = xs
        b3 = 16.0 * xs
    else:  # q * 2**-15 above 1
        SCALE: tl.constexpr = 32768
        b0 = xs
        b1 = xs
        b2 = xs
        b3 = xs
    o0 = _fold(o0, a0, b0, xs, s0, z0, SCALE)
    o1 = _fold(o1, a1, b1, xs, s1, z1, SCALE)
    if BITS == 4:
        o2 = _fold(o2, a2, b2, xs, s2, z2, SCALE)
        o3 = _fold(o3, a3, b3, xs, s3, z3, SCALE)
    return o0, o1, o2, o3


@triton.jit
def _store(o0, o1, offs_n, M, out_ptr, part_ptr, cnt_ptr, stride_om, stride_on, stride_ps,
           stride_pm, stride_pn, tile, pid_k, NUM_SPLITS, BLOCK_M: tl.constexpr):
    """Sum the K threads' shares ([BLOCK_R, TK] -> [BLOCK_R]) and store (or reduce)."""
    offs_n = offs_n.reshape(offs_n.shape[0])
    offs_m = tl.arange(0, BLOCK_M)
    o0 = tl.sum(o0, axis=1)
    if BLOCK_M > 1:
        res = tl.where(offs_m[:, None] == 0, o0[None, :], tl.sum(o1, axis=1)[None, :])
    else:
        res = o0[None, :]
    store_or_reduce(res, offs_m, offs_n, (offs_m[:, None] < M) & (offs_n >= 0)[None, :],
                    out_ptr, stride_om, stride_on, part_ptr, stride_ps, stride_pm, stride_pn,
                    cnt_ptr, tile, pid_k, NUM_SPLITS)


@triton.jit
def _step(packed, x_ptr, x1, x_offs, x_mask, a0, a1, a2, a3, xe0, xo0, c0, c1, c2, c3, xe1,
          xo1, one, sixteen, BITS: tl.constexpr, PRECISE: tl.constexpr, ASM: tl.constexpr,
          TK: tl.constexpr, DT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_M: tl.constexpr):
    """One step (8 k per thread) of the weight registers ``packed`` for both rows of x."""
    w0, w1, w2, w3 = _split4(packed, BLOCK_R, TK)
    a0, a1, a2, a3, xe0, xo0 = _row_step(w0, w1, w2, w3, x_ptr, x_offs, x_mask, a0, a1, a2,
                                         a3, xe0, xo0, one, sixteen, BITS, PRECISE, ASM, TK,
                                         DT)
    if BLOCK_M > 1:
        c0, c1, c2, c3, xe1, xo1 = _row_step(w0, w1, w2, w3, x1, x_offs, x_mask, c0, c1, c2,
                                             c3, xe1, xo1, one, sixteen, BITS, PRECISE, ASM, TK,
                                             DT)
    return a0, a1, a2, a3, xe0, xo0, c0, c1, c2, c3, xe1, xo1


# The scale and zero strides along N are not specialized: a known stride of 1 makes Triton load
# s and z in a layout of its own and convert the accumulators through shared memory at every
# fold (the loads are a thread's own columns, a few per group, either way).
@triton.jit(do_not_specialize=["stride_sn"])
def _swapab_gemv_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, out_ptr, part_ptr, cnt_ptr,
    M, K, K_PER_SPLIT, NUM_SPLITS, ONE_BITS, SIXTEEN_BITS,
    stride_xm, stride_q32, stride_sg, stride_sn,
    stride_om, stride_on, stride_ps, stride_pm, stride_pn,
    GROUP: tl.constexpr, FLUSH: tl.constexpr, BITS: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_R: tl.constexpr, TK: tl.constexpr, PRECISE: tl.constexpr, ASM: tl.constexpr,
    EARLY_SZ: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    # Grid (row tiles of BLOCK_R int16 rows, K splits). qw_ptr: int16 [N / PER, K], K
    # contiguous, read as int32 pairs (stride_q32: int32 between rows, x's row stride even);
    # value c of int16 row t * 64 + r is output column t * 64 * PER + c * 64 + r.
    # A thread reads 16 bytes (8 k) of each of its rows per step. TK threads share a row: in
    # each round of TK * FLUSH k, thread t takes the FLUSH k starting at t * FLUSH (FLUSH: a
    # multiple of 16 dividing GROUP, summed before the scales are applied), so every thread folds
    # whole flushes and the TK shares are added once, at the end (fewer programs write split-K
    # partials for the same number of threads). K_PER_SPLIT is a multiple of FLUSH; a thread
    # whose chunk lies past the split's end reads the last chunk with x masked to zero.
    # ONE_BITS / SIXTEEN_BITS: the bits of 1.0f and 16.0f, run-time values (as constants ptxas
    # re-materializes them before every mask-or). BLOCK_M is 1 or 2 (a second row past M
    # reads row 0 and is not stored).
    pid_r = tl.program_id(0)
    pid_k = tl.program_id(1)
    PER: tl.constexpr = 16 // BITS
    ROUND: tl.constexpr = TK * FLUSH
    DT: tl.constexpr = x_ptr.dtype.element_ty
    offs_r = (pid_r * BLOCK_R + tl.arange(0, BLOCK_R))[:, None]
    # Output column of value 0 of each row (value c: + 64 c).
    offs_n = (offs_r // TILE) * (TILE * PER) + offs_r % TILE
    offs_n_tk = offs_n + tl.zeros((1, TK), dtype=tl.int32)  # [BLOCK_R, TK], see _fold
    qw32 = qw_ptr.to(tl.pointer_type(tl.int32), bitcast=True)
    offs_j = tl.arange(0, 4 * TK)[None, :]
    chunk = (offs_j // 4) * FLUSH  # [1, 4 TK]: the thread's chunk in a round (k)
    chunk_tk = tl.arange(0, TK)[None, :] * FLUSH  # the same, [1, TK]
    jj = offs_j % 4
    q_ptrs = qw32 + (offs_r * stride_q32 + jj)
    x1 = x_ptr + tl.minimum(1, M - 1) * stride_xm
    o0 = tl.zeros((BLOCK_R, TK), dtype=tl.float32)
    o1 = tl.zeros((BLOCK_R, TK), dtype=tl.float32)
    o2 = tl.zeros((BLOCK_R, TK), dtype=tl.float32)
    o3 = tl.zeros((BLOCK_R, TK), dtype=tl.float32)
    p0 = tl.zeros((BLOCK_R, TK), dtype=tl.float32)
    p1 = tl.zeros((BLOCK_R, TK), dtype=tl.float32)
    p2 = tl.zeros((BLOCK_R, TK), dtype=tl.float32)
    p3 = tl.zeros((BLOCK_R, TK), dtype=tl.float32)
    k_start = pid_k * K_PER_SPLIT
    k_end = tl.minimum(k_start + K_PER_SPLIT, K)
    last = k_end - FLUSH  # the last chunk of the split
    start = tl.minimum(k_start + chunk, last)  # this thread's chunk (k), [1, 4 TK]
    packed = tl.load(q_ptrs + (start >> 1))
    pdl_begin(PDL)  # the first weights are on their way while the previous kernel ends
    for r0 in range(k_start, k_end, ROUND):
        x_mask = (r0 + chunk) < k_end
        start = tl.minimum(r0 + chunk, last)
        nxt = tl.minimum(r0 + ROUND + chunk, last)  # the next round's chunk
        g = tl.minimum(r0 + chunk_tk, last) // GROUP  # [1, TK]
        if EARLY_SZ:  # the chunk's scales and zeros arrive while it runs (more registers)
            s0, z0, s1, z1, s2, z2, s3, z3 = _load_sz(s_ptr, z_ptr, g, offs_n_tk, stride_sg,
                                                      stride_sn, BITS)
        a0 = tl.zeros((BLOCK_R, TK), dtype=tl.float32)
        a1 = tl.zeros((BLOCK_R, TK), dtype=tl.float32)
        a2 = tl.zeros((BLOCK_R, TK), dtype=tl.float32)
        a3 = tl.zeros((BLOCK_R, TK), dtype=tl.float32)
        c0 = tl.zeros((BLOCK_R, TK), dtype=tl.float32)
        c1 = tl.zeros((BLOCK_R, TK), dtype=tl.float32)
        c2 = tl.zeros((BLOCK_R, TK), dtype=tl.float32)
        c3 = tl.zeros((BLOCK_R, TK), dtype=tl.float32)
        xe0 = tl.zeros((1, TK), dtype=tl.float32)
        xo0 = tl.zeros((1, TK), dtype=tl.float32)
        xe1 = tl.zeros((1, TK), dtype=tl.float32)
        xo1 = tl.zeros((1, TK), dtype=tl.float32)
        # Two steps per iteration on two register buffers (one step's weights in flight while
        # the other's are used; a single buffer costs a move per register and step).
        kw = start >> 1  # in int32 words
        for kk in range(0, FLUSH // 2, 8):
            later = tl.load(q_ptrs + kw + (kk + 4))
            a0, a1, a2, a3, xe0, xo0, c0, c1, c2, c3, xe1, xo1 = _step(
                packed, x_ptr, x1, kw + (kk + jj), x_mask, a0, a1, a2, a3, xe0, xo0, c0, c1,
                c2, c3, xe1, xo1, ONE_BITS, SIXTEEN_BITS, BITS, PRECISE, ASM, TK, DT, BLOCK_R,
                BLOCK_M)
            # This chunk's next 8 k, or the next round's first.
            if kk + 8 < FLUSH // 2:
                packed = tl.load(q_ptrs + kw + (kk + 8))
            else:
                packed = tl.load(q_ptrs + (nxt >> 1))
            a0, a1, a2, a3, xe0, xo0, c0, c1, c2, c3, xe1, xo1 = _step(
                later, x_ptr, x1, kw + (kk + 4 + jj), x_mask, a0, a1, a2, a3, xe0, xo0, c0, c1,
                c2, c3, xe1, xo1, ONE_BITS, SIXTEEN_BITS, BITS, PRECISE, ASM, TK, DT, BLOCK_R,
                BLOCK_M)
        if not EARLY_SZ:  # loaded now: 128 registers at M = 1 instead of 168 (4-bit)
            s0, z0, s1, z1, s2, z2, s3, z3 = _load_sz(s_ptr, z_ptr, g, offs_n_tk, stride_sg,
                                                      stride_sn, BITS)
        o0, o1, o2, o3 = _fold_row(o0, o1, o2, o3, a0, a1, a2, a3, xe0, xo0, s0, z0, s1, z1,
                                   s2, z2, s3, z3, BITS, PRECISE)
        if BLOCK_M > 1:
            p0, p1, p2, p3 = _fold_row(p0, p1, p2, p3, c0, c1, c2, c3, xe1, xo1, s0, z0, s1,
                                       z1, s2, z2, s3, z3, BITS, PRECISE)
    tile = pid_r * PER
    _store(o0, p0, offs_n, M, out_ptr, part_ptr, cnt_ptr, stride_om, stride_on, stride_ps,
           stride_pm, stride_pn, tile, pid_k, NUM_SPLITS, BLOCK_M)
    _store(o1, p1, offs_n + TILE, M, out_ptr, part_ptr, cnt_ptr, stride_om, stride_on,
           stride_ps, stride_pm, stride_pn, tile + 1, pid_k, NUM_SPLITS, BLOCK_M)
    if BITS == 4:
        _store(o2, p2, offs_n + 2 * TILE, M, out_ptr, part_ptr, cnt_ptr, stride_om, stride_on,
               stride_ps, stride_pm, stride_pn, tile + 2, pid_k, NUM_SPLITS, BLOCK_M)
        _store(o3, p3, offs_n + 3 * TILE, M, out_ptr, part_ptr, cnt_ptr, stride_om, stride_on,
               stride_ps, stride_pm, stride_pn, tile + 3, pid_k, NUM_SPLITS, BLOCK_M)


def _per(bits: int) -> int:
    if bits not in (4, 8):
        raise ValueError(f"the swap-AB GEMV holds 4- or 8-bit weights, not {bits}")
    return 16 // bits


def supports(m: int, k: int, n: int, group_size: int, bits: int) -> bool:
    """Whether ``w4a16_swapab_gemv`` can run this shape."""
    return 1 <= m <= MAX_M and bits in (4, 8) and n % (ROWS * (16 // bits)) == 0 \
        and group_size % 16 == 0 and k % group_size == 0


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")  # no inline asm there


def _flush_len(group_size: int, most: int, least: int, k: int, chunks: int) -> int:
    """K summed before the scales are applied (a thread's chunk): a multiple of 16 dividing
    the group, at most ``most`` (a group of all of K is folded in parts), halved while K holds
    fewer than ``chunks`` of them (so that K can be spread over that many programs and
    threads) down to ``least``."""
    f = group_size
    while f % 32 == 0 and (f > most or (k // f < chunks and f // 2 >= least)):
        f //= 2
    return f


def _block_r(rows: int, threads_k: int, num_warps: int, rows_per_thread: int) -> int:
    """Rows per program: (32 / threads_k) per warp, rows_per_thread each (at least a tile of
    64; fewer than the threads cover are replicated), dividing the matrix's (a multiple of
    64)."""
    block_r = max(ROWS, 32 // threads_k * num_warps * rows_per_thread)
    while rows % block_r:
        block_r //= 2
    return block_r


def _plan(rows: int, k: int, group_size: int, threads_k: int, num_warps: int,
          rows_per_thread: int, split_k: int | None, want: int, most: int, least: int
          ) -> tuple[int, int, int, int]:
    """(rows per program, K splits, K per fold, K per split) for ``want`` programs."""
    block_r = _block_r(rows, threads_k, num_warps, rows_per_thread)
    if split_k is None:  # enough programs to fill the GPU
        split_k = max(1, triton.cdiv(want, rows // block_r))
    flush = _flush_len(group_size, most, least, k, split_k * threads_k)
    # Splits of whole rounds (threads_k chunks) where K allows: no thread idles in a round.
    step = flush * threads_k if k % (flush * threads_k) == 0 else flush
    split_k, k_per_split = split_k_plan(k, step, split_k)
    return block_r, split_k, flush, k_per_split


def w4a16_swapab_gemv(x2: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                      zeros: torch.Tensor, group_size: int, bits: int = 4,
                      split_k: int | None = None, rows_per_thread: int | None = None,
                      threads_k: int | None = None, num_warps: int | None = None,
                      flush: int | None = None, waves: int | None = None,
                      early_scales: bool = False, maxnreg: int | None = None) -> torch.Tensor:
    """``x2 [M, K] @ dequant(W) [K, N]`` for M <= MAX_M with ``qweight`` in ``pack_swapab``'s
    layout (int16 [N / per, K]), in x2's dtype (float32 accumulation). Tuning (None: chosen
    here; for the benchmark's sweeps and the tests): ``rows_per_thread`` int16 rows (per
    columns each) per thread, ``threads_k`` threads sharing a row (each its own chunks of K),
    ``num_warps``, ``flush`` (K per fold), ``waves`` (programs per SM aimed at), ``split_k``,
    ``early_scales`` (load a chunk's scales and zeros before its loop, not after),
    ``maxnreg`` (ptxas's register cap)."""
    require_triton("w4a16_swapab_gemv")
    m, k = x2.shape
    per = _per(bits)
    rows = qweight.shape[0]
    n = rows * per
    assert qweight.dtype == torch.int16 and qweight.shape[1] == k, (qweight.shape, k)
    assert qweight.stride(1) == 1 and qweight.stride(0) % 2 == 0, qweight.stride()
    assert scales.shape == zeros.shape == (k // group_size, n), (scales.shape, zeros.shape)
    if not supports(m, k, n, group_size, bits):
        raise ValueError(f"the swap-AB GEMV cannot run M={m}, K={k}, N={n}, group "
                         f"{group_size}, {bits}-bit")
    if scales.stride() != zeros.stride():  # the kernel reads both with one set of strides
        scales, zeros = scales.contiguous(), zeros.contiguous()
    # x is read in int32 pairs (16-bit activations) from even offsets.
    if x2.stride(1) != 1 or x2.stride(0) % 2 or x2.data_ptr() % 4:
        x2 = x2.contiguous() if x2.stride(1) != 1 else x2.clone()
    block_m = 1 if m == 1 else 2
    threads_k = threads_k or 4
    num_warps = num_warps or 4
    most = flush or 256
    least = min(flush or 32, group_size)  # a fold every 2 loop iterations at most, by default
    want = (waves or WAVES) * num_compute_units(x2.device)  # programs that fill the GPU
    # 4 rows per thread at M = 1 (128 registers, 2.8 instructions per 4-bit weight in SASS), 2
    # at M = 2 (4 rows: 168 registers for 4.1 instructions per weight against 4.4); 2 at M = 1
    # too where that gives 1.25x the programs (small matrices: 4 would need chunks of K shorter
    # than ``least``, folding more often than the 2 rows cost in activations).
    plans = [_plan(rows, k, group_size, threads_k, num_warps, rt, split_k, want, most, least)
             for rt in ((rows_per_thread,) if rows_per_thread else (4, 2) if m == 1 else (2,))]
    block_r, split_k, flush, k_per_split = plans[0]
    if len(plans) > 1 and plans[1][0] and (rows // plans[1][0]) * plans[1][1] >= \
            1.25 * (rows // block_r) * split_k:
        block_r, split_k, flush, k_per_split = plans[1]
    r_tiles = rows // block_r
    out, partial = split_k_buffers(m, n, split_k, x2)
    _swapab_gemv_kernel[(r_tiles, split_k)](
        x2, qweight, scales, zeros, out, partial, split_k_counters(x2.device, r_tiles * per),
        m, k, k_per_split, split_k, ONE, SIXTEEN,
        x2.stride(0), qweight.stride(0) // 2, scales.stride(0), scales.stride(1),
        out.stride(0), out.stride(1),
        partial.stride(0), partial.stride(1), partial.stride(2),
        GROUP=group_size, FLUSH=flush, BITS=bits, BLOCK_M=block_m, BLOCK_R=block_r,
        TK=threads_k, PRECISE=x2.dtype == torch.float32, ASM=not _interpreting(),
        EARLY_SZ=bool(early_scales), num_warps=num_warps, num_stages=1,
        **({"maxnreg": maxnreg} if maxnreg else {}), **pdl_args(x2.device),
    )  # fmt: skip
    return out


@triton.jit
def _dequantize_swapab_kernel(qw_ptr, s_ptr, z_ptr, w_ptr, stride_qr, stride_sg, stride_sn,
                              stride_zg, stride_zn, stride_wk, stride_wn,
                              GROUP: tl.constexpr, BITS: tl.constexpr, BLOCK_R: tl.constexpr,
                              BLOCK_K: tl.constexpr):
    # Grid (N / (BLOCK_R * PER) row tiles, K / BLOCK_K); BLOCK_K divides GROUP (one group per
    # tile) and BLOCK_R is a multiple of 64. The [BLOCK_K, BLOCK_R] tile is read along K and
    # written along N (Triton transposes it through shared memory).
    PER: tl.constexpr = 16 // BITS
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    p = tl.load(qw_ptr + offs_r[None, :] * stride_qr + offs_k[:, None]).to(tl.int32)
    offs_n = (offs_r // TILE) * (TILE * PER) + offs_r % TILE
    g = tl.program_id(1) * BLOCK_K // GROUP
    for c in tl.static_range(PER):
        q = ((p >> (c * BITS)) & ((1 << BITS) - 1)).to(tl.float32)
        s = tl.load(s_ptr + g * stride_sg + (offs_n + c * TILE) * stride_sn).to(tl.float32)
        z = tl.load(z_ptr + g * stride_zg + (offs_n + c * TILE) * stride_zn).to(tl.float32)
        w = (q - z[None, :]) * s[None, :]
        tl.store(w_ptr + offs_k[:, None] * stride_wk + (offs_n + c * TILE)[None, :] * stride_wn,
                 w.to(w_ptr.dtype.element_ty))


def dequantize_swapab(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                      group_size: int, bits: int, dtype: torch.dtype) -> torch.Tensor:
    """The float weight [K, N] in ``dtype`` from ``pack_swapab``'s layout (the same values as
    ``w4a16_gemm.dequantize_ref`` on the unpacked integers): for large batches, dequantize
    then cuBLAS from the one swap-AB copy of the weight."""
    require_triton("dequantize_swapab")
    per = _per(bits)
    rows, k = qweight.shape
    n = rows * per
    assert scales.shape == zeros.shape == (k // group_size, n), (scales.shape, zeros.shape)
    assert rows % ROWS == 0 and group_size % 8 == 0 and k % group_size == 0, (rows, group_size)
    w = torch.empty(k, n, device=qweight.device, dtype=dtype)
    block_r = ROWS
    block_k = math.gcd(group_size, 64)
    _dequantize_swapab_kernel[(rows // block_r, k // block_k)](
        qweight, scales, zeros, w, qweight.stride(0), scales.stride(0), scales.stride(1),
        zeros.stride(0), zeros.stride(1), w.stride(0), w.stride(1),
        GROUP=group_size, BITS=bits, BLOCK_R=block_r, BLOCK_K=block_k, num_warps=4)
    return w
