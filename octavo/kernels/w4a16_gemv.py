"""Weight-only integer GEMV for decode batches (M = 1..4): ``y = x @ dequant(W)`` on CUDA cores,
for the packed layout of ``octavo.kernels.w4a16_gemm`` (int32 [K / pack, N] packed along K,
float scales and zeros [K / group, N]).

At batch 1 a decode step reads each weight once, so the kernel must run at memory speed; the
instructions spent per weight value are what limit it, not the multiply. So:

- No tensor cores: ``tl.dot`` would pad M to 16 and convert every dequantized value to bf16.
- Three instructions per weight: a shift and a mask-or place the value ``q`` in the top
  mantissa bits of 1.0, giving the float ``v = 1 + q / 2**BITS`` with no conversion
  instruction, and one FMA adds ``x * v``. Per group, ``sum x q = 2**BITS (sum x v - sum x)``.
- Scales and zeros applied per group, not per value: inside one group
  ``sum_k x[k] (q[k,n] - z[n]) s[n] = s[n] (sum_k x[k] q[k,n] - z[n] sum_k x[k])``.
- Only 2-D tiles [packed rows, N], one pass per value position in the int32 (no 3-D reshape),
  per-row partial sums reduced once at the end, not across threads at every step.
- Split-K when the output alone has too few tiles to fill the GPU; the last program of each
  tile adds the float32 partial sums (``octavo.kernels.split_k``: no second launch).
"""

from __future__ import annotations

import torch

from octavo.kernels.split_k import buffers as split_k_buffers
from octavo.kernels.split_k import counters as split_k_counters
from octavo.kernels.split_k import plan as split_k_plan
from octavo.kernels.split_k import store_or_reduce
from octavo.kernels.triton_utils import num_compute_units, require_triton, tl, triton

MAX_M = 4  # larger batches go to the tensor-core kernel
PREFETCH_BITS = (4,)  # where prefetching is the default (benchmarks/quantized_gemm.py --sweep)
WAVES = 2  # programs per SM with PREFETCH


@triton.jit
def _group_dot(packed, x_ptr, offs_p, stride_xk, PACK: tl.constexpr, BITS: tl.constexpr):
    """sum over the PACK values of each packed row of x[k] * (1 + q[k, n] / 2**BITS): [P, N];
    and sum of x over the same rows: [P]."""
    MASK: tl.constexpr = ((1 << BITS) - 1) << (23 - BITS)
    acc = tl.zeros(packed.shape, dtype=tl.float32)
    xsum = tl.zeros((packed.shape[0],), dtype=tl.float32)
    for j in tl.static_range(PACK):
        shift = 23 - BITS - j * BITS  # a compile-time constant (j comes from static_range)
        if shift >= 0:
            t = packed << shift
        else:
            t = packed >> (-shift)
        v = ((t & MASK) | 0x3F800000).to(tl.float32, bitcast=True)
        xj = tl.load(x_ptr + (offs_p * PACK + j) * stride_xk).to(tl.float32)
        acc += xj[:, None] * v
        xsum += xj
    return acc, xsum


@triton.jit
def _group_term(packed, x_ptr, offs_p, stride_xk, s, z, PACK: tl.constexpr, BITS: tl.constexpr):
    """One step's contribution [P, N] of one row of x: s (sum x q - z sum x), with
    sum x q = SCALE (sum x v - sum x)."""
    SCALE: tl.constexpr = 1 << BITS
    d, xs = _group_dot(packed, x_ptr, offs_p, stride_xk, PACK, BITS)
    return (s * SCALE)[None, :] * d - (s * (SCALE + z))[None, :] * xs[:, None]


@triton.jit
def _load_step(q_ptrs, s_ptrs, z_ptrs, g, stride_sg, stride_zg, mask):
    """One step's packed weights [P, N] and its group's scales and zeros [N] (float32);
    ``mask`` [N]: the columns to read (others read as 0)."""
    packed = tl.load(q_ptrs, mask=mask[None, :], other=0)
    s = tl.load(s_ptrs + g * stride_sg, mask=mask, other=0.0).to(tl.float32)
    z = tl.load(z_ptrs + g * stride_zg, mask=mask, other=0.0).to(tl.float32)
    return packed, s, z


@triton.jit
def _int_weight_gemv_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, out_ptr, part_ptr, cnt_ptr,
    M, N, K, K_PER_SPLIT, NUM_SPLITS,
    stride_xm, stride_xk, stride_qk, stride_qn, stride_sg, stride_sn,
    stride_zg, stride_zn, stride_om, stride_on, stride_ps, stride_pm, stride_pn,
    GROUP: tl.constexpr, BITS: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_P: tl.constexpr, PREFETCH: tl.constexpr,
):  # fmt: skip
    # Grid (N tiles, K splits). A step covers BLOCK_P packed rows (BLOCK_P * PACK input rows),
    # which lie in one group: GROUP is a multiple of BLOCK_P * PACK. BLOCK_M is 1, 2 or 4,
    # one accumulator per row of x (rows past M read row 0 and are not stored).
    # PREFETCH: the next step's weights, scales and zeros are loaded before this step's
    # arithmetic (registers, double-buffered by hand: Triton does not pipeline loads that feed
    # no dot), so a program keeps a load in flight while it computes; fewer, longer programs
    # then read at memory speed without split-K's partial sums.
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    PACK: tl.constexpr = 32 // BITS
    STEP: tl.constexpr = BLOCK_P * PACK
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    x1 = x_ptr + tl.minimum(1, M - 1) * stride_xm
    x2 = x_ptr + tl.minimum(2, M - 1) * stride_xm
    x3 = x_ptr + tl.minimum(3, M - 1) * stride_xm
    # acc*[p, n]: packed row p's share of output (m, n), summed over groups.
    acc0 = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
    acc3 = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
    k_start = pid_k * K_PER_SPLIT
    k_end = tl.minimum(k_start + K_PER_SPLIT, K)
    q_ptrs = qw_ptr + (k_start // PACK + tl.arange(0, BLOCK_P))[:, None] * stride_qk \
        + offs_n[None, :] * stride_qn
    s_ptrs = s_ptr + offs_n * stride_sn
    z_ptrs = z_ptr + offs_n * stride_zn
    if PREFETCH:
        packed, s, z = _load_step(q_ptrs, s_ptrs, z_ptrs, k_start // GROUP, stride_sg,
                                  stride_zg, n_mask)
    for k0 in range(k_start, k_end, STEP):
        offs_p = k0 // PACK + tl.arange(0, BLOCK_P)
        if PREFETCH:
            more = n_mask & ((offs_n * 0 + k0 + STEP) < k_end)  # a tensor mask
            packed_next, s_next, z_next = _load_step(
                q_ptrs + BLOCK_P * stride_qk, s_ptrs, z_ptrs, (k0 + STEP) // GROUP,
                stride_sg, stride_zg, more)
        else:
            packed, s, z = _load_step(q_ptrs, s_ptrs, z_ptrs, k0 // GROUP, stride_sg,
                                      stride_zg, n_mask)
        acc0 += _group_term(packed, x_ptr, offs_p, stride_xk, s, z, PACK, BITS)
        if BLOCK_M > 1:
            acc1 += _group_term(packed, x1, offs_p, stride_xk, s, z, PACK, BITS)
        if BLOCK_M > 2:
            acc2 += _group_term(packed, x2, offs_p, stride_xk, s, z, PACK, BITS)
            acc3 += _group_term(packed, x3, offs_p, stride_xk, s, z, PACK, BITS)
        q_ptrs += BLOCK_P * stride_qk
        if PREFETCH:
            packed, s, z = packed_next, s_next, z_next
    offs_m = tl.arange(0, BLOCK_M)
    res = tl.where(offs_m[:, None] == 0, tl.sum(acc0, axis=0)[None, :], 0.0)
    if BLOCK_M > 1:
        res = tl.where(offs_m[:, None] == 1, tl.sum(acc1, axis=0)[None, :], res)
    if BLOCK_M > 2:
        res = tl.where(offs_m[:, None] == 2, tl.sum(acc2, axis=0)[None, :], res)
        res = tl.where(offs_m[:, None] == 3, tl.sum(acc3, axis=0)[None, :], res)
    store_or_reduce(res, offs_m, offs_n, (offs_m[:, None] < M) & n_mask[None, :], out_ptr,
                    stride_om, stride_on, part_ptr, stride_ps, stride_pm, stride_pn, cnt_ptr,
                    pid_n, pid_k, NUM_SPLITS)


def supports(m: int, k: int, group_size: int, bits: int) -> bool:
    pack = 32 // bits
    return 1 <= m <= MAX_M and group_size % pack == 0 and k % group_size == 0


def _block_p(group_size: int, pack: int, want: int) -> int:
    """Packed rows per step: up to ``want``, dividing one group's packed rows."""
    rows_per_group = group_size // pack
    bp = 1
    while bp * 2 <= want and rows_per_group % (bp * 2) == 0:
        bp *= 2
    return bp


def w4a16_gemv(x2: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
               zeros: torch.Tensor, group_size: int, bits: int, split_k: int | None = None,
               block_n: int | None = None, block_p: int | None = None,
               num_warps: int | None = None, num_stages: int | None = None,
               prefetch: bool | None = None, waves: int | None = None) -> torch.Tensor:
    """``x2 [M, K] @ dequant(W) [K, N]`` for M <= MAX_M, in x2's dtype. The tuning arguments
    (None: chosen here) exist for the benchmark's sweeps."""
    require_triton("w4a16_gemv")
    m, k = x2.shape
    n = qweight.shape[1]
    pack = 32 // bits
    block_m = 1 if m == 1 else (2 if m == 2 else 4)
    # Defaults from benchmarks/quantized_gemm.py --sweep on an H200 at Llama-8B shapes (the
    # space is flat within ~10% around them).
    block_p = _block_p(group_size, pack, block_p or (8 if m == 1 else 4))
    block_n = block_n or 256
    prefetch = bits in PREFETCH_BITS if prefetch is None else prefetch
    num_warps = num_warps or (4 if prefetch else 2)
    step = block_p * pack
    assert group_size % step == 0 and k % group_size == 0, (group_size, step, k)
    n_tiles = triton.cdiv(n, block_n)
    k_steps = k // step
    if split_k is None:
        # Enough programs per SM that memory latency is hidden: without prefetching, many
        # short ones; with it, a few long ones keep their own loads in flight.
        want = (waves or (WAVES if prefetch else 8)) * num_compute_units(x2.device)
        split_k = max(1, min(triton.cdiv(want, n_tiles), k_steps, 64))
    split_k, k_per_split = split_k_plan(k, step, split_k)
    out, partial = split_k_buffers(m, n, split_k, x2)
    _int_weight_gemv_kernel[(n_tiles, split_k)](
        x2, qweight, scales, zeros, out, partial, split_k_counters(x2.device, n_tiles),
        m, n, k, k_per_split, split_k,
        x2.stride(0), x2.stride(1), qweight.stride(0), qweight.stride(1),
        scales.stride(0), scales.stride(1), zeros.stride(0), zeros.stride(1),
        out.stride(0), out.stride(1), partial.stride(0), partial.stride(1), partial.stride(2),
        GROUP=group_size, BITS=bits, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_P=block_p,
        PREFETCH=bool(prefetch), num_warps=num_warps, num_stages=num_stages or 3,
    )  # fmt: skip
    return out
