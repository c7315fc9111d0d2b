"""Weight-only 8-bit GEMM on the rows layout (``octavo.kernels.int8_gemv``: uint8 [N, K], float
scales [K / group, N], zeros a tensor of that shape or one number) for batches past the GEMV's
two rows, on the tensor cores: ``y = x @ dequant(W)^T``.

The along-K tensor-core GEMM (``octavo.kernels.w4a16_gemm``) can read these bytes as its 8-bit
words through strides, but its tile is [K / 4, N] words spread over K within each column and
reshaped by value: on an H200 (session 33) Llama-3.1-8B W8A16 per channel took 9.016 ms per
token at batch 16 that way against 5.758 on the along-K layout. Here a program's weight tile
is [BLOCK_N, BLOCK_K] bytes read straight along K (each row of the tile contiguous), each byte
widened and placed in 2**23's mantissa (exact), ``(q - z) * s`` in float32 as the reference
dequantizes, rounded to the activations' dtype, and the tile transposed into the dot. A K
tile never crosses a group (BLOCK_K divides the group), so a tile needs one scale per row.
Split-K (``octavo.kernels.split_k``) fills the GPU at small batches.
"""

from __future__ import annotations

import torch

from octavo.kernels import w4a16_gemm as along_k
from octavo.kernels.split_k import buffers as split_k_buffers
from octavo.kernels.split_k import counters as split_k_counters
from octavo.kernels.split_k import store_or_reduce
from octavo.kernels.triton_utils import require_triton, tl, triton


@triton.jit
def _rows_gemm_kernel(
    x_ptr, w_ptr, s_ptr, z_ptr, out_ptr, part_ptr, cnt_ptr, zero,
    M, N, K, K_PER_SPLIT, NUM_SPLITS,
    stride_xm, stride_xk, stride_wn, stride_sg, stride_sn, stride_zg, stride_zn,
    stride_om, stride_on, stride_ps, stride_pm, stride_pn,
    GROUP: tl.constexpr, HAS_Z: tl.constexpr, FP32_DOT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    # Grid (M tiles, N tiles, K splits); BLOCK_K divides GROUP and K_PER_SPLIT.
    pid_m, pid_n, pid_k, offs_m, offs_n, m_mask, n_mask, k_start, k_end = along_k.gemm_tile(
        M, N, K, K_PER_SPLIT, BLOCK_M, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk,
                    mask=m_mask[:, None], other=0.0)
        q = tl.load(w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :],
                    mask=n_mask[:, None], other=0)
        qf = (q.to(tl.int32) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
        g = k0 // GROUP
        s = along_k.group_row(s_ptr, g, stride_sg, offs_n, stride_sn, n_mask)
        if HAS_Z:
            z = along_k.group_row(z_ptr, g, stride_zg, offs_n, stride_zn, n_mask)
            w = (qf - z[:, None]) * s[:, None]
        else:
            w = (qf - zero) * s[:, None]
        if FP32_DOT:
            acc += tl.dot(a, tl.trans(w), input_precision="ieee")
        else:
            acc += tl.dot(a, tl.trans(w.to(a.dtype)))
    store_or_reduce(acc, offs_m, offs_n, m_mask[:, None] & n_mask[None, :], out_ptr,
                    stride_om, stride_on, part_ptr, stride_ps, stride_pm, stride_pn, cnt_ptr,
                    pid_m * tl.num_programs(1) + pid_n, pid_k, NUM_SPLITS)


def supports(k: int, group_size: int) -> bool:
    """The along-K GEMM's shape rule, which this kernel shares (K tiles dividing the group)."""
    return along_k.kernel_supports(k, group_size, 8)


def int8_rows_gemm(x2: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor,
                   zeros: torch.Tensor | float, group_size: int, split_k: int | None = None,
                   block_m: int | None = None, block_n: int | None = None,
                   block_k: int | None = None, num_warps: int | None = None,
                   num_stages: int | None = None) -> torch.Tensor:
    """``x2 [M, K] @ dequant(W)`` -> [M, N] in x2's dtype (float32 accumulation); ``weight``
    uint8 [N, K]. Tiles and K splits as the along-K GEMM's (``w4a16_gemm.gemm_tiles``), the
    tuning arguments (None: chosen there) for the benchmark's sweeps."""
    require_triton("int8_rows_gemm")
    m, k = x2.shape
    n = weight.shape[0]
    assert weight.shape[1] == k and weight.dtype == torch.uint8 and weight.stride(1) == 1, (
        weight.shape, weight.dtype, x2.shape)
    assert scales.shape == (k // group_size, n), (scales.shape, k, group_size, n)
    block_m, block_n, block_k, m_tiles, n_tiles, split_k, k_per_split = along_k.gemm_tiles(
        m, n, k, group_size, x2.device, split_k, block_m, block_n, block_k)
    assert group_size % block_k == 0 and k % block_k == 0, (group_size, block_k, k)
    out, partial = split_k_buffers(m, n, split_k, x2)
    has_z = isinstance(zeros, torch.Tensor)
    z = zeros if has_z else scales
    _rows_gemm_kernel[(m_tiles, n_tiles, split_k)](
        x2, weight, scales, z, out, partial, split_k_counters(x2.device, m_tiles * n_tiles),
        0.0 if has_z else float(zeros),
        m, n, k, k_per_split, split_k,
        x2.stride(0), x2.stride(1), weight.stride(0), scales.stride(0), scales.stride(1),
        z.stride(0), z.stride(1),
        out.stride(0), out.stride(1), partial.stride(0), partial.stride(1), partial.stride(2),
        GROUP=group_size, HAS_Z=has_z, FP32_DOT=x2.dtype == torch.float32,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=num_warps or 4, num_stages=num_stages or 3,
    )  # fmt: skip
    return out
