"""bitsandbytes 4-bit weights (NF4 / FP4) at batches past the GEMVs: a tensor-core GEMM that
decodes the packed bytes inside its main loop, instead of dequantizing the whole weight into a
temporary for cuBLAS every call.

The weight is ``bnb4_gemv``'s: ``qweight`` uint8 [N, K / 2] (two codes a byte, the high nibble
first, K contiguous) and ``absmax`` float32 [N, K / blocksize]. A program owns a [BLOCK_M,
BLOCK_N] output tile. A K step loads BLOCK_N x BLOCK_K / 2 bytes and decodes each nibble by
``bnb4_gemv._code_of``: the 16 code values are compiled into the kernel and picked by a tree
of selects on the nibble's bits (about 10 instructions a weight on sm_90, no memory access).
It multiplies them by the step's absmax (BLOCK_K divides the blocksize: one absmax a row a
step) and rounds the weight to the activations' dtype, as ``dequantize_4bit`` does, so the
two paths differ only in summation order. The high nibbles (weights k0 + 2b) meet the
activations' even columns and the low nibbles the odd ones: two dots, with no interleaving of
the decoded halves. K is split over programs when the output tiles alone would leave the GPU
idle (``octavo.kernels.split_k``: the last program of a tile adds the partials).

Session 48's version gathered each byte's code pair from a table in global memory. On an H100
it read at 3-4% of HBM and lost to dequantize-then-cuBLAS at every batch (session 49). This
one has no gathers. On an H100 (session 50) it wins at 16 rows and loses at 64: K = N = 4096
32.0 against 45.7 us dequantizing at 16 rows, 118.5 against 44.9 at 64; Llama-3.1-8B NF4
batch 16 13.33 against 18.97 ms per token, batch 64 53.84 against 19.59. Decoding costs about
20 instructions a weight, paid once per M tile, so the kernel is compute-bound and its cost
grows with the M tiles: it takes batches past the GEMVs up to ``OCTAVO_BNB4_GEMM_MAX_M``
(default 16) rows.
"""

from __future__ import annotations

import torch

from octavo.kernels.bnb4_gemv import _code_of
from octavo.kernels.split_k import buffers as split_k_buffers
from octavo.kernels.split_k import counters as split_k_counters
from octavo.kernels.split_k import plan as split_k_plan
from octavo.kernels.split_k import store_or_reduce
from octavo.kernels.split_k import within as split_k_within
from octavo.kernels.triton_utils import require_triton, tl, triton
from octavo.kernels.w4a16_gemm import gemm_tile


@triton.jit
def _bnb4_gemm_kernel(
    x_ptr, q_ptr, a_ptr, out_ptr, part_ptr, cnt_ptr,
    M, N, K, K_PER_SPLIT, NUM_SPLITS,
    stride_xm, stride_xk, stride_qn, stride_an, stride_om, stride_on,
    stride_ps, stride_pm, stride_pn,
    BS: tl.constexpr, FP32_DOT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    C0: tl.constexpr, C1: tl.constexpr, C2: tl.constexpr, C3: tl.constexpr,
    C4: tl.constexpr, C5: tl.constexpr, C6: tl.constexpr, C7: tl.constexpr,
    C8: tl.constexpr, C9: tl.constexpr, C10: tl.constexpr, C11: tl.constexpr,
    C12: tl.constexpr, C13: tl.constexpr, C14: tl.constexpr, C15: tl.constexpr,
):  # fmt: skip
    # Grid (M tiles, N tiles, K splits); BLOCK_K divides BS and K_PER_SPLIT.
    BLOCK_B: tl.constexpr = BLOCK_K // 2
    pid_m, pid_n, pid_k, offs_m, offs_n, m_mask, n_mask, k_start, k_end = gemm_tile(
        M, N, K, K_PER_SPLIT, BLOCK_M, BLOCK_N)
    offs_b = tl.arange(0, BLOCK_B)
    x_rows = x_ptr + offs_m[:, None] * stride_xm
    q_rows = q_ptr + offs_n[:, None].to(tl.int64) * stride_qn
    a_rows = a_ptr + offs_n.to(tl.int64) * stride_an
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        cols = k0 + 2 * offs_b  # the weights of the bytes' high nibbles; +1: the low ones
        x_hi = tl.load(x_rows + cols[None, :] * stride_xk, mask=m_mask[:, None], other=0.0)
        x_lo = tl.load(x_rows + (cols + 1)[None, :] * stride_xk, mask=m_mask[:, None],
                       other=0.0)
        q = tl.load(q_rows + (k0 // 2 + offs_b)[None, :], mask=n_mask[:, None],
                    other=0).to(tl.int32)
        a = tl.load(a_rows + k0 // BS, mask=n_mask, other=0.0)[:, None]
        w_hi = _code_of(q >> 4, C0, C1, C2, C3, C4, C5, C6, C7, C8, C9, C10, C11, C12, C13,
                        C14, C15) * a
        w_lo = _code_of(q & 15, C0, C1, C2, C3, C4, C5, C6, C7, C8, C9, C10, C11, C12, C13,
                        C14, C15) * a
        if FP32_DOT:
            acc += tl.dot(x_hi, tl.trans(w_hi), input_precision="ieee")
            acc += tl.dot(x_lo, tl.trans(w_lo), input_precision="ieee")
        else:
            acc += tl.dot(x_hi, tl.trans(w_hi.to(x_hi.dtype)))
            acc += tl.dot(x_lo, tl.trans(w_lo.to(x_lo.dtype)))
    store_or_reduce(acc, offs_m, offs_n, m_mask[:, None] & n_mask[None, :], out_ptr,
                    stride_om, stride_on, part_ptr, stride_ps, stride_pm, stride_pn, cnt_ptr,
                    pid_m * tl.num_programs(1) + pid_n, pid_k, NUM_SPLITS)


def block_k(k: int, blocksize: int) -> int | None:
    """The K step: the largest of 128 / 64 / 32 dividing both the blocksize and K (one absmax
    a row a step), or None when none does."""
    for bk in (128, 64, 32):
        if blocksize % bk == 0 and k % bk == 0:
            return bk
    return None


def supported(m: int, k: int, blocksize: int) -> bool:
    return m >= 1 and block_k(k, blocksize) is not None


def plan(m: int, n: int, k: int, blocksize: int, device: torch.device,
         split_k: int | None = None) -> tuple[int, int, int, int, int]:
    """(block_m, block_n, block_k, split_k, k_per_split): 16 x 64 tiles up to 16 rows, 64 x 64
    up to 64, 128 x 64 past that (each weight is decoded once per M tile: larger batches take
    taller tiles; 128 columns wide, the split-K epilogue spills on sm_90), and enough K splits
    to fill the GPU. Not yet tuned on a GPU."""
    bk = block_k(k, blocksize)
    block_m, block_n = (16, 64) if m <= 16 else (64, 64) if m <= 64 else (128, 64)
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
    if split_k is None:
        split_k = split_k_within(tiles, k // bk, device, 4 if m <= 16 else 2)
    split_k, k_per_split = split_k_plan(k, bk, split_k)
    return block_m, block_n, bk, split_k, k_per_split


def bnb4_gemm(x2: torch.Tensor, qweight: torch.Tensor, absmax: torch.Tensor,
              codes: tuple[float, ...], blocksize: int, split_k: int | None = None,
              num_warps: int | None = None, num_stages: int = 3) -> torch.Tensor:
    """``x2 [M, K] @ W^T`` in x2's dtype (float32 accumulation), ``W[n, k] = code[nibble] *
    absmax[n, k // blocksize]`` of ``qweight`` uint8 [N, K / 2] and ``absmax`` float32
    [N, K / blocksize]; ``codes``: the 16 code values as numbers (the layer's
    ``code_values``)."""
    require_triton("bnb4_gemm")
    m, k = x2.shape
    n = qweight.shape[0]
    assert supported(m, k, blocksize) and qweight.shape[1] * 2 == k, (x2.shape, qweight.shape)
    assert qweight.dtype == torch.uint8 and qweight.stride(1) == 1, qweight.stride()
    assert tuple(absmax.shape) == (n, k // blocksize) and absmax.stride(1) == 1, absmax.shape
    assert len(codes) == 16, codes
    block_m, block_n, bk, splits, k_per_split = plan(m, n, k, blocksize, x2.device, split_k)
    m_tiles, n_tiles = triton.cdiv(m, block_m), triton.cdiv(n, block_n)
    out, partial = split_k_buffers(m, n, splits, x2)
    consts = {f"C{i}": float(c) for i, c in enumerate(codes)}
    _bnb4_gemm_kernel[(m_tiles, n_tiles, splits)](
        x2, qweight, absmax, out, partial,
        split_k_counters(x2.device, m_tiles * n_tiles), m, n, k, k_per_split, splits,
        x2.stride(0), x2.stride(1), qweight.stride(0), absmax.stride(0),
        out.stride(0), out.stride(1), partial.stride(0), partial.stride(1), partial.stride(2),
        BS=blocksize, FP32_DOT=x2.dtype == torch.float32,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=bk,
        num_warps=num_warps or (4 if block_m <= 16 else 8), num_stages=num_stages, **consts,
    )  # fmt: skip
    return out
