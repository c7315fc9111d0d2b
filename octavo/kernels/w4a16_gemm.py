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

import os

import torch

from octavo import envs
from octavo.kernels import w4a16_gemv as gemv
from octavo.kernels.split_k import buffers as split_k_buffers
from octavo.kernels.split_k import counters as split_k_counters
from octavo.kernels.split_k import plan as split_k_plan
from octavo.kernels.split_k import store_or_reduce
from octavo.kernels.triton_utils import num_compute_units, require_triton, tl, triton

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


# The weight tile is built transposed, [BLOCK_N, BLOCK_K], each thread holding the PACK values
# of its packed int32s as consecutive K (nested tl.join puts the new dims inside the thread), so
# the tile reaches shared memory in 16-byte stores and the dot reads it K-major; a 3-D reshape
# spreads the values over threads instead (one 2-byte store per weight).
#
# Dequantization (q - z per weight; the scale multiplies the per-K-tile dot result in float32,
# as one K tile lies in one group): on the GPU the integers become floats through magic
# exponents in PTX on packed pairs, here written as (MODE):
#   1: 16-bit: half of 0x43004300 (bf16 128.0) / 0x64006400 (fp16 1024.0) or'd with a 4-bit
#      (or, fp16, 8-bit) value is exactly 128 + q / 1024 + q, and one sub.{bf16,f16}x2 of
#      128 + z / 1024 + z gives q - z exactly (|q - z| <= 256 fits either mantissa).
#   2: bf16 8-bit (128 + q needs 9 bits): prmt puts each byte under 0x4B000000 (2**23 + q in
#      float32), a float32 subtraction of 2**23 + z, and cvt.rn.bf16x2 (exact: an integer of
#      at most 9 bits).
#   0: the same values by plain Triton operations (float32 activations, the CPU interpreter,
#      which cannot run inline assembly).
_DEQ4_16 = """{{
.reg .b32 t0, t1, t2, t3, z;
mov.b32 z, $8;
shr.u32 t1, $4, 4;
shr.u32 t2, $4, 8;
shr.u32 t3, $4, 12;
lop3.b32 t0, $4, 0x000F000F, {magic}, 0xEA;
lop3.b32 t1, t1, 0x000F000F, {magic}, 0xEA;
lop3.b32 t2, t2, 0x000F000F, {magic}, 0xEA;
lop3.b32 t3, t3, 0x000F000F, {magic}, 0xEA;
prmt.b32 $0, t0, t1, 0x5410;
prmt.b32 $1, t2, t3, 0x5410;
prmt.b32 $2, t0, t1, 0x7632;
prmt.b32 $3, t2, t3, 0x7632;
sub.rn.{ty}x2 $0, $0, z;
sub.rn.{ty}x2 $1, $1, z;
sub.rn.{ty}x2 $2, $2, z;
sub.rn.{ty}x2 $3, $3, z;
}}"""
# (t_j holds values j and j + 4 of the int32: the prmt pairs them as j, j + 1 in K order.)
_DEQ8_F16 = """{
.reg .b32 m, z, t0, t1;
mov.b32 z, $4;
mov.b32 m, 0x64006400;
prmt.b32 t0, $2, m, 0x7150;
prmt.b32 t1, $2, m, 0x7352;
sub.rn.f16x2 $0, t0, z;
sub.rn.f16x2 $1, t1, z;
}"""
_DEQ8_BF16 = """{
.reg .b32 m, z, f0, f1, f2, f3;
mov.b32 z, $4;
mov.b32 m, 0x4B000000;
prmt.b32 f0, $2, m, 0x7650;
prmt.b32 f1, $2, m, 0x7651;
prmt.b32 f2, $2, m, 0x7652;
prmt.b32 f3, $2, m, 0x7653;
sub.rn.f32 f0, f0, z;
sub.rn.f32 f1, f1, z;
sub.rn.f32 f2, f2, z;
sub.rn.f32 f3, f3, z;
cvt.rn.bf16x2.f32 $0, f1, f0;
cvt.rn.bf16x2.f32 $1, f3, f2;
}"""
# Kernels read module globals only as constexpr (plain strings where Triton is absent).
_constexpr = tl.constexpr if tl is not None else (lambda v: v)
DEQ4_BF16 = _constexpr(_DEQ4_16.format(magic="0x43004300", ty="bf16"))
DEQ4_F16 = _constexpr(_DEQ4_16.format(magic="0x64006400", ty="f16"))
DEQ8_F16 = _constexpr(_DEQ8_F16)
DEQ8_BF16 = _constexpr(_DEQ8_BF16)
# Operands: 4 outputs, 8 copies of the int32, 4 registers of zero-point pairs (pack 8); 2
# outputs, 4 copies, 2 pairs (f16, pack 4) or 4 float32 zero points (bf16 8-bit, pack 4).
ARGS4_16 = _constexpr("=r,=r,=r,=r,r,r,r,r,r,r,r,r")
ARGS8_F16 = _constexpr("=r,=r,r,r,r,r")
ARGS8_BF16 = _constexpr("=r,=r,r,r,r,r,r,r")


@triton.jit
def _copies(p, BITS: tl.constexpr):
    """``p`` [R, C] int32 -> int16 [R, C, 2, 2(, 2)]: PACK / 2 copies of each int32 as its
    (low, high) halves in one thread's registers, which inline assembly packs into one 32-bit
    register per pair: the int32 again. (Handing over the int32 itself would have Triton take
    the dot operand for a 32-bit conversion and load it in 64-bit pieces, not by ldmatrix.)"""
    lo = p.to(tl.int16)
    hi = (p >> 16).to(tl.int16)
    lo = tl.join(lo, lo)
    hi = tl.join(hi, hi)
    if BITS == 4:
        lo = tl.join(lo, lo)
        hi = tl.join(hi, hi)
    return tl.join(lo, hi)


@triton.jit
def _unpack(p, BITS: tl.constexpr):
    """``p`` [R, C] -> [R, C, 2, 2(, 2)]: value j of each int32 at flat index j of the new dims
    (the last join is the fastest-varying dim)."""
    MASK: tl.constexpr = (1 << BITS) - 1
    if BITS == 4:
        out = tl.join(tl.join(tl.join(p & MASK, (p >> 16) & MASK),
                              tl.join((p >> 8) & MASK, (p >> 24) & MASK)),
                      tl.join(tl.join((p >> 4) & MASK, (p >> 20) & MASK),
                              tl.join((p >> 12) & MASK, (p >> 28) & MASK)))
    else:
        out = tl.join(tl.join(p & MASK, (p >> 16) & MASK), tl.join((p >> 8) & MASK,
                                                                  (p >> 24) & MASK))
    return out


@triton.jit
def _dequant_tile(packed, z, like, BITS: tl.constexpr, MODE: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """``packed`` [BLOCK_N, BLOCK_K / PACK] int32, ``z`` [BLOCK_N] float32 zero points ->
    ``q - z`` [BLOCK_N, BLOCK_K] in ``like``'s dtype (exact), K in natural order."""
    if MODE == 1:
        if like.dtype == tl.bfloat16:
            tl.static_assert(BITS == 4, "bf16 8-bit weights take MODE 2")
            zc = (z + 128.0).to(like.dtype)
            w = tl.inline_asm_elementwise(DEQ4_BF16, ARGS4_16,
                                          [_copies(packed, BITS), zc[:, None, None, None, None]],
                                          dtype=like.dtype, is_pure=True, pack=8)
        elif BITS == 4:
            zc = (z + 1024.0).to(like.dtype)
            w = tl.inline_asm_elementwise(DEQ4_F16, ARGS4_16,
                                          [_copies(packed, BITS), zc[:, None, None, None, None]],
                                          dtype=like.dtype, is_pure=True, pack=8)
        else:
            zc = (z + 1024.0).to(like.dtype)
            w = tl.inline_asm_elementwise(DEQ8_F16, ARGS8_F16,
                                          [_copies(packed, BITS), zc[:, None, None, None]],
                                          dtype=like.dtype, is_pure=True, pack=4)
    elif MODE == 2:
        zc = z + 8388608.0
        w = tl.inline_asm_elementwise(DEQ8_BF16, ARGS8_BF16,
                                      [_copies(packed, BITS), zc[:, None, None, None]],
                                      dtype=like.dtype, is_pure=True, pack=4)
    else:
        # Int -> float through the mantissa of 2**23 (exact); >> is arithmetic on int32, the
        # mask drops the sign bits of the top value.
        q = (_unpack(packed, BITS) | 0x4B000000).to(tl.float32, bitcast=True)
        if BITS == 4:
            w = (q - (z + 8388608.0)[:, None, None, None, None]).to(like.dtype)
        else:
            w = (q - (z + 8388608.0)[:, None, None, None]).to(like.dtype)
    return tl.reshape(w, (BLOCK_N, BLOCK_K))


@triton.jit
def _int_weight_gemm_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, out_ptr, part_ptr, cnt_ptr,
    M, N, K, K_PER_SPLIT, NUM_SPLITS,
    stride_xm, stride_xk, stride_qk, stride_qn, stride_sg, stride_sn,
    stride_zg, stride_zn, stride_om, stride_on, stride_ps, stride_pm, stride_pn,
    GROUP: tl.constexpr, BITS: tl.constexpr, FP32_DOT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    MODE: tl.constexpr,
):  # fmt: skip
    # Grid (M tiles, N tiles, K splits). BLOCK_K divides GROUP, so one K tile lies in one group
    # and needs one row of scales and zeros.
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    PACK: tl.constexpr = 32 // BITS
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_start = pid_k * K_PER_SPLIT
    k_end = tl.minimum(k_start + K_PER_SPLIT, K)
    for k0 in range(k_start, k_end, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk,
                    mask=m_mask[:, None], other=0.0)
        offs_p = k0 // PACK + tl.arange(0, BLOCK_K // PACK)
        packed = tl.load(qw_ptr + offs_n[:, None] * stride_qn + offs_p[None, :] * stride_qk,
                         mask=n_mask[:, None], other=0)
        g = k0 // GROUP
        s = tl.load(s_ptr + g * stride_sg + offs_n * stride_sn, mask=n_mask,
                    other=0.0).to(tl.float32)
        z = tl.load(z_ptr + g * stride_zg + offs_n * stride_zn, mask=n_mask,
                    other=0.0).to(tl.float32)
        w = _dequant_tile(packed, z, a, BITS, MODE, BLOCK_N, BLOCK_K)  # q - z, [N, K]
        if FP32_DOT:
            part = tl.dot(a, tl.trans(w), input_precision="ieee")
        else:
            part = tl.dot(a, tl.trans(w))
        acc += part * s[None, :]
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


def _split_k(m_tiles: int, n_tiles: int, k_tiles: int, device: torch.device,
             waves: int = 2) -> int:
    """Enough K splits that small-M launches still fill the GPU (``waves`` programs per SM)."""
    want = waves * num_compute_units(device)
    return max(1, min(k_tiles, want // max(1, m_tiles * n_tiles), 16))


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
    sweeps (``path``: "gemv" / "gemm" / "dequant" forces a path).
    """
    require_triton("w4a16_gemm")
    shape = x.shape
    k = shape[-1]
    n = qweight.shape[1]
    pack = pack_factor(bits)
    assert qweight.shape[0] * pack == k, (qweight.shape, k, bits)
    assert scales.shape == zeros.shape == (k // group_size, n), (scales.shape, zeros.shape)
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    if m == 0:
        return x.new_empty(*shape[:-1], n)
    path = tuning.pop("path", None)
    if path is None:
        if m <= GEMV_MAX_M and gemv.supports(m, k, group_size, bits):
            path = "gemv"
        else:
            path = "gemm" if m <= envs.int_gemm_fused_max_m(FUSED_MAX_M) else "dequant"
    if path == "gemv":
        out = gemv.w4a16_gemv(x2, qweight, scales, zeros, group_size, bits, split_k=split_k,
                              **tuning)
    elif path == "dequant":
        out = x2 @ dequantize(qweight, scales, zeros, group_size, bits, x.dtype)
    else:
        out = _gemm(x2, qweight, scales, zeros, group_size, bits, split_k, **tuning)
    return out.view(*shape[:-1], n)


def _dequant_mode(x2: torch.Tensor, bits: int) -> int:
    """The kernel's MODE: inline PTX on the GPU (1: 16-bit magic, 2: bf16 8-bit through
    float32), plain Triton for float32 activations and the CPU interpreter (0)."""
    if x2.device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1" \
            or x2.dtype == torch.float32:
        return 0
    return 2 if x2.dtype == torch.bfloat16 and bits == 8 else 1


def _gemm(x2, qweight, scales, zeros, group_size, bits, split_k=None, block_m=None,
          block_n=None, block_k=None, num_warps=None, num_stages=None, reload=None):
    # ``reload`` (each K row reloading its int32) is gone: every tile is built from whole
    # int32s now; the key is still accepted so that older sweep configurations run.
    del reload
    m, k = x2.shape
    n = qweight.shape[1]
    block_k = block_k or _block_k(group_size, k)
    small = m <= 16
    block_m = block_m or (16 if small else 64)
    # 16 x 128 tiles: 3.4 loop instructions per weight in SASS against 4.1 for 16 x 64.
    block_n = block_n or 128
    m_tiles, n_tiles, k_tiles = triton.cdiv(m, block_m), triton.cdiv(n, block_n), k // block_k
    if split_k is None:
        split_k = _split_k(m_tiles, n_tiles, k_tiles, x2.device, waves=4 if small else 2)
    split_k, k_per_split = split_k_plan(k, block_k, split_k)
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
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        MODE=_dequant_mode(x2, bits),
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
               group_size: int, bits: int, dtype: torch.dtype) -> torch.Tensor:
    """The float weight [K, N] in ``dtype``, by a Triton kernel (``dequantize_ref``'s result):
    for large batches, dequantize-then-cuBLAS can beat the fused kernel."""
    require_triton("dequantize")
    pack = pack_factor(bits)
    kp, n = qweight.shape
    w = torch.empty(kp * pack, n, device=qweight.device, dtype=dtype)
    block_p, block_n = 4, 128
    assert kp % block_p == 0 or kp < block_p, kp
    block_p = min(block_p, kp)
    _dequantize_kernel[(triton.cdiv(kp, block_p), triton.cdiv(n, block_n))](
        qweight, scales, zeros, w, n, qweight.stride(0), qweight.stride(1), scales.stride(0),
        scales.stride(1), zeros.stride(0), zeros.stride(1), w.stride(0), w.stride(1),
        GROUP=group_size, BITS=bits, BLOCK_P=block_p, BLOCK_N=block_n)
    return w
