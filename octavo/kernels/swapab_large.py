"""Weight-only integer GEMM for large batches (past ``int_weight_layout.SWAPAB_MAX_M`` rows) on
the swap-AB packed layout, with the dequantization in the main loop: ``out [M, N] = x [M, K] @
dequant(W) [K, N]``, computed as ``out^T = W^T x^T`` so the weight tile is the MMA's A operand.

Why: past 128 rows a swap-AB layer dequantizes its whole weight into a bf16 temporary and
calls cuBLAS. The dequantization writes four times the bytes it reads and cuBLAS reads them
back, so a Llama-8B layer at 256 rows takes about twice a bf16 GEMM (H100: 413 against 204 us),
which holds W4A16 W2 at 0.83x bf16 (issue 12's target 0.9x). Session 35's Triton kernel of
this kind took 128-row batch tiles, so at 256 rows each weight tile was dequantized twice
(gate_up 190 us against 176 for dequantize-then-cuBLAS on an H200). Here one program takes up
to 256 batch rows against ``cols`` 64-column blocks of one 64-row block of the layout:

- program (t, h, m): int16 rows ``t * 64 ..`` of the layout, its values ``h * cols .. h * cols
  + cols - 1`` (output columns ``t * 64 * per + c * 64 + r``, contiguous), batch rows ``m *
  block_m ..``;
- each K step loads the packed rows (once per value; the copies come from L1) and x^T
  [block_k, block_m], dequantizes in the weights' own 16-bit width (the int16 -> float by the
  mantissa, ``(bias + q) - (bias + z)`` exact, times s rounded once: the values
  ``dequantize_swapab`` writes where the scales are in the activations' dtype; fp16 scales
  under bf16 activations are rounded to bf16 first, a second rounding the serial path does
  not make) and multiplies. With only same-width operations between the
  load and the MMA, Triton feeds the tile to wgmma from registers and keeps one MMA in flight
  while the next step dequantizes (sm_90 SASS: HGMMA 64x256x16 with A in registers, wait
  depth 1). The first form of this kernel (x @ W^T, the tile through shared memory) waited for
  every MMA before the next step.
- no K split: a split version gave wrong sums on an H100 at some tiles (session 54: down and
  qkv with 8 warps, K steps of 64, 3 stages; the same splits were right at other tiles and in
  the interpreter; the cause was not found), so only layers whose tiles fill the SMs take this
  path (``fills``; Llama-8B's gate_up).

Measured on an H100 (session 54, ``benchmarks/large_int_gemm.py``, 4-bit g128, us at 256 rows
from HBM): gate_up (K 4,096, N 28,672) 186.9 at the default tile against 212.0 for
dequantize-then-cuBLAS and 109.7 for bf16; 195.6 at 64-wide K steps. The tensor cores run at
about 40% of their rate there: the next lever is the loop itself (the int16 tile still goes
through shared memory once for its operand layout, and 1.7 waves of programs leave SMs idle).
"""

from __future__ import annotations

import torch

from octavo.kernels.triton_utils import num_compute_units, require_triton, tl, triton
from octavo.kernels.w4a16_swapab import ROWS, SUPPORTED_BITS

# The default tile: the best of the session-54 sweep on gate_up at 256 rows (H100).
BLOCK_M = 256
BLOCK_K = 32
COLS = 2
NUM_WARPS = 8
NUM_STAGES = 4


@triton.jit
def _large_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, out_ptr, M, K,
    stride_xm, stride_xk, stride_qr, stride_sg, stride_sn, stride_zg, stride_zn,
    stride_om, stride_on,
    GROUP: tl.constexpr, BITS: tl.constexpr, COLS: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr, LAYOUT_ROWS: tl.constexpr, MAGIC: tl.constexpr,
):  # fmt: skip
    # Grid (layout blocks * PER / COLS, M tiles). Tile row i is value c0 + i // 64 of int16
    # row i % 64: output column n0 + i. BLOCK_K divides GROUP, so a step lies in one group.
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    PER: tl.constexpr = 16 // BITS
    HALVES: tl.constexpr = PER // COLS
    BLOCK_N: tl.constexpr = COLS * LAYOUT_ROWS
    # MAGIC 1 (bf16, 4-bit): 0x4300 | q is the bf16 128 + q; 2 (fp16): 0x6400 | q is 1024 + q;
    # the zero points carry the same bias, so (bias + q) - (bias + z) is q - z exactly.
    BIAS: tl.constexpr = 128.0 if MAGIC == 1 else (1024.0 if MAGIC == 2 else 0.0)
    dt: tl.constexpr = x_ptr.dtype.element_ty
    t = pid_n // HALVES
    c0 = (pid_n % HALVES) * COLS  # the program's first value of each int16
    offs_i = tl.arange(0, BLOCK_N)
    offs_r = t * LAYOUT_ROWS + offs_i % LAYOUT_ROWS
    shift = ((c0 + offs_i // LAYOUT_ROWS) * BITS).to(tl.int16)[:, None]
    offs_n = t * LAYOUT_ROWS * PER + c0 * LAYOUT_ROWS + offs_i
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = offs_m < M
    offs_kk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    # Each step's scales and zero points are loaded a step ahead, into registers: 2-byte
    # loads do not go through the cp.async pipeline, and loaded in their step they held every
    # step for a round trip to L2 (session 54, H100: gate_up at 256 rows 226 us).
    s = tl.load(s_ptr + offs_n * stride_sn).to(dt)
    z = (tl.load(z_ptr + offs_n * stride_zn).to(tl.float32) + BIAS).to(dt)
    for k0 in range(0, K, BLOCK_K):
        offs_k = tl.multiple_of(k0, BLOCK_K) + offs_kk
        p = tl.load(qw_ptr + offs_r[:, None] * stride_qr + offs_k[None, :])
        xt = tl.load(x_ptr + offs_k[:, None] * stride_xk + offs_m[None, :] * stride_xm,
                     mask=m_mask[None, :], other=0.0)
        bits = (p >> shift) & ((1 << BITS) - 1)
        if MAGIC == 1:
            q = (bits | 0x4300).to(tl.bfloat16, bitcast=True)
        elif MAGIC == 2:
            q = (bits | 0x6400).to(tl.float16, bitcast=True)
        else:
            q = bits.to(dt)
        w = (q - z[:, None]) * s[:, None]
        # The next step's group (past the end the last one again, unused).
        g = tl.minimum(k0 + BLOCK_K, K - 1) // GROUP
        s = tl.load(s_ptr + g * stride_sg + offs_n * stride_sn).to(dt)
        z = (tl.load(z_ptr + g * stride_zg + offs_n * stride_zn).to(tl.float32) + BIAS).to(dt)
        if dt == tl.float32:
            acc = tl.dot(w, xt, acc, input_precision="ieee")
        else:
            acc = tl.dot(w, xt, acc)
    out = out_ptr + offs_m[None, :] * stride_om + offs_n[:, None] * stride_on
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_mask[None, :])


def _magic(dtype: torch.dtype, bits: int) -> int:
    if dtype == torch.bfloat16 and bits == 4:
        return 1
    return 2 if dtype == torch.float16 else 0


def supports(k: int, n: int, group_size: int, bits: int) -> bool:
    """Whether ``swapab_large`` can run this shape (as the swap-AB layout: N a multiple of 64
    * per, a group a multiple of 16 dividing K)."""
    return bits in SUPPORTED_BITS and n % (ROWS * (16 // bits)) == 0 \
        and group_size % 16 == 0 and k % group_size == 0


def fills(n: int, device: torch.device, cols: int = COLS) -> bool:
    """Whether a weight of ``n`` output columns makes at least one program per SM at the
    default tile (one batch tile): the kernel does not split K."""
    return n // (ROWS * cols) >= num_compute_units(device)


def swapab_large(x2: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                 zeros: torch.Tensor, group_size: int, bits: int = 4, block_m: int = BLOCK_M,
                 block_k: int = BLOCK_K, cols: int = COLS, num_warps: int = NUM_WARPS,
                 num_stages: int = NUM_STAGES) -> torch.Tensor:
    """``x2 [M, K] @ dequant(W) [K, N]`` for ``qweight`` in ``pack_swapab``'s layout (int16
    [N / per, K]; ``scales`` / ``zeros`` [K / group, N], any float dtype), in x2's dtype.
    ``block_m``: batch rows per program; ``block_k``: K per step (a divisor of the group, at
    least 16); ``cols``: 64-column value blocks per program (dividing per = 16 / bits)."""
    require_triton("swapab_large")
    m, k = x2.shape
    per = 16 // bits
    n = qweight.shape[0] * per
    assert qweight.dtype == torch.int16 and qweight.shape[1] == k, (qweight.shape, k)
    assert scales.shape == zeros.shape == (k // group_size, n), (scales.shape, zeros.shape)
    if not supports(k, n, group_size, bits):
        raise ValueError(f"the large-batch swap-AB GEMM cannot run K={k}, N={n}, "
                         f"group {group_size}, {bits} bits")
    if per % cols or block_k % 16 or group_size % block_k:
        raise ValueError(f"swapab_large: cols={cols} must divide {per}, block_k={block_k} "
                         f"divide the group {group_size} in multiples of 16")
    out = torch.empty(m, n, device=x2.device, dtype=x2.dtype)
    grid = (qweight.shape[0] // ROWS * (per // cols), triton.cdiv(m, block_m))
    _large_kernel[grid](
        x2, qweight, scales, zeros, out, m, k,
        x2.stride(0), x2.stride(1), qweight.stride(0), scales.stride(0), scales.stride(1),
        zeros.stride(0), zeros.stride(1), out.stride(0), out.stride(1),
        GROUP=group_size, BITS=bits, COLS=cols, BLOCK_M=block_m, BLOCK_K=block_k,
        LAYOUT_ROWS=ROWS, MAGIC=_magic(x2.dtype, bits), num_warps=num_warps,
        num_stages=num_stages,
    )  # fmt: skip
    return out
