"""Weight-only integer GEMV for decode batches (M = 1..8): ``y = x @ dequant(W)`` on CUDA cores,
for the packed layout of ``octavo.kernels.w4a16_gemm`` (int32 [K / pack, N] packed along K,
float scales and zeros [K / group, N]).

At batch 1 a decode step reads each weight once, so the kernel must run at memory speed; the
work per weight value is what limits it, not the multiply. So:

- No tensor cores: ``tl.dot`` would pad M to 16 and convert every dequantized value to bf16.
- No int -> float conversion instruction (a quarter-rate or slower op on NVIDIA GPUs): each
  unpacked value is OR-ed into the mantissa of 2**23 and 2**23 subtracted back (exact).
- Scales and zeros applied per group, not per value: inside one group
  ``sum_k x[k] (q[k,n] - z[n]) s[n] = s[n] (sum_k x[k] q[k,n] - z[n] sum_k x[k])``.
- Partial sums are kept per packed row and reduced once at the end, not across threads at
  every step.
- Split-K when the output alone has too few tiles to fill the GPU; the float32 partial sums
  are then added by a second small launch (deterministic, unlike atomics).
"""

from __future__ import annotations

import torch

from octavo.kernels.triton_utils import num_compute_units, require_triton, tl, triton

MAX_M = 8  # larger batches go to the tensor-core kernel


@triton.jit
def _int_weight_gemv_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, out_ptr,
    M, N, K, K_PER_SPLIT,
    stride_xm, stride_xk, stride_qk, stride_qn, stride_sg, stride_sn,
    stride_zg, stride_zn, stride_os, stride_om, stride_on,
    GROUP: tl.constexpr, BITS: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_P: tl.constexpr, MAGIC_CVT: tl.constexpr,
):  # fmt: skip
    # Grid (N tiles, K splits). A step covers BLOCK_P packed rows (BLOCK_P * PACK input rows),
    # which lie in one group: GROUP is a multiple of BLOCK_P * PACK.
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    PACK: tl.constexpr = 32 // BITS
    MASK: tl.constexpr = (1 << BITS) - 1
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    offs_j = tl.arange(0, PACK)
    offs_m = tl.arange(0, BLOCK_M)
    m_mask = offs_m < M
    shifts = offs_j * BITS
    # acc[m, p, n]: row p's share of output (m, n), summed over groups; reduced over p last.
    acc = tl.zeros((BLOCK_M, BLOCK_P, BLOCK_N), dtype=tl.float32)
    k_start = pid_k * K_PER_SPLIT
    k_end = tl.minimum(k_start + K_PER_SPLIT, K)
    for k0 in range(k_start, k_end, BLOCK_P * PACK):
        offs_p = k0 // PACK + tl.arange(0, BLOCK_P)
        packed = tl.load(qw_ptr + offs_p[:, None] * stride_qk + offs_n[None, :] * stride_qn,
                         mask=n_mask[None, :], other=0)
        bits = (packed[:, None, :] >> shifts[None, :, None]) & MASK  # [P, PACK, N]
        if MAGIC_CVT:
            q = (bits | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
        else:
            q = bits.to(tl.float32)
        rows = offs_p[:, None] * PACK + offs_j[None, :]  # [P, PACK]
        x = tl.load(x_ptr + offs_m[:, None, None] * stride_xm + rows[None, :, :] * stride_xk,
                    mask=m_mask[:, None, None], other=0.0).to(tl.float32)  # [M, P, PACK]
        dot = tl.sum(x[:, :, :, None] * q[None, :, :, :], axis=2)  # [M, P, N]
        xsum = tl.sum(x, axis=2)  # [M, P]
        g = k0 // GROUP
        s = tl.load(s_ptr + g * stride_sg + offs_n * stride_sn, mask=n_mask,
                    other=0.0).to(tl.float32)
        z = tl.load(z_ptr + g * stride_zg + offs_n * stride_zn, mask=n_mask,
                    other=0.0).to(tl.float32)
        acc += s[None, None, :] * (dot - xsum[:, :, None] * z[None, None, :])
    out = tl.sum(acc, axis=1)  # [M, N]
    ptrs = out_ptr + pid_k * stride_os + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    tl.store(ptrs, out.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def supports(m: int, k: int, group_size: int, bits: int) -> bool:
    pack = 32 // bits
    return 1 <= m <= MAX_M and group_size % pack == 0 and k % group_size == 0


def _block_p(group_size: int, pack: int, block_m: int) -> int:
    """Packed rows per step: the most that fit one group, fewer as M grows (registers)."""
    want = max(1, 4 // block_m)
    rows_per_group = group_size // pack
    bp = 1
    while bp * 2 <= want and rows_per_group % (bp * 2) == 0:
        bp *= 2
    return bp


def w4a16_gemv(x2: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
               zeros: torch.Tensor, group_size: int, bits: int, split_k: int | None = None,
               block_n: int | None = None, block_p: int | None = None,
               num_warps: int = 4, magic_cvt: bool = True) -> torch.Tensor:
    """``x2 [M, K] @ dequant(W) [K, N]`` for M <= MAX_M, in x2's dtype. The tuning arguments
    (None: chosen here) exist for the benchmark's sweeps."""
    require_triton("w4a16_gemv")
    m, k = x2.shape
    n = qweight.shape[1]
    pack = 32 // bits
    block_m = triton.next_power_of_2(m)
    if block_p is None:
        block_p = _block_p(group_size, pack, block_m)
    if block_n is None:
        block_n = 128 if block_m <= 2 else 64
    step = block_p * pack
    assert group_size % step == 0 and k % group_size == 0, (group_size, step, k)
    n_tiles = triton.cdiv(n, block_n)
    k_steps = k // step
    if split_k is None:
        # Two waves of programs over the GPU; each split still several steps long.
        want = 2 * num_compute_units(x2.device)
        split_k = max(1, min(want // n_tiles, k_steps // 4, 32))
    split_k = max(1, min(split_k, k_steps))
    k_per_split = triton.cdiv(k_steps, split_k) * step
    split_k = triton.cdiv(k, k_per_split)
    if split_k == 1:
        partial = torch.empty(1, m, n, device=x2.device, dtype=x2.dtype)
    else:
        partial = torch.empty(split_k, m, n, device=x2.device, dtype=torch.float32)
    _int_weight_gemv_kernel[(n_tiles, split_k)](
        x2, qweight, scales, zeros, partial,
        m, n, k, k_per_split,
        x2.stride(0), x2.stride(1), qweight.stride(0), qweight.stride(1),
        scales.stride(0), scales.stride(1), zeros.stride(0), zeros.stride(1),
        partial.stride(0), partial.stride(1), partial.stride(2),
        GROUP=group_size, BITS=bits, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_P=block_p,
        MAGIC_CVT=magic_cvt, num_warps=num_warps,
    )  # fmt: skip
    if split_k == 1:
        return partial[0]
    return partial.sum(dim=0).to(x2.dtype)
