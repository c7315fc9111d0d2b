"""``y = x @ W.T`` for decode batches of 1-2 rows with a bf16 / fp16 weight [N, K] (K
contiguous, the nn.Linear layout), on CUDA cores, launched with PDL.

At batch 1 a decode step is a chain of ~300 short kernels (W4: 1.1 ms for 0.25 ms of weight
reads). cuBLAS's GEMMs do not take part in programmatic dependent launch, so each of them
(qkv, gate/up, the LM head: the wide projections) makes the chain wait for a full drain and
ramp-up; the tensor-core skinny GEMM that does take part pads M to 16 and was 0.6-0.9x cuBLAS
on the wide shapes. Here each program streams [BLOCK_N, BLOCK_K] weight tiles (16-byte loads
along K), converts each value to float32 (one instruction: bf16 is the top half of a float32)
and adds ``w * x`` with one FMA per row of x into a per-thread accumulator tile, summed across
threads once at the end; two instructions per weight against two bytes read, so the loop is
bound by memory, not issue. The first tile is loaded before ``griddepcontrol.wait`` (weights
are written by no kernel of the step), the next one before each step's arithmetic (the loop
is unrolled twice so the two buffers swap without copies), and K is split over programs only
as far as needed to fill the GPU (``octavo.kernels.split_k``: the last program of a tile adds
the partial sums, no second launch).
"""

from __future__ import annotations

import torch

from octavo.kernels.activation import silu_mul
from octavo.kernels.pdl import begin as pdl_begin
from octavo.kernels.pdl import launch_args as pdl_args
from octavo.kernels.split_k import buffers as split_k_buffers
from octavo.kernels.split_k import counters as split_k_counters
from octavo.kernels.split_k import plan as split_k_plan
from octavo.kernels.split_k import store_rows
from octavo.kernels.split_k import to_fill as split_k_to_fill
from octavo.kernels.triton_utils import require_triton, tl, triton

MAX_M = 2


@triton.jit
def _x_block(x_ptr, offs_k, k_mask, K, EVEN_K: tl.constexpr, GLU: tl.constexpr):
    """x[offs_k] as float32; GLU: x is [gate | up] (the up half K after the gate) and the
    block is ``silu(gate) * up`` rounded to x's dtype, as silu_and_mul stores it."""
    if EVEN_K:
        x = tl.load(x_ptr + offs_k)
    else:
        x = tl.load(x_ptr + offs_k, mask=k_mask, other=0.0)
    if GLU:
        if EVEN_K:
            up = tl.load(x_ptr + K + offs_k)
        else:
            up = tl.load(x_ptr + K + offs_k, mask=k_mask, other=0.0)
        x = silu_mul(x.to(tl.float32), up.to(tl.float32)).to(x_ptr.dtype.element_ty)
    return x.to(tl.float32)


@triton.jit
def _dense_gemv_kernel(
    x_ptr, w_ptr, out_ptr, part_ptr, cnt_ptr,
    M, N, K, K_PER_SPLIT, NUM_SPLITS,
    stride_xm, stride_wn, stride_om, stride_on, stride_ps, stride_pm, stride_pn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
    GLU: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    # Grid (N tiles, K splits); x [M, K] and W [N, K] both with stride 1 along K. One
    # accumulator tile per row of x (BLOCK_M = M, 1 or 2). EVEN_K: K and K_PER_SPLIT are
    # multiples of BLOCK_K, so no load needs a mask along K (the loads stay 16 bytes wide).
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    k_start = pid_k * K_PER_SPLIT
    k_end = tl.minimum(k_start + K_PER_SPLIT, K)
    offs_k = k_start + tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :]
    if EVEN_K:
        w = tl.load(w_ptrs, mask=n_mask[:, None], other=0.0)
    else:
        w = tl.load(w_ptrs, mask=n_mask[:, None] & (offs_k < k_end)[None, :], other=0.0)
    pdl_begin(PDL)  # the first weights are on their way while the previous kernel ends
    acc0 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    x1_ptr = x_ptr + stride_xm
    for k0 in tl.range(k_start, k_end, BLOCK_K, loop_unroll_factor=2):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        next_k = offs_k + BLOCK_K
        k_mask = offs_k < k_end
        if EVEN_K:
            # One condition for the whole tile (none past the split's end).
            more = n_mask & ((offs_n * 0 + k0 + BLOCK_K) < k_end)
            w_next = tl.load(w_ptrs + (k0 - k_start + BLOCK_K), mask=more[:, None], other=0.0)
        else:
            w_next = tl.load(w_ptrs + (k0 - k_start + BLOCK_K),
                             mask=n_mask[:, None] & (next_k < k_end)[None, :], other=0.0)
        x0 = _x_block(x_ptr, offs_k, k_mask, K, EVEN_K, GLU)
        wf = w.to(tl.float32)
        acc0 += wf * x0[None, :]
        if BLOCK_M > 1:
            x1 = _x_block(x1_ptr, offs_k, k_mask, K, EVEN_K, GLU)
            acc1 += wf * x1[None, :]
        w = w_next
    store_rows(acc0, acc1, offs_n, n_mask, M, out_ptr, stride_om, stride_on, part_ptr,
               stride_ps, stride_pm, stride_pn, cnt_ptr, pid_n, pid_k, NUM_SPLITS, BLOCK_M)


def supports(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """A half-precision batch of at most MAX_M rows against a [N, K] weight of its dtype,
    contiguous along K."""
    return (x.dtype in (torch.bfloat16, torch.float16) and weight.dtype == x.dtype
            and weight.dim() == 2 and x.shape[-1] == weight.shape[1]
            and weight.stride(1) == 1 and 1 <= x.numel() // max(1, x.shape[-1]) <= MAX_M)


def dense_gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
               block_n: int | None = None, block_k: int | None = None,
               split_k: int | None = None, num_warps: int | None = None,
               waves: int | None = None, glu: bool = False) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for at most MAX_M rows (float32 accumulation, rounded
    once to x's dtype before the bias is added). ``glu``: x is [..., 2K] = [gate | up] and
    the layer is applied to ``silu(gate) * up`` (rounded to x's dtype, bit for bit what
    ``octavo.kernels.activation.silu_and_mul`` stores), computed as x is read. The tuning
    arguments (None: chosen here) exist for the benchmark's sweeps and the tests."""
    require_triton("dense_gemv")
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    k = shape[-1] // 2 if glu else shape[-1]
    assert not glu or shape[-1] == 2 * k, shape
    m = x2.shape[0]
    n = weight.shape[0]
    assert 1 <= m <= MAX_M and weight.shape[1] == k and weight.stride(1) == 1, (
        x.shape, weight.shape, weight.stride())
    # 8 x 512 weights per step over 8 warps (16 per thread): from benchmarks/skinny_gemm.py
    # --sweep-gemv on an H200, the best or near it on most Qwen3-0.6B / Llama-3.1-8B shapes;
    # 64 per thread (16 x 512 over 4 warps) took 255 registers and lost to cuBLAS on two.
    block_n = block_n or 8
    block_k = block_k or 512
    num_warps = num_warps or 8
    block_k = min(block_k, triton.next_power_of_2(k))
    n_tiles = triton.cdiv(n, block_n)
    k_steps = triton.cdiv(k, block_k)
    if split_k is None:  # enough programs to keep every SM's loads in flight
        split_k = split_k_to_fill(n_tiles, k_steps, x2.device, waves or 2)
    split_k, k_per_split = split_k_plan(k_steps * block_k, block_k, split_k)
    out, partial = split_k_buffers(m, n, split_k, x2)
    _dense_gemv_kernel[(n_tiles, split_k)](
        x2, weight, out, partial, split_k_counters(x2.device, n_tiles),
        m, n, k, k_per_split, split_k,
        x2.stride(0), weight.stride(0),
        out.stride(0), out.stride(1), partial.stride(0), partial.stride(1), partial.stride(2),
        BLOCK_M=m, BLOCK_N=block_n, BLOCK_K=block_k,
        EVEN_K=k % block_k == 0 and k_per_split % block_k == 0, GLU=glu, num_warps=num_warps,
        **pdl_args(x2.device),
    )  # fmt: skip
    if bias is not None:
        out += bias
    return out.reshape(*shape[:-1], n)
