"""bitsandbytes 4-bit weights (NF4 / FP4) at batches past the GEMVs: a tensor-core GEMM that
decodes the packed bytes inside its main loop, instead of dequantizing the whole weight into a
temporary for cuBLAS every call.

The weight is ``bnb4_gemv``'s: ``qweight`` uint8 [N, K / 2] (two codes a byte, the high nibble
first, K contiguous), ``absmax`` float32 [N, K / blocksize], and the 256 code pairs of
``bnb_weight.byte_table`` read as int64 (one gather per byte gives both of its weights). A
program owns a [BLOCK_M, BLOCK_N] output tile; a K step loads BLOCK_N x BLOCK_K / 2 bytes,
gathers their pairs, multiplies them by the step's absmax (BLOCK_K divides the blocksize: one
absmax a row a step), rounds the weight to the activations' dtype (as ``dequantize_4bit``
does, so the two paths differ only in summation order) and adds ``x_tile @ w_tile^T``. K is
split over programs when the output tiles alone would leave the GPU idle
(``octavo.kernels.split_k``: the last program of a tile adds the partials).

Why: dequantize-then-cuBLAS moves about 10 bytes a weight every call (the packed half byte
read, two bytes written, read again by cuBLAS), ~36 GB a Llama-3.1-8B step where the packed
weights are 4 GB; an H100 ran NF4 batch 16 at 19.1 ms per token against bf16's 6.5
(session 46). Off by default until measured on a GPU (``OCTAVO_BNB4_GEMM_MAX_M``).
"""

from __future__ import annotations

import torch

from octavo.kernels.split_k import buffers as split_k_buffers
from octavo.kernels.split_k import counters as split_k_counters
from octavo.kernels.split_k import plan as split_k_plan
from octavo.kernels.split_k import store_or_reduce
from octavo.kernels.split_k import within as split_k_within
from octavo.kernels.triton_utils import require_triton, tl, triton
from octavo.kernels.w4a16_gemm import gemm_tile


@triton.jit
def _bnb4_gemm_kernel(
    x_ptr, q_ptr, a_ptr, t_ptr, out_ptr, part_ptr, cnt_ptr,
    M, N, K, K_PER_SPLIT, NUM_SPLITS,
    stride_xm, stride_xk, stride_qn, stride_an, stride_om, stride_on,
    stride_ps, stride_pm, stride_pn,
    BS: tl.constexpr, FP32_DOT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    # Grid (M tiles, N tiles, K splits); BLOCK_K divides BS and K_PER_SPLIT.
    BLOCK_B: tl.constexpr = BLOCK_K // 2
    pid_m, pid_n, pid_k, offs_m, offs_n, m_mask, n_mask, k_start, k_end = gemm_tile(
        M, N, K, K_PER_SPLIT, BLOCK_M, BLOCK_N)
    offs_b = tl.arange(0, BLOCK_B)
    offs_kk = tl.arange(0, BLOCK_K)
    q_rows = q_ptr + offs_n[:, None].to(tl.int64) * stride_qn
    a_rows = a_ptr + offs_n.to(tl.int64) * stride_an
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + (k0 + offs_kk)[None, :] * stride_xk,
                    mask=m_mask[:, None], other=0.0)
        q = tl.load(q_rows + (k0 // 2 + offs_b)[None, :], mask=n_mask[:, None], other=0)
        a = tl.load(a_rows + k0 // BS, mask=n_mask, other=0.0)
        pair = tl.load(t_ptr + q.to(tl.int32))  # int64: low word = the high nibble's code
        w0 = pair.to(tl.int32).to(tl.float32, bitcast=True) * a[:, None]
        w1 = (pair >> 32).to(tl.int32).to(tl.float32, bitcast=True) * a[:, None]
        w = tl.reshape(tl.join(w0, w1), (BLOCK_N, BLOCK_K))  # weight k0 + 2b + i
        if FP32_DOT:
            acc += tl.dot(x, tl.trans(w), input_precision="ieee")
        else:
            acc += tl.dot(x, tl.trans(w.to(x.dtype)))
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
    """(block_m, block_n, block_k, split_k, k_per_split): the integer GEMM's tiles (16 x 64 up
    to 16 rows, else 64 x 128) and enough K splits to fill the GPU. Not yet tuned on a GPU."""
    bk = block_k(k, blocksize)
    small = m <= 16
    block_m, block_n = (16, 64) if small else (64, 128)
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
    if split_k is None:
        split_k = split_k_within(tiles, k // bk, device, 4 if small else 2)
    split_k, k_per_split = split_k_plan(k, bk, split_k)
    return block_m, block_n, bk, split_k, k_per_split


def bnb4_gemm(x2: torch.Tensor, qweight: torch.Tensor, absmax: torch.Tensor,
              pairs: torch.Tensor, blocksize: int, split_k: int | None = None,
              num_warps: int = 4, num_stages: int = 3) -> torch.Tensor:
    """``x2 [M, K] @ W^T`` in x2's dtype (float32 accumulation), ``W[n, k] = code[nibble] *
    absmax[n, k // blocksize]`` of ``qweight`` uint8 [N, K / 2] and ``absmax`` float32
    [N, K / blocksize]; ``pairs``: ``bnb_weight.byte_table``'s float32 [256, 2]."""
    require_triton("bnb4_gemm")
    m, k = x2.shape
    n = qweight.shape[0]
    assert supported(m, k, blocksize) and qweight.shape[1] * 2 == k, (x2.shape, qweight.shape)
    assert qweight.dtype == torch.uint8 and qweight.stride(1) == 1, qweight.stride()
    assert tuple(absmax.shape) == (n, k // blocksize) and absmax.stride(1) == 1, absmax.shape
    assert tuple(pairs.shape) == (256, 2) and pairs.dtype == torch.float32 \
        and pairs.is_contiguous(), (pairs.shape, pairs.dtype)
    block_m, block_n, bk, splits, k_per_split = plan(m, n, k, blocksize, x2.device, split_k)
    m_tiles, n_tiles = triton.cdiv(m, block_m), triton.cdiv(n, block_n)
    out, partial = split_k_buffers(m, n, splits, x2)
    _bnb4_gemm_kernel[(m_tiles, n_tiles, splits)](
        x2, qweight, absmax, pairs.view(torch.int64).reshape(256), out, partial,
        split_k_counters(x2.device, m_tiles * n_tiles), m, n, k, k_per_split, splits,
        x2.stride(0), x2.stride(1), qweight.stride(0), absmax.stride(0),
        out.stride(0), out.stride(1), partial.stride(0), partial.stride(1), partial.stride(2),
        BS=blocksize, FP32_DOT=x2.dtype == torch.float32,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=bk, num_warps=num_warps,
        num_stages=num_stages,
    )  # fmt: skip
    return out
