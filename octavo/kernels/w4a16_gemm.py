"""Weight-only integer GEMM: ``y = x @ dequant(W)`` for 4-bit (W4A16) and 8-bit (W8A16) weights
with per-group scales and zero points, dequantized inside the main loop.

One packed layout serves every checkpoint format (GPTQ, AWQ, ...): the quantization methods
repack into it once at load. The layout:

- ``qweight`` int32 [K / pack, N], ``pack = 32 // bits`` values per int32 packed along K in
  natural order: input row ``k`` sits in ``qweight[k // pack, n]`` at bits
  ``(k % pack) * bits``. Packing along K keeps the N dimension contiguous, so a tile's loads are
  coalesced along N like a plain row-major [K, N] weight.
- ``scales`` and ``zeros`` float [K / group, N]: ``W[k, n] = (q[k, n] - zeros[g, n]) *
  scales[g, n]`` with ``g = k // group``. Zeros are kept as floats holding integers (exact) so
  that GPTQ's "zeros minus one" convention can store 16 for a 4-bit weight.

Act-order (GPTQ desc_act) is not handled here: the method permutes the rows of K at load so
that groups are contiguous, and permutes the activations' columns through a stored index.

``w4a16_gemm_ref`` (dequantize, then matmul) is the reference the kernel is tested against and
the path used where Triton cannot run.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from octavo import envs
from octavo.kernels import w4a16_gemv as gemv
from octavo.kernels.split_k import buffers as split_k_buffers
from octavo.kernels.split_k import counters as split_k_counters
from octavo.kernels.split_k import plan as split_k_plan
from octavo.kernels.split_k import store_or_reduce
from octavo.kernels.split_k import within as split_k_within
from octavo.kernels.triton_utils import require_triton, tl, triton

SUPPORTED_BITS = (4, 8)
# Which path runs which batch size, from benchmarks/quantized_gemm.py --sweep on an H200
# (Llama-8B projections, g128): the GEMV up to GEMV_MAX_M rows, the tensor-core kernel up to
# FUSED_MAX_M, dequantize-then-cuBLAS above.
GEMV_MAX_M = 2
FUSED_MAX_M = 128


def pack_factor(bits: int) -> int:
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"the integer GEMM holds {SUPPORTED_BITS}-bit weights, not {bits}")
    return 32 // bits


def pack_along_k(q: torch.Tensor, bits: int) -> torch.Tensor:
    """Integer values [K, N] (0 <= q < 2**bits) -> the kernel's int32 [K / pack, N]."""
    pack = pack_factor(bits)
    k, n = q.shape
    if k % pack:
        raise ValueError(f"K={k} is not divisible by the pack factor {pack}")
    q = q.to(torch.int64).reshape(k // pack, pack, n)
    shifts = (torch.arange(pack, device=q.device, dtype=torch.int64) * bits).view(1, pack, 1)
    packed = (q << shifts).sum(dim=1)  # disjoint bit ranges: the sum is the bitwise or
    # Values >= 2**31 wrap to negative int32: the bit pattern is what matters.
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def unpack_along_k(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """The kernel's int32 [K / pack, N] -> integer values [K, N] (int32)."""
    pack = pack_factor(bits)
    shifts = (torch.arange(pack, device=packed.device, dtype=torch.int32) * bits).view(1, pack, 1)
    q = (packed.unsqueeze(1) >> shifts) & ((1 << bits) - 1)
    return q.reshape(-1, packed.shape[1])


def dequantize_ref(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                   group_size: int, bits: int, dtype: torch.dtype) -> torch.Tensor:
    """The float weight [K, N] (computed in float32, rounded once to ``dtype``)."""
    q = unpack_along_k(qweight, bits).to(torch.float32)
    s = scales.to(torch.float32).repeat_interleave(group_size, dim=0)
    z = zeros.to(torch.float32).repeat_interleave(group_size, dim=0)
    return ((q - z) * s).to(dtype)


def w4a16_gemm_ref(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                   zeros: torch.Tensor, group_size: int, bits: int = 4) -> torch.Tensor:
    """``x [.., K] @ dequant(W) [K, N]``: dequantize to x's dtype, then matmul."""
    w = dequantize_ref(qweight, scales, zeros, group_size, bits, x.dtype)
    return x @ w


@triton.jit
def gemm_tile(M, N, K, K_PER_SPLIT, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """A weight-only GEMM program's place on the (M tiles, N tiles, K splits) grid: its rows
    and columns with their masks, and its K range [k_start, k_end)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k_start = pid_k * K_PER_SPLIT
    return (pid_m, pid_n, pid_k, offs_m, offs_n, offs_m < M, offs_n < N, k_start,
            tl.minimum(k_start + K_PER_SPLIT, K))


@triton.jit
def group_row(ptr, g, stride_g, offs_n, stride_n, n_mask):
    """Row ``g`` (a group's scales or zeros) of a [groups, N] tensor, as float32."""
    return tl.load(ptr + g * stride_g + offs_n * stride_n, mask=n_mask, other=0.0).to(tl.float32)


@triton.jit
def _int_weight_gemm_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, out_ptr, part_ptr, cnt_ptr,
    M, N, K, K_PER_SPLIT, NUM_SPLITS,
    stride_xm, stride_xk, stride_qk, stride_qn, stride_sg, stride_sn,
    stride_zg, stride_zn, stride_om, stride_on, stride_ps, stride_pm, stride_pn,
    GROUP: tl.constexpr, BITS: tl.constexpr, FP32_DOT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    RELOAD: tl.constexpr, SZ_AHEAD: tl.constexpr,
):  # fmt: skip
    # Grid (M tiles, N tiles, K splits). BLOCK_K divides GROUP, so one K tile lies in one group
    # and needs one row of scales and zeros. SZ_AHEAD: each step's row loaded a step ahead
    # (plain loads the pipeliner leaves on the step's critical path, before the dequantization;
    # the swap-AB kernels load theirs ahead too).
    PACK: tl.constexpr = 32 // BITS
    MASK: tl.constexpr = (1 << BITS) - 1
    pid_m, pid_n, pid_k, offs_m, offs_n, m_mask, n_mask, k_start, k_end = gemm_tile(
        M, N, K, K_PER_SPLIT, BLOCK_M, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if SZ_AHEAD:
        s = group_row(s_ptr, k_start // GROUP, stride_sg, offs_n, stride_sn, n_mask)
        z = group_row(z_ptr, k_start // GROUP, stride_zg, offs_n, stride_zn, n_mask)
    for k0 in range(k_start, k_end, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk,
                    mask=m_mask[:, None], other=0.0)
        if SZ_AHEAD:
            # The next step's (past the split's end its last group again: a harmless reload).
            g_next = tl.minimum(k0 + BLOCK_K, k_end - 1) // GROUP
            s_next = group_row(s_ptr, g_next, stride_sg, offs_n, stride_sn, n_mask)
            z_next = group_row(z_ptr, g_next, stride_zg, offs_n, stride_zn, n_mask)
        if RELOAD:
            # Row k reads its packed int32 itself (PACK rows share one, served from L1) and
            # shifts its own value out: no reshape of the tile.
            packed = tl.load(qw_ptr + (offs_k // PACK)[:, None] * stride_qk
                             + offs_n[None, :] * stride_qn, mask=n_mask[None, :], other=0)
            bits = (packed >> ((offs_k % PACK) * BITS)[:, None]) & MASK
        else:
            # Each packed int32 is loaded once and spread over its PACK rows: row r * PACK + j
            # of the tile is value j of packed row r, so [rows, PACK, N] reshapes to [K, N].
            offs_p = k0 // PACK + tl.arange(0, BLOCK_K // PACK)
            packed = tl.load(qw_ptr + offs_p[:, None] * stride_qk + offs_n[None, :] * stride_qn,
                             mask=n_mask[None, :], other=0)
            shifts = tl.arange(0, PACK) * BITS
            bits = tl.reshape((packed[:, None, :] >> shifts[None, :, None]) & MASK,
                              (BLOCK_K, BLOCK_N))
        # Int -> float through the mantissa of 2**23 (no slow conversion instruction); >> is
        # arithmetic on int32, the mask drops the sign bits of the top value.
        q = (bits | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
        if not SZ_AHEAD:
            g = k0 // GROUP
            s = group_row(s_ptr, g, stride_sg, offs_n, stride_sn, n_mask)
            z = group_row(z_ptr, g, stride_zg, offs_n, stride_zn, n_mask)
        w = q * s[None, :] - (z * s)[None, :]
        if FP32_DOT:
            acc += tl.dot(a, w, input_precision="ieee")
        else:
            acc += tl.dot(a, w.to(a.dtype))
        if SZ_AHEAD:
            s = s_next
            z = z_next
    store_or_reduce(acc, offs_m, offs_n, m_mask[:, None] & n_mask[None, :], out_ptr,
                    stride_om, stride_on, part_ptr, stride_ps, stride_pm, stride_pn, cnt_ptr,
                    pid_m * tl.num_programs(1) + pid_n, pid_k, NUM_SPLITS)


def _block_k(group_size: int, k: int) -> int:
    """The largest K tile that divides both the group and K (a tile must not straddle groups)."""
    for bk in (128, 64, 32, 16):
        if group_size % bk == 0 and k % bk == 0:
            return bk
    raise ValueError(f"the integer GEMM needs group_size ({group_size}) and K ({k}) divisible "
                     "by 16")


def kernel_supports(k: int, group_size: int, bits: int) -> bool:
    """Whether ``w4a16_gemm`` can run this shape (else use the reference)."""
    return bits in SUPPORTED_BITS and group_size % 16 == 0 and k % 16 == 0 \
        and k % group_size == 0


def w4a16_gemm(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
               zeros: torch.Tensor, group_size: int, bits: int = 4,
               split_k: int | None = None, **tuning) -> torch.Tensor:
    """``x [.., K] @ dequant(W) [K, N]`` in x's dtype (float32 accumulation).

    ``group_size``: K for one group per column. ``split_k``: K splits (None: chosen here; more
    than one for decode-sized M, whose few output tiles would leave most of the GPU idle).
    Decode batches (M <= ``GEMV_MAX_M``) run the CUDA-core GEMV kernel, M up to
    ``FUSED_MAX_M`` the tensor-core kernel, larger ones dequantize into a temporary and use
    cuBLAS (measured 2-4x faster than this tensor-core kernel there, still about half of bf16:
    a faster large-M kernel is open work). ``tuning``: tile overrides for the benchmark's
    sweeps (``path``: "gemv" / "gemm" / "dequant" forces a path; "swapab" runs
    octavo.kernels.w4a16_swapab, whose ``qweight`` is in that kernel's own packed layout).
    """
    require_triton("w4a16_gemm")
    k = x.shape[-1]
    if tuning.get("path") == "swapab":
        # qweight in the swap-AB kernel's own layout (w4a16_swapab.pack_swapab).
        from octavo.kernels.w4a16_swapab import w4a16_swapab

        tuning.pop("path")
        return over_rows(x, qweight.shape[0] * (16 // bits), lambda x2: w4a16_swapab(
            x2, qweight, scales, zeros, group_size, bits, split_k=split_k, **tuning))
    n = qweight.shape[1]
    pack = pack_factor(bits)
    assert qweight.shape[0] * pack == k, (qweight.shape, k, bits)
    assert scales.shape == zeros.shape == (k // group_size, n), (scales.shape, zeros.shape)
    return over_rows(x, n, lambda x2: _dispatch(x2, qweight, scales, zeros, group_size, bits,
                                                split_k, **tuning))


def over_rows(x: torch.Tensor, n: int, fn) -> torch.Tensor:
    """``fn(x2)`` ([M, K] -> [M, n]) on ``x [.., K]`` flattened to rows, shaped back to
    ``[.., n]``; an empty batch returns at once (no launch)."""
    x2 = x.reshape(-1, x.shape[-1])
    if x2.shape[0] == 0:
        return x.new_empty(*x.shape[:-1], n)
    return fn(x2).view(*x.shape[:-1], n)


def _dispatch(x2, qweight, scales, zeros, group_size, bits, split_k, path=None, **tuning):
    """One batch of rows on the along-K layout: the GEMV, the tensor-core kernel or
    dequantize-then-cuBLAS, by batch size unless ``path`` forces one."""
    m, k = x2.shape
    if path is None:
        if m <= GEMV_MAX_M and gemv.supports(m, k, group_size, bits):
            path = "gemv"
        else:
            path = "gemm" if m <= envs.int_gemm_fused_max_m(FUSED_MAX_M) else "dequant"
    if path == "gemv":
        return gemv.w4a16_gemv(x2, qweight, scales, zeros, group_size, bits, split_k=split_k,
                               **tuning)
    if path == "dequant":
        return x2 @ dequantize(qweight, scales, zeros, group_size, bits, x2.dtype)
    return _gemm(x2, qweight, scales, zeros, group_size, bits, split_k, **tuning)


class GemmTiles(NamedTuple):
    block_m: int
    block_n: int
    block_k: int
    m_tiles: int
    n_tiles: int
    split_k: int
    k_per_split: int


def gemm_tiles(m: int, n: int, k: int, group_size: int, device: torch.device,
               split_k: int | None = None, block_m: int | None = None,
               block_n: int | None = None, block_k: int | None = None) -> GemmTiles:
    """The tiles and K splits of a weight-only tensor-core GEMM launch (this module's, and
    ``int8_rows_gemm``'s on the rows layout): 16 x 64 up to 16 rows, else 64 x 128, K tiles
    that divide the group, and enough K splits that small-M launches still fill the GPU
    (None: chosen here)."""
    block_k = block_k or _block_k(group_size, k)
    small = m <= 16
    block_m = block_m or (16 if small else 64)
    block_n = block_n or (64 if small else 128)
    m_tiles, n_tiles, k_tiles = triton.cdiv(m, block_m), triton.cdiv(n, block_n), k // block_k
    if split_k is None:
        split_k = split_k_within(m_tiles * n_tiles, k_tiles, device, 4 if small else 2)
    split_k, k_per_split = split_k_plan(k, block_k, split_k)
    return GemmTiles(block_m, block_n, block_k, m_tiles, n_tiles, split_k, k_per_split)


def _gemm(x2, qweight, scales, zeros, group_size, bits, split_k=None, block_m=None,
          block_n=None, block_k=None, num_warps=None, num_stages=None, reload=False,
          sz_ahead=None):
    m, k = x2.shape
    n = qweight.shape[1]
    block_m, block_n, block_k, m_tiles, n_tiles, split_k, k_per_split = gemm_tiles(
        m, n, k, group_size, x2.device, split_k, block_m, block_n, block_k)
    # Float32 partial sums, added by the last program of each tile (octavo.kernels.split_k).
    out, partial = split_k_buffers(m, n, split_k, x2)
    _int_weight_gemm_kernel[(m_tiles, n_tiles, split_k)](
        x2, qweight, scales, zeros, out, partial,
        split_k_counters(x2.device, m_tiles * n_tiles),
        m, n, k, k_per_split, split_k,
        x2.stride(0), x2.stride(1), qweight.stride(0), qweight.stride(1),
        scales.stride(0), scales.stride(1), zeros.stride(0), zeros.stride(1),
        out.stride(0), out.stride(1), partial.stride(0), partial.stride(1), partial.stride(2),
        GROUP=group_size, BITS=bits, FP32_DOT=x2.dtype == torch.float32,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, RELOAD=bool(reload),
        SZ_AHEAD=envs.int_gemm_sz_ahead() if sz_ahead is None else bool(sz_ahead),
        num_warps=num_warps or 4, num_stages=num_stages or 3,
    )  # fmt: skip
    return out


@triton.jit
def _dequantize_kernel(qw_ptr, s_ptr, z_ptr, w_ptr, N, stride_qk, stride_qn, stride_sg,
                       stride_sn, stride_zg, stride_zn, stride_wk, stride_wn,
                       GROUP: tl.constexpr, BITS: tl.constexpr, BLOCK_P: tl.constexpr,
                       BLOCK_N: tl.constexpr):
    # Grid (K / (BLOCK_P * PACK), N tiles); one program writes BLOCK_P * PACK rows of W.
    PACK: tl.constexpr = 32 // BITS
    MASK: tl.constexpr = (1 << BITS) - 1
    offs_p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    packed = tl.load(qw_ptr + offs_p[:, None] * stride_qk + offs_n[None, :] * stride_qn,
                     mask=n_mask[None, :], other=0)
    offs_j = tl.arange(0, PACK)
    bits = (packed[:, None, :] >> (offs_j * BITS)[None, :, None]) & MASK  # [P, PACK, N]
    q = (bits | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
    g = (offs_p[:, None] * PACK + offs_j[None, :]) // GROUP  # [P, PACK]
    s = tl.load(s_ptr + g[:, :, None] * stride_sg + offs_n[None, None, :] * stride_sn,
                mask=n_mask[None, None, :], other=0.0).to(tl.float32)
    z = tl.load(z_ptr + g[:, :, None] * stride_zg + offs_n[None, None, :] * stride_zn,
                mask=n_mask[None, None, :], other=0.0).to(tl.float32)
    rows = offs_p[:, None] * PACK + offs_j[None, :]
    tl.store(w_ptr + rows[:, :, None] * stride_wk + offs_n[None, None, :] * stride_wn,
             ((q - z) * s).to(w_ptr.dtype.element_ty), mask=n_mask[None, None, :])


def dequantize(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
               group_size: int, bits: int, dtype: torch.dtype, block_p: int = 2,
               block_n: int = 512, num_warps: int = 4, rows_out: bool = False) -> torch.Tensor:
    """The float weight [K, N] in ``dtype``, by a Triton kernel (``dequantize_ref``'s result):
    for large batches, dequantize-then-cuBLAS can beat the fused kernel. Tiles from
    ``benchmarks/quantized_gemm.py --dequant-sweep`` on an H200 (Llama-8B shapes): 2 packed
    rows x 512 columns was the best or within 1% of it on all four, 4- and 8-bit (gate_up
    93.4 -> 83.1 us 4-bit, 117.6 -> 95.2 8-bit against the first 4 x 128).
    ``rows_out``: ``qweight`` is a transposed view of words packed along K within each row
    of N (``int8_gemv.as_along_k``): tiles then run along K (64 packed rows x 16 columns, so
    reads and writes are contiguous), and the result is a [K, N] view of a row-major [N, K]
    weight."""
    require_triton("dequantize")
    pack = pack_factor(bits)
    kp, n = qweight.shape
    if rows_out:
        w = torch.empty(n, kp * pack, device=qweight.device, dtype=dtype).t()
        block_p, block_n = 64, 16
    else:
        w = torch.empty(kp * pack, n, device=qweight.device, dtype=dtype)
    while kp % block_p:  # a power of two dividing the packed rows (1 always does)
        block_p //= 2
    _dequantize_kernel[(triton.cdiv(kp, block_p), triton.cdiv(n, block_n))](
        qweight, scales, zeros, w, n, qweight.stride(0), qweight.stride(1), scales.stride(0),
        scales.stride(1), zeros.stride(0), zeros.stride(1), w.stride(0), w.stride(1),
        GROUP=group_size, BITS=bits, BLOCK_P=block_p, BLOCK_N=block_n, num_warps=num_warps)
    return w
