"""``y = x @ W.T (+ b)`` for decode batches (M <= 32) with a float weight [N, K]: one launch,
split-K reduced in place.

At batch 1-16 a decode step's GEMMs read every weight once and do little else, so they should
run at memory speed; for the tall-K projections of a 0.6B-class model (o_proj, down_proj)
cuBLAS picks a split-K with a second reduction launch, 7-13 us for 4-6 MB (7-18% of the HBM
bandwidth); ``octavo.kernels.float_linear`` sends only those shapes here (:func:`preferred`).

Each program streams a [BLOCK_N, BLOCK_K] tile of W per step (K contiguous, so loads
coalesce) through the tensor cores against x padded to 16 rows (the MMA is free in a
memory-bound loop), with enough programs (split K) to keep every SM's loads in flight; the last program of each output tile adds the float32 partial sums in split
order (``octavo.kernels.split_k``: deterministic, no second launch, capturable in graphs).
"""

from __future__ import annotations

import torch

from octavo.kernels.pdl import begin as pdl_begin
from octavo.kernels.pdl import launch_args as pdl_args
from octavo.kernels.split_k import buffers as split_k_buffers
from octavo.kernels.split_k import counters as split_k_counters
from octavo.kernels.split_k import plan as split_k_plan
from octavo.kernels.split_k import store_or_reduce
from octavo.kernels.split_k import to_fill as split_k_to_fill
from octavo.kernels.triton_utils import require_triton, tl, triton

MAX_M = 32
# Above 16 rows only small tall-K weights gain (see preferred()).
SMALL_WEIGHT = 1 << 22


@triton.jit
def _skinny_gemm_kernel(
    x_ptr, w_ptr, out_ptr, part_ptr, cnt_ptr,
    M, N, K, K_PER_SPLIT, NUM_SPLITS,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_om, stride_on,
    stride_ps, stride_pm, stride_pn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = offs_m < M
    n_ok = offs_n < N
    k_start = pid_k * K_PER_SPLIT
    k_end = tl.minimum(k_start + K_PER_SPLIT, K)
    # The first K tile of the weight is read before the PDL wait (no kernel of the step
    # writes weights): at decode sizes a program has only a few tiles, so most of its bytes
    # are on their way while the previous kernel finishes.
    offs_k = k_start + tl.arange(0, BLOCK_K)
    w = tl.load(w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :] * stride_wk,
                mask=n_ok[:, None] & (offs_k < k_end)[None, :], other=0.0)
    pdl_begin(PDL)
    x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk,
                mask=m_ok[:, None] & (offs_k < k_end)[None, :], other=0.0)
    acc = tl.dot(x, tl.trans(w), tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32))
    for k0 in range(k_start + BLOCK_K, k_end, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_ok = offs_k < k_end
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk,
                    mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :] * stride_wk,
                    mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
    store_or_reduce(acc, offs_m, offs_n, m_ok[:, None] & n_ok[None, :], out_ptr,
                    stride_om, stride_on, part_ptr, stride_ps, stride_pm, stride_pn, cnt_ptr,
                    pid_n, pid_k, NUM_SPLITS)


def supports(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """A CUDA half-precision batch of at most MAX_M rows against a [N, K] weight of its dtype."""
    return (x.is_cuda and x.dtype in (torch.bfloat16, torch.float16)
            and weight.dtype == x.dtype and weight.dim() == 2 and x.shape[-1] == weight.shape[1]
            and 1 <= x.numel() // x.shape[-1] <= MAX_M and weight.shape[1] % 16 == 0)


def preferred(weight: torch.Tensor, rows: int = 1) -> bool:
    """Whether this kernel beats cuBLAS for the weight's shape at ``rows`` rows: measured on
    an H200 (benchmarks/skinny_gemm.py --sweep, M = 1..16) only for tall-K projections
    (K >= 2N, e.g. o_proj and down_proj of a 0.6B model: 5.5 vs 12.5 us and 6.3 vs 7.4 us at
    M = 1, where cuBLAS picks a split-K with a second launch); for wide ones (qkv, gate_up,
    LM head) cuBLAS is as fast or faster. From 17 to 32 rows only for tall-K weights of at
    most 4M values: at 32 rows those of Qwen3-0.6B tie cuBLAS alone (o 5.91 vs 5.80 us, down
    7.63 vs 7.61) and take W4's batch-32 step from 1.670 to 1.607 ms in the engine (launched
    with PDL, the weight reads start under the previous kernel); Llama-3.1-8B's down_proj
    (58M) is 0.72x cuBLAS there."""
    n, k = weight.shape
    return k >= 2 * n and (rows <= 16 or n * k <= SMALL_WEIGHT)


def default_tiles(m: int, k: int) -> tuple[int, int]:
    """(BLOCK_N, BLOCK_K) for ``m`` rows and depth ``k``. Sweep winners on the H200 (M <= 16):
    32-row weight tiles, 256-wide K steps up to K = 2048. Above 32 rows (the benchmark's
    sweeps reach 64) the K step halves: four stages of a 64-row x tile and the weight tile at
    256 wide need 240 KB of shared memory, more than an SM has (227 KB on the H200)."""
    return 32, (256 if k <= 2048 and m <= 32 else 128)


def skinny_gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                block_n: int | None = None, block_k: int | None = None,
                split_k: int | None = None, num_warps: int | None = None,
                num_stages: int | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for at most MAX_M rows. The tuning arguments (None:
    chosen here) exist for the benchmark's sweeps."""
    require_triton("skinny_gemm")
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    m, k = x2.shape
    n = weight.shape[0]
    assert m <= 64, m  # one tile of rows (the dispatcher sends at most MAX_M)
    default_n, default_k = default_tiles(m, k)
    block_n = block_n or default_n
    block_k = block_k or default_k
    n_tiles = triton.cdiv(n, block_n)
    if split_k is None:
        # About four programs per SM: every SM streams several tiles at once.
        split_k = split_k_to_fill(n_tiles, triton.cdiv(k, block_k), x.device, 4)
    split_k, k_per_split = split_k_plan(triton.cdiv(k, block_k) * block_k, block_k, split_k)
    out, partial = split_k_buffers(m, n, split_k, x2)
    _skinny_gemm_kernel[(n_tiles, split_k)](
        x2, weight, out, partial, split_k_counters(x.device, n_tiles),
        m, n, k, k_per_split, split_k,
        x2.stride(0), x2.stride(1), weight.stride(0), weight.stride(1),
        out.stride(0), out.stride(1), partial.stride(0), partial.stride(1), partial.stride(2),
        BLOCK_M=max(16, triton.next_power_of_2(m)), BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=num_warps or 4, num_stages=num_stages or 4, **pdl_args(x.device),
    )  # fmt: skip
    if bias is not None:
        out += bias
    return out.reshape(*shape[:-1], n)

