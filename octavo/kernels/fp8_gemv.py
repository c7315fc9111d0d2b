"""FP8 (e4m3) weights times bf16/fp16 activations for decode batches (M = 1..2), on CUDA cores:
``y[m, n] = scale[n] * sum_k x[m, k] * w[n, k]``, the weight in its checkpoint layout
([N, K] row-major, K contiguous) with one float32 scale per output row.

At batch 1 the FP8 tensor-core path (``torch._scaled_mm``) pays for quantizing the activations
(an amax, a divide, a cast: extra launches) and pads M to a tile, so it decodes slower than
bf16 although it reads half the bytes. Here the activations stay in their dtype (one rounding
fewer than W8A8) and each weight byte costs a conversion and an FMA; the reduction over K runs
along each thread's contiguous 16-byte loads, summed once at the end.

The next step's weights are loaded before this step's arithmetic (double-buffered by hand),
and K is split over programs only as far as needed to fill the GPU; the last program of each
tile adds the partial sums (``octavo.kernels.split_k``).
"""

from __future__ import annotations

import torch

from octavo.kernels.split_k import buffers as split_k_buffers
from octavo.kernels.split_k import counters as split_k_counters
from octavo.kernels.split_k import plan as split_k_plan
from octavo.kernels.split_k import store_or_reduce
from octavo.kernels.triton_utils import num_compute_units, require_triton, tl, triton

MAX_M = 2  # at 4 rows _scaled_mm was faster on the wide shapes (gate_up 65 vs 123 us)


@triton.jit
def _row_dot(w, x_ptr, offs_k, k_mask, stride_xk):
    x = tl.load(x_ptr + offs_k * stride_xk, mask=k_mask, other=0.0).to(tl.float32)
    return w * x[None, :]


@triton.jit
def _fp8_gemv_kernel(
    x_ptr, w_ptr, s_ptr, out_ptr, part_ptr, cnt_ptr,
    M, N, K, K_PER_SPLIT, NUM_SPLITS,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_om, stride_on,
    stride_ps, stride_pm, stride_pn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    # Grid (N tiles, K splits); one accumulator [BLOCK_N, BLOCK_K] per row of x (BLOCK_M = M,
    # 1 or 2).
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    x1 = x_ptr + stride_xm
    acc0 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    k_start = pid_k * K_PER_SPLIT
    k_end = tl.minimum(k_start + K_PER_SPLIT, K)
    offs_k = k_start + tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :] * stride_wk
    w = tl.load(w_ptrs, mask=n_mask[:, None] & (offs_k < k_end)[None, :], other=0.0)
    for _ in range(k_start, k_end, BLOCK_K):
        k_mask = offs_k < k_end
        w_ptrs += BLOCK_K * stride_wk
        next_mask = (offs_k + BLOCK_K) < k_end
        w_next = tl.load(w_ptrs, mask=n_mask[:, None] & next_mask[None, :], other=0.0)
        wf = w.to(tl.float32)
        acc0 += _row_dot(wf, x_ptr, offs_k, k_mask, stride_xk)
        if BLOCK_M > 1:
            acc1 += _row_dot(wf, x1, offs_k, k_mask, stride_xk)
        w = w_next
        offs_k += BLOCK_K
    scale = tl.load(s_ptr + offs_n, mask=n_mask, other=0.0)
    offs_m = tl.arange(0, BLOCK_M)
    res = tl.where(offs_m[:, None] == 0, (tl.sum(acc0, axis=1) * scale)[None, :], 0.0)
    if BLOCK_M > 1:
        res = tl.where(offs_m[:, None] == 1, (tl.sum(acc1, axis=1) * scale)[None, :], res)
    store_or_reduce(res, offs_m, offs_n, (offs_m[:, None] < M) & n_mask[None, :], out_ptr,
                    stride_om, stride_on, part_ptr, stride_ps, stride_pm, stride_pn, cnt_ptr,
                    pid_n, pid_k, NUM_SPLITS)


def fp8_gemv_ref(x2: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The reference: float32 ``x2 @ (weight * scale)^T``, rounded once to x2's dtype."""
    w = weight.to(torch.float32) * scale.reshape(-1, 1).to(torch.float32)
    return (x2.to(torch.float32) @ w.t()).to(x2.dtype)


def fp8_gemv(x2: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
             split_k: int | None = None, block_n: int | None = None,
             block_k: int | None = None, num_warps: int | None = None,
             waves: int | None = None) -> torch.Tensor:
    """``x2 [M, K] @ (weight [N, K] * scale [N])^T`` for M <= MAX_M, in x2's dtype. The tuning
    arguments (None: chosen here) exist for the benchmark's sweeps."""
    require_triton("fp8_gemv")
    m, k = x2.shape
    n = weight.shape[0]
    assert 1 <= m <= MAX_M and weight.shape[1] == k, (x2.shape, weight.shape)
    scale = scale.reshape(-1)
    assert scale.numel() == n and scale.dtype == torch.float32, (scale.shape, scale.dtype)
    block_n = block_n or 16  # benchmarks/quantized_gemm.py --fp8 on an H200 (Llama-8B shapes)
    block_k = block_k or 256
    n_tiles = triton.cdiv(n, block_n)
    k_steps = triton.cdiv(k, block_k)
    if split_k is None:
        want = (waves or 2) * num_compute_units(x2.device)
        split_k = max(1, min(triton.cdiv(want, n_tiles), k_steps, 32))
    split_k, k_per_split = split_k_plan(k_steps * block_k, block_k, split_k)
    out, partial = split_k_buffers(m, n, split_k, x2)
    _fp8_gemv_kernel[(n_tiles, split_k)](
        x2, weight, scale, out, partial, split_k_counters(x2.device, n_tiles),
        m, n, k, k_per_split, split_k,
        x2.stride(0), x2.stride(1), weight.stride(0), weight.stride(1),
        out.stride(0), out.stride(1), partial.stride(0), partial.stride(1), partial.stride(2),
        BLOCK_M=m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps or 4,
    )  # fmt: skip
    return out
