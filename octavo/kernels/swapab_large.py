"""Weight-only integer GEMM for large batches (past ``int_weight_layout.SWAPAB_MAX_M`` rows) on
the swap-AB packed layout, with the dequantization in the main loop: ``out [M, N] = x [M, K] @
dequant(W) [K, N]``.

Why: past 128 rows a swap-AB layer dequantizes its whole weight into a bf16 temporary and
calls cuBLAS. The dequantization writes four times the bytes it reads and cuBLAS reads them
back, so a Llama-8B layer at 256 rows takes about twice a bf16 GEMM (H100: 415 against 205 us),
which holds W4A16 W2 at 0.84x bf16 (issue 12's target 0.9x). Session 35's Triton kernel of
this kind took 128-row batch tiles, so at 256 rows each weight tile was dequantized twice
(gate_up 190 us against 176 for dequantize-then-cuBLAS on an H200). Here one program takes the
whole batch (``block_m`` 256) against ``cols`` 64-column blocks of one 64-row block of the
layout, so each weight is read and dequantized once per 256 rows:

- program (t, h, m, s): int16 rows ``t * 64 ..`` of the layout, its values ``h * cols ..
  h * cols + cols - 1`` (output columns ``t * 64 * per + c * 64 + r``), batch rows ``m *
  block_m ..``, K split ``s``;
- each K step loads the packed tile [64, block_k] once and the activations [block_m,
  block_k], then per value ``c`` dequantizes ``(q - z) * s`` in float32, rounds once to the
  activations' dtype (the values ``dequantize_swapab`` writes, so the same products as the
  dequantize-then-cuBLAS path) and multiplies on the tensor cores (wgmma on Hopper, the
  dequantized tile through shared memory);
- split-K (``split_k.store_or_reduce``: the last program of a tile adds the partials) where
  the tiles alone leave SMs idle (Llama-8B's down, o and qkv).

``block_m`` 256 keeps 64 float32 accumulators per thread per 64-column block at 8 warps, so
``cols`` 2 (128 registers) is the widest tile; two programs then read the same packed tile
for different values (from L2 for the second). Measured: ``benchmarks/large_int_gemm.py``.
"""

from __future__ import annotations

import torch

from octavo.kernels.split_k import buffers as split_k_buffers
from octavo.kernels.split_k import counters as split_k_counters
from octavo.kernels.split_k import plan as split_k_plan
from octavo.kernels.split_k import store_or_reduce
from octavo.kernels.split_k import within as split_k_within
from octavo.kernels.triton_utils import require_triton, tl, triton
from octavo.kernels.w4a16_swapab import ROWS, SUPPORTED_BITS


@triton.jit
def _large_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, out_ptr, part_ptr, cnt_ptr,
    M, K, K_PER_SPLIT, NUM_SPLITS,
    stride_xm, stride_xk, stride_qr, stride_sg, stride_sn, stride_zg, stride_zn,
    stride_om, stride_on, stride_ps, stride_pm, stride_pn,
    GROUP: tl.constexpr, BITS: tl.constexpr, COLS: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr, LAYOUT_ROWS: tl.constexpr, MAGIC: tl.constexpr,
):  # fmt: skip
    # Grid (layout blocks * PER / COLS, M tiles, K splits); out^T [N, M] = W^T [N, K] @ x^T
    # [K, M], the weight tile the MMA's A operand. The program's COLS value blocks are output
    # columns n0 .. n0 + COLS * 64 - 1 (contiguous): tile row i is value c0 + i // 64 of int16
    # row i % 64 (the packed rows loaded once per value, the copies from L1). BLOCK_K divides
    # GROUP and the split's K, so a step lies in one group.
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
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
    k_start = pid_k * K_PER_SPLIT
    k_end = tl.minimum(k_start + K_PER_SPLIT, K)
    # Each step's scales and zero points are loaded a step ahead, into registers: 2-byte
    # loads do not go through the cp.async pipeline, and loaded in their step they held every
    # step for a round trip to L2.
    g = k_start // GROUP
    s = tl.load(s_ptr + g * stride_sg + offs_n * stride_sn)
    z = (tl.load(z_ptr + g * stride_zg + offs_n * stride_zn).to(tl.float32) + BIAS).to(dt)
    for k0 in range(k_start, k_end, BLOCK_K):
        offs_k = tl.multiple_of(k0, BLOCK_K) + offs_kk
        p = tl.load(qw_ptr + offs_r[:, None] * stride_qr + offs_k[None, :])
        xt = tl.load(x_ptr + offs_k[:, None] * stride_xk + offs_m[None, :] * stride_xm,
                     mask=m_mask[None, :], other=0.0)
        bits = (p >> shift) & ((1 << BITS) - 1)
        # Only same-width operations from the load to the MMA (int16 -> 16-bit float by its
        # mantissa, the bias and scale in the float's own width: the product rounded once, the
        # values dequantize_swapab writes), so Triton feeds the tile to wgmma from registers
        # and keeps one MMA in flight while the next step dequantizes.
        if MAGIC == 1:
            q = (bits | 0x4300).to(tl.bfloat16, bitcast=True)
        elif MAGIC == 2:
            q = (bits | 0x6400).to(tl.float16, bitcast=True)
        else:
            q = bits.to(dt)
        w = (q - z[:, None]) * s[:, None]
        # The next step's group (past the split's end the last one again, unused).
        g = tl.minimum(k0 + BLOCK_K, k_end - 1) // GROUP
        s = tl.load(s_ptr + g * stride_sg + offs_n * stride_sn)
        z = (tl.load(z_ptr + g * stride_zg + offs_n * stride_zn).to(tl.float32) + BIAS).to(dt)
        if dt == tl.float32:
            acc = tl.dot(w, xt, acc, input_precision="ieee")
        else:
            acc = tl.dot(w, xt, acc)
    # acc is out^T: store_or_reduce with the roles of M and N swapped.
    store_or_reduce(acc, offs_n, offs_m, (offs_n >= 0)[:, None] & m_mask[None, :], out_ptr,
                    stride_on, stride_om, part_ptr, stride_ps, stride_pn, stride_pm, cnt_ptr,
                    pid_m * tl.num_programs(0) + pid_n, pid_k, NUM_SPLITS)


def _magic(dtype: torch.dtype, bits: int) -> int:
    if dtype == torch.bfloat16 and bits == 4:
        return 1
    return 2 if dtype == torch.float16 else 0


def supports(k: int, n: int, group_size: int, bits: int) -> bool:
    """Whether ``swapab_large`` can run this shape (as the swap-AB layout: N a multiple of 64
    * per, a group a multiple of 16 dividing K)."""
    return bits in SUPPORTED_BITS and n % (ROWS * (16 // bits)) == 0 \
        and group_size % 16 == 0 and k % group_size == 0


def swapab_large(x2: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                 zeros: torch.Tensor, group_size: int, bits: int = 4, block_m: int = 256,
                 block_k: int = 64, cols: int = 2, num_warps: int = 8, num_stages: int = 3,
                 split_k: int | None = None, waves: int = 1) -> torch.Tensor:
    """``x2 [M, K] @ dequant(W) [K, N]`` for ``qweight`` in ``pack_swapab``'s layout (int16
    [N / per, K]; ``scales`` / ``zeros`` [K / group, N]), in x2's dtype. ``block_m``: batch
    rows per program; ``block_k``: K per step (a divisor of the group, at least 16);
    ``cols``: 64-column value blocks per program (1, 2 or per = 16 / bits); ``split_k``: K
    splits (default: enough for about ``waves`` programs per SM)."""
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
    m_tiles = triton.cdiv(m, block_m)
    n_progs = qweight.shape[0] // ROWS * (per // cols)
    tiles = m_tiles * n_progs
    if split_k is None:
        split_k = split_k_within(tiles, k // block_k, x2.device, waves)
    split_k, k_per_split = split_k_plan(k, block_k, split_k)
    out, partial = split_k_buffers(m, n, split_k, x2)
    _large_kernel[(n_progs, m_tiles, split_k)](
        x2, qweight, scales, zeros, out, partial, split_k_counters(x2.device, tiles),
        m, k, k_per_split, split_k,
        x2.stride(0), x2.stride(1), qweight.stride(0), scales.stride(0), scales.stride(1),
        zeros.stride(0), zeros.stride(1), out.stride(0), out.stride(1),
        partial.stride(0), partial.stride(1), partial.stride(2),
        GROUP=group_size, BITS=bits, COLS=cols, BLOCK_M=block_m, BLOCK_K=block_k,
        LAYOUT_ROWS=ROWS, MAGIC=_magic(x2.dtype, bits), num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return out
