"""Swap-AB weight-only integer GEMM for small batches: ``out^T [N, M] = dequant(W)^T [N, K] @
x^T [K, M]``, so the weight tile is the tensor-core A operand (64 rows per warpgroup, the
wgmma M dimension) and the batch is the small N dimension (16-64), instead of padding the batch
to 16-64 rows of A as ``w4a16_gemm``'s kernel does.

Why this layout: Triton (3.9) feeds wgmma's A operand from registers (the "RS" form) when the
operand is computed from a load by widening or same-width elementwise ops only; then the packed
weights go global -> shared (cp.async) -> registers directly in the operand layout and the
dequantized tile never round-trips through shared memory. A reshape, a join, a narrowing
conversion (int32 -> bf16, f32 -> bf16) or a tensor loaded in another layout (a zero-point
tile) anywhere in that chain makes Triton convert the finished tile through shared memory
instead (one STS + LDS per weight). So:

- the packed weight is read as int16 containers of ``per = 16 // bits`` values packed along
  N (``pack_swapab``): value ``c`` of int16 row ``r`` of a tile is output column
  ``n0 + c * 64 + r``, K contiguous. Shifting the loaded [64, BLOCK_K] int16 tile by
  ``c * bits`` gives the A operand of the c-th 64-row block, so one x^T tile [BLOCK_K, M]
  feeds ``per`` weight dots (and one column-sum dot, below) with no reshape; int16 packed
  along K instead (value c at k = 16 c + j of a 16 * per chunk) needs an x tile and a
  column-sum dot per 16 rows of K (SASS, plain Triton ops: 7.2 instructions per weight
  against 4.1 here);
- the int -> float step is a same-width bitcast through the mantissa (0x4300 | q is bf16
  128 + q for 4-bit; 0x6400 | q is fp16 1024 + q for 4- and 8-bit), for bf16 8-bit
  (0x4300 | q & 127) - (0x4380 ^ q & 128) = q - 128 (two LOP3 and one bf16x2 FMA a pair, as
  ``cuda/swapab_mma.cu``'s bytes()), or a widening int -> float (float32): exact every way;
- zero points and scales stay out of the chain: per group, ``tmp = q @ x^T`` and
  ``xs = ones @ x^T`` (the column sums of x, a second dot on a constant A), then
  ``acc += s * (tmp - z * xs)`` on the [64, BLOCK_M] accumulators only, once per group (or
  per 512 rows of K for longer groups).

``block_r`` 16 or 32 takes a tile of 16 / 32 int16 rows inside a 64-row block of the layout,
one warp per 16 rows: Triton then uses ``mma.sync`` with the A operand from registers the same
way (2.1 SASS instructions per weight, 200 registers for a one-warp program against 242 for
the warpgroup): at one and 16 rows on the H200 it is the faster tiling for the large shapes.

The packed layout differs from ``w4a16_gemm``'s (``pack_along_k``): a quantization method that
wants this path repacks once at load with ``repack_swapab(qweight, bits)`` (or ``pack_swapab``
from the integer values) and calls ``w4a16_gemm(..., path="swapab")`` with that tensor. Needs N
a multiple of 64 * per (256 for 4-bit) and a group a multiple of 16.

SASS for sm_90 (scripts/triton_sass.py, Triton 3.9, 4-bit bf16 g128, 4 warps, batch tile 16,
K step 128, the K-split launch's integer arguments taken as multiples of 16 as a real launch
specializes them): 2.1 loop instructions per weight per thread (the current ``w4a16_gemm``
kernel: 8.1), no STS in the loop (the packed tile arrives by cp.async and LDSM straight into
the operand registers), HGMMA with A from registers, 167 registers, no spills. The dequant is
7 instructions per 8 weights (inline PTX on int16 pairs; the plain Triton ops, which the CPU
interpreter runs, unpack each pair for the shifts: 4.1 per weight in all).
"""

from __future__ import annotations

import math

import torch

from octavo.kernels.pdl import begin as pdl_begin
from octavo.kernels.pdl import launch_args as pdl_args
from octavo.kernels.split_k import buffers as split_k_buffers
from octavo.kernels.split_k import counters as split_k_counters
from octavo.kernels.split_k import plan as split_k_plan
from octavo.kernels.split_k import store_or_reduce
from octavo.kernels.split_k import within as split_k_within
from octavo.kernels.triton_utils import interpreting, require_triton, tl, triton

SUPPORTED_BITS = (4, 8)
ROWS = 64  # int16 rows per tile: the wgmma M of one warpgroup (4 warps)


def _per(bits: int) -> int:
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"the swap-AB GEMM holds {SUPPORTED_BITS}-bit weights, not {bits}")
    return 16 // bits


def pack_swapab(q: torch.Tensor, bits: int) -> torch.Tensor:
    """Integer values [K, N] (0 <= q < 2**bits) -> int16 [N / per, K] (per = 16 // bits values
    per int16, K contiguous): value c of row ``t * ROWS + r`` is output column
    ``n = t * ROWS * per + c * ROWS + r``. N must be a multiple of ROWS * per."""
    per = _per(bits)
    k, n = q.shape
    if n % (ROWS * per):
        raise ValueError(f"N={n} is not a multiple of {ROWS * per} ({bits}-bit swap-AB tiles)")
    v = q.to(torch.int32).t().reshape(n // (ROWS * per), per, ROWS, k)  # [t, c, r, K]
    shifts = (torch.arange(per, device=q.device, dtype=torch.int32) * bits).view(1, per, 1, 1)
    packed = (v << shifts).sum(dim=1)  # [t, r, K]; disjoint bits: the sum is the or
    packed = torch.where(packed >= 2**15, packed - 2**16, packed).to(torch.int16)
    return packed.reshape(n // per, k).contiguous()


def glu_blocked(n: int, block: int, device: torch.device | None = None) -> torch.Tensor:
    """The column order of an MLP's [gate | up] weight (N = 2I) with gate and up in turn,
    ``block`` columns each: new column 2 b block + r is gate column b block + r, and
    2 b block + block + r is up's (``weight[:, glu_blocked(n, block)]``). I must be a multiple
    of ``block``."""
    inter = n // 2
    if n % 2 or inter % block:
        raise ValueError(f"glu_blocked: N={n} is not [gate | up] in blocks of {block}")
    b = torch.arange(inter // block, device=device).view(-1, 1, 1) * block
    r = torch.arange(block, device=device).view(1, 1, -1)
    half = torch.tensor([0, inter], device=device).view(1, 2, 1)
    return (b + half + r).reshape(-1)


def unpack_swapab(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """``pack_swapab``'s int16 [N / per, K] -> integer values [K, N] (int32)."""
    per = _per(bits)
    rows, k = packed.shape
    p = (packed.to(torch.int32) & 0xFFFF).reshape(rows // ROWS, 1, ROWS, k)
    shifts = (torch.arange(per, device=p.device, dtype=torch.int32) * bits).view(1, per, 1, 1)
    q = (p >> shifts) & ((1 << bits) - 1)  # [t, c, r, K]
    return q.reshape(rows * per, k).t().contiguous()


def repack_swapab(qweight: torch.Tensor, bits: int) -> torch.Tensor:
    """``pack_along_k``'s int32 [K / pack, N] -> ``pack_swapab``'s layout (once, at load)."""
    from octavo.kernels.w4a16_gemm import unpack_along_k

    return pack_swapab(unpack_along_k(qweight, bits), bits)


def supports(k: int, n: int, group_size: int, bits: int) -> bool:
    """Whether ``w4a16_swapab`` can run this shape."""
    return bits in SUPPORTED_BITS and n % (ROWS * (16 // bits)) == 0 and group_size % 16 == 0 \
        and k % group_size == 0


def _pair_asm(shift: int, mask: int, magic: int, ty: str | None) -> str:
    """PTX for two int16 containers in one register -> two 16-bit floats: shift, mask under the
    magic exponent (``magic | q`` is exactly ``bias + q``), then subtract the bias (``ty``) or
    leave it for the zero point (None)."""
    src = "$1"
    shr = ""
    if shift:
        shr, src = f"shr.b32 t, $1, {shift}; ", "t"
    if ty is None:
        return f"{{ .reg .b32 t; {shr}lop3.b32 $0, {src}, {mask:#010x}, {magic:#010x}, 0xea; }}"
    return (f"{{ .reg .b32 t, b; {shr}lop3.b32 t, {src}, {mask:#010x}, {magic:#010x}, 0xea; "
            f"mov.b32 b, {magic:#010x}; sub.rn.{ty}x2 $0, t, b; }}")


def _byte_bf16_asm(shift: int) -> str:
    """PTX for two int16 containers in one register -> their byte at ``shift`` as two bf16
    q - 128: lo = 0x4300 | (q & 127) is 128 + (q & 127), y = 0x4380 ^ (q & 128) is 256 for
    q < 128 and 128 above, and lo - y (one bf16x2 FMA, exact: integers of at most 8
    significant bits) is q - 128 either way."""
    src = "$1"
    shr = ""
    if shift:
        shr, src = f"shr.b32 t, $1, {shift}; ", "t"
    return (f"{{ .reg .b32 t, l, y, m; {shr}lop3.b32 l, {src}, 0x007f007f, 0x43004300, 0xea; "
            f"lop3.b32 y, {src}, 0x00800080, 0x43804380, 0x6a; mov.b32 m, 0xbf80bf80; "
            f"fma.rn.bf16x2 $0, y, m, l; }}")


# Kernels read module globals only as constexpr (plain strings where Triton is absent).
_constexpr = tl.constexpr if tl is not None else (lambda v: v)
# bf16 4-bit: 0x4300 | q = 128 + q (bias kept); fp16 4- and 8-bit: 0x6400 | q = 1024 + q.
BF16_4 = [_constexpr(_pair_asm(c * 4, 0x000F000F, 0x43004300, None)) for c in range(4)]
F16_4 = [_constexpr(_pair_asm(c * 4, 0x000F000F, 0x64006400, "f16")) for c in range(4)]
F16_8 = [_constexpr(_pair_asm(c * 8, 0x00FF00FF, 0x64006400, "f16")) for c in range(2)]
# bf16 8-bit: q - 128 (the bias goes into the zero point, ZBIAS).
BF16_8 = [_constexpr(_byte_bf16_asm(c * 8)) for c in range(2)]
BF16_4_0, BF16_4_1, BF16_4_2, BF16_4_3 = BF16_4
F16_4_0, F16_4_1, F16_4_2, F16_4_3 = F16_4
F16_8_0, F16_8_1 = F16_8
BF16_8_0, BF16_8_1 = BF16_8


@triton.jit
def _asm_bf16(p, code: tl.constexpr):
    return tl.inline_asm_elementwise(code, "=r,r", [p], dtype=tl.bfloat16, is_pure=True, pack=2)


@triton.jit
def _asm_f16(p, code: tl.constexpr):
    return tl.inline_asm_elementwise(code, "=r,r", [p], dtype=tl.float16, is_pure=True, pack=2)


@triton.jit
def _dequant(p, c: tl.constexpr, BITS: tl.constexpr, MAGIC: tl.constexpr, ASM: tl.constexpr,
             dt: tl.constexpr):
    """Value ``c`` of each int16 of ``p`` as ``dt`` (exact; same-width or widening ops only, so
    Triton keeps the chain in the dot operand's register layout). ASM: the same values by
    inline PTX on register pairs (the Triton ops unpack the int16 pairs for the shifts)."""
    if ASM and MAGIC == 1:
        if c == 0:
            w = _asm_bf16(p, BF16_4_0)
        elif c == 1:
            w = _asm_bf16(p, BF16_4_1)
        elif c == 2:
            w = _asm_bf16(p, BF16_4_2)
        else:
            w = _asm_bf16(p, BF16_4_3)
    elif ASM and MAGIC == 2 and BITS == 4:
        if c == 0:
            w = _asm_f16(p, F16_4_0)
        elif c == 1:
            w = _asm_f16(p, F16_4_1)
        elif c == 2:
            w = _asm_f16(p, F16_4_2)
        else:
            w = _asm_f16(p, F16_4_3)
    elif ASM and MAGIC == 2:
        if c == 0:
            w = _asm_f16(p, F16_8_0)
        else:
            w = _asm_f16(p, F16_8_1)
    elif ASM and MAGIC == 3:
        if c == 0:
            w = _asm_bf16(p, BF16_8_0)
        else:
            w = _asm_bf16(p, BF16_8_1)
    else:
        bits = (p >> (c * BITS)) & ((1 << BITS) - 1)
        if MAGIC == 1:
            w = (bits | 0x4300).to(tl.bfloat16, bitcast=True)  # 128 + q, see ZBIAS
        elif MAGIC == 2:
            w = (bits | 0x6400).to(tl.float16, bitcast=True) - 1024.0
        elif MAGIC == 3:
            w = (bits - 128).to(dt)  # q - 128, see ZBIAS
        else:
            w = bits.to(dt)
    return w


@triton.jit
def _mma(a, b, acc, dt: tl.constexpr):
    if dt == tl.float32:
        acc = tl.dot(a, b, acc, input_precision="ieee")
    else:
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def _load_sz(s_ptr, z_ptr, g, offs_n, stride_sg, stride_sn, stride_zg, stride_zn,
             ZBIAS: tl.constexpr):
    """The scales and (biased) zero points of group ``g`` for columns ``offs_n``, as float32."""
    s = tl.load(s_ptr + g * stride_sg + offs_n * stride_sn).to(tl.float32)
    z = tl.load(z_ptr + g * stride_zg + offs_n * stride_zn).to(tl.float32) + ZBIAS
    return s, z


@triton.jit
def _load_sz_all(s_ptr, z_ptr, g, offs_n0, stride_sg, stride_sn, stride_zg, stride_zn,
                 ZBIAS: tl.constexpr, PER: tl.constexpr, LAYOUT_ROWS: tl.constexpr):
    """Group ``g``'s scales and zero points for the tile's PER column blocks (value c of the
    int16 rows: columns ``offs_n0 + c * LAYOUT_ROWS``; 8-bit tiles have two: the last two
    pairs repeat the first)."""
    s0, z0 = _load_sz(s_ptr, z_ptr, g, offs_n0, stride_sg, stride_sn, stride_zg, stride_zn,
                      ZBIAS)
    s1, z1 = _load_sz(s_ptr, z_ptr, g, offs_n0 + LAYOUT_ROWS, stride_sg, stride_sn, stride_zg,
                      stride_zn, ZBIAS)
    if PER == 4:
        s2, z2 = _load_sz(s_ptr, z_ptr, g, offs_n0 + 2 * LAYOUT_ROWS, stride_sg, stride_sn,
                          stride_zg, stride_zn, ZBIAS)
        s3, z3 = _load_sz(s_ptr, z_ptr, g, offs_n0 + 3 * LAYOUT_ROWS, stride_sg, stride_sn,
                          stride_zg, stride_zn, ZBIAS)
    else:
        s2, z2, s3, z3 = s0, z0, s1, z1
    return s0, z0, s1, z1, s2, z2, s3, z3


@triton.jit
def _fold_all(acc0, acc1, acc2, acc3, xs, tmp0, tmp1, tmp2, tmp3, s0, z0, s1, z1, s2, z2, s3,
              z3, PER: tl.constexpr):
    """Fold the partial sums of every 64-row block into its accumulator,
    ``acc += s * (tmp - (ZBIAS + z) * xs)`` (``tmp = (ZBIAS + q) @ x^T``, ``xs = ones @ x^T``),
    and zero the partials."""
    acc0 += s0[:, None] * (tmp0 - z0[:, None] * xs)
    acc1 += s1[:, None] * (tmp1 - z1[:, None] * xs)
    if PER == 4:
        acc2 += s2[:, None] * (tmp2 - z2[:, None] * xs)
        acc3 += s3[:, None] * (tmp3 - z3[:, None] * xs)
    zero = tl.zeros_like(xs)
    return acc0, acc1, acc2, acc3, zero, zero, zero, zero, zero


@triton.jit
def _fold_step(acc0, acc1, acc2, acc3, xs, tmp0, tmp1, tmp2, tmp3, s0, z0, s1, z1, s2, z2, s3,
               z3, s_ptr, z_ptr, k_next, k_end, offs_n0, stride_sg, stride_sn, stride_zg,
               stride_zn, GROUP: tl.constexpr, ZBIAS: tl.constexpr, PER: tl.constexpr,
               LAYOUT_ROWS: tl.constexpr):
    """End a fold, then load the next fold's scales and zero points (the fold starting at row
    ``k_next``; past the split's end the last group again, a harmless unmasked reload)."""
    acc0, acc1, acc2, acc3, xs, tmp0, tmp1, tmp2, tmp3 = _fold_all(
        acc0, acc1, acc2, acc3, xs, tmp0, tmp1, tmp2, tmp3, s0, z0, s1, z1, s2, z2, s3, z3, PER)
    g_next = tl.minimum(k_next, k_end - 1) // GROUP
    s0, z0, s1, z1, s2, z2, s3, z3 = _load_sz_all(
        s_ptr, z_ptr, g_next, offs_n0, stride_sg, stride_sn, stride_zg, stride_zn, ZBIAS, PER,
        LAYOUT_ROWS)
    return acc0, acc1, acc2, acc3, xs, tmp0, tmp1, tmp2, tmp3, s0, z0, s1, z1, s2, z2, s3, z3


@triton.jit
def _store(acc, offs_n, offs_m, m_mask, out_ptr, part_ptr, cnt_ptr, stride_om, stride_on,
           stride_ps, stride_pm, stride_pn, tile, pid_k, NUM_SPLITS):
    # acc is out^T: store_or_reduce with the roles of M and N swapped (N is whole tiles).
    store_or_reduce(acc, offs_n, offs_m, (offs_n >= 0)[:, None] & m_mask[None, :], out_ptr,
                    stride_on, stride_om, part_ptr, stride_ps, stride_pn, stride_pm, cnt_ptr,
                    tile, pid_k, NUM_SPLITS)


@triton.jit
def _swapab_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, out_ptr, part_ptr, cnt_ptr,
    M, K, K_PER_SPLIT, NUM_SPLITS,
    stride_xm, stride_xk, stride_qr, stride_sg, stride_sn, stride_zg, stride_zn,
    stride_om, stride_on, stride_ps, stride_pm, stride_pn,
    GROUP: tl.constexpr, FOLD: tl.constexpr, BITS: tl.constexpr, MAGIC: tl.constexpr,
    ASM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
    LAYOUT_ROWS: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    # Grid (N / (BLOCK_R * PER) tiles, M tiles, K splits). qw_ptr: int16 [N / PER, K], K
    # contiguous; value c of int16 row r of the tile is output row n0 + c * LAYOUT_ROWS + r. One
    # x^T tile [BLOCK_K, BLOCK_M] feeds PER weight dots and one column-sum dot; the partial
    # sums are folded into the accumulators every FOLD rows of K (FOLD divides GROUP).
    pid_t = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    PER: tl.constexpr = 16 // BITS
    # bf16 4-bit operands hold 128 + q, bf16 8-bit ones q - 128 (the bias is folded with the
    # zero point: one instruction per weight less); fp16 ones subtract 1024 exactly in the
    # chain.
    ZBIAS: tl.constexpr = 128.0 if MAGIC == 1 else (-128.0 if MAGIC == 3 else 0.0)
    dt: tl.constexpr = x_ptr.dtype.element_ty
    offs_r = pid_t * BLOCK_R + tl.arange(0, BLOCK_R)  # int16 rows
    # A tile of BLOCK_R int16 rows lies inside one LAYOUT_ROWS block of the packed layout
    # (BLOCK_R divides it): its value c is output column base + c * LAYOUT_ROWS + r.
    SUB: tl.constexpr = LAYOUT_ROWS // BLOCK_R
    offs_n0 = ((pid_t // SUB) * LAYOUT_ROWS * PER + (pid_t % SUB) * BLOCK_R
               + tl.arange(0, BLOCK_R))
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_kk = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    ones = tl.full((BLOCK_R, BLOCK_K), 1.0, dt)
    acc0 = tl.zeros((BLOCK_R, BLOCK_M), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_R, BLOCK_M), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_R, BLOCK_M), dtype=tl.float32)
    acc3 = tl.zeros((BLOCK_R, BLOCK_M), dtype=tl.float32)
    k_start = pid_k * K_PER_SPLIT
    k_end = tl.minimum(k_start + K_PER_SPLIT, K)
    xs = tl.zeros((BLOCK_R, BLOCK_M), dtype=tl.float32)
    tmp0 = tl.zeros((BLOCK_R, BLOCK_M), dtype=tl.float32)
    tmp1 = tl.zeros((BLOCK_R, BLOCK_M), dtype=tl.float32)
    tmp2 = tl.zeros((BLOCK_R, BLOCK_M), dtype=tl.float32)
    tmp3 = tl.zeros((BLOCK_R, BLOCK_M), dtype=tl.float32)
    # The first fold's scales and zero points (written by no kernel of the step) before the
    # PDL wait; each later fold's right after the previous fold, a whole step of dots ahead of
    # their use (Triton 3.9's pipeliner does this by itself; written out so that it does not
    # depend on the version).
    s0, z0, s1, z1, s2, z2, s3, z3 = _load_sz_all(
        s_ptr, z_ptr, k_start // GROUP, offs_n0, stride_sg, stride_sn, stride_zg, stride_zn,
        ZBIAS, PER, LAYOUT_ROWS)
    pdl_begin(PDL)
    # One flat loop (a nested loop per fold is pipelined only within the fold: no prefetch
    # across folds).
    for k0 in range(k_start, k_end, BLOCK_K):
        # Aligned k0: 16-byte loads, pipelined by cp.async.
        offs_k = tl.multiple_of(k0, BLOCK_K) + offs_kk
        p = tl.load(qw_ptr + offs_r[:, None] * stride_qr + offs_k[None, :])
        xt = tl.load(x_ptr + offs_k[:, None] * stride_xk + offs_m[None, :] * stride_xm,
                     mask=m_mask[None, :], other=0.0)
        xs = _mma(ones, xt, xs, dt)
        tmp0 = _mma(_dequant(p, 0, BITS, MAGIC, ASM, dt), xt, tmp0, dt)
        tmp1 = _mma(_dequant(p, 1, BITS, MAGIC, ASM, dt), xt, tmp1, dt)
        if PER == 4:
            tmp2 = _mma(_dequant(p, 2, BITS, MAGIC, ASM, dt), xt, tmp2, dt)
            tmp3 = _mma(_dequant(p, 3, BITS, MAGIC, ASM, dt), xt, tmp3, dt)
        if FOLD == BLOCK_K:  # every step ends a fold: no select over the fold's values
            acc0, acc1, acc2, acc3, xs, tmp0, tmp1, tmp2, tmp3, s0, z0, s1, z1, s2, z2, s3, z3 = \
                _fold_step(acc0, acc1, acc2, acc3, xs, tmp0, tmp1, tmp2, tmp3, s0, z0, s1, z1,
                           s2, z2, s3, z3, s_ptr, z_ptr, k0 + BLOCK_K, k_end, offs_n0,
                           stride_sg, stride_sn, stride_zg, stride_zn, GROUP, ZBIAS, PER,
                           LAYOUT_ROWS)
        elif (k0 + BLOCK_K) % FOLD == 0:
            acc0, acc1, acc2, acc3, xs, tmp0, tmp1, tmp2, tmp3, s0, z0, s1, z1, s2, z2, s3, z3 = \
                _fold_step(acc0, acc1, acc2, acc3, xs, tmp0, tmp1, tmp2, tmp3, s0, z0, s1, z1,
                           s2, z2, s3, z3, s_ptr, z_ptr, k0 + BLOCK_K, k_end, offs_n0,
                           stride_sg, stride_sn, stride_zg, stride_zn, GROUP, ZBIAS, PER,
                           LAYOUT_ROWS)
    tile = (pid_m * tl.num_programs(0) + pid_t) * PER
    _store(acc0, offs_n0, offs_m, m_mask, out_ptr, part_ptr, cnt_ptr, stride_om, stride_on,
           stride_ps, stride_pm, stride_pn, tile, pid_k, NUM_SPLITS)
    _store(acc1, offs_n0 + LAYOUT_ROWS, offs_m, m_mask, out_ptr, part_ptr, cnt_ptr, stride_om,
           stride_on, stride_ps, stride_pm, stride_pn, tile + 1, pid_k, NUM_SPLITS)
    if PER == 4:
        _store(acc2, offs_n0 + 2 * LAYOUT_ROWS, offs_m, m_mask, out_ptr, part_ptr, cnt_ptr,
               stride_om, stride_on, stride_ps, stride_pm, stride_pn, tile + 2, pid_k,
               NUM_SPLITS)
        _store(acc3, offs_n0 + 3 * LAYOUT_ROWS, offs_m, m_mask, out_ptr, part_ptr, cnt_ptr,
               stride_om, stride_on, stride_ps, stride_pm, stride_pn, tile + 3, pid_k,
               NUM_SPLITS)


def _magic(dtype: torch.dtype, bits: int) -> int:
    """The operand form: 1 bf16 4-bit (128 + q), 2 fp16 (q), 3 bf16 8-bit (q - 128; before
    session 61 a widening int16 -> bf16 conversion per weight), 0 float32 (q)."""
    if dtype == torch.bfloat16:
        return 1 if bits == 4 else 3
    if dtype == torch.float16:
        return 2
    return 0


def _fold_rows(group_size: int) -> int:
    """K rows summed before each fold into the accumulators: the group, or a divisor of it
    for long groups (one group over all of K), so that K splits stay possible."""
    return group_size if group_size <= 512 else math.gcd(group_size, 512)


def w4a16_swapab(x2: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                 zeros: torch.Tensor, group_size: int, bits: int = 4,
                 split_k: int | None = None, block_m: int | None = None,
                 block_k: int | None = None, num_stages: int | None = None,
                 waves: int = 4, maxnreg: int | None = None,
                 block_r: int | None = None) -> torch.Tensor:
    """``x2 [M, K] @ dequant(W) [K, N]`` with ``qweight`` in ``pack_swapab``'s layout (int16
    [N / per, K]), in x2's dtype (float32 accumulation). ``block_m``: batch columns per program
    (the MMA's N: 16-64, or 8 on mma.sync); ``block_k``: K per step (16-128, dividing the
    group); ``block_r``: int16 rows per program (64: one warpgroup's wgmma; 16 or 32: one warp
    per 16 rows on ``mma.sync``, fewer registers per program)."""
    require_triton("w4a16_swapab")
    m, k = x2.shape
    per = _per(bits)
    n = qweight.shape[0] * per
    assert qweight.dtype == torch.int16 and qweight.shape[1] == k, (qweight.shape, k)
    assert scales.shape == zeros.shape == (k // group_size, n), (scales.shape, zeros.shape)
    if not supports(k, n, group_size, bits):
        raise ValueError(f"the swap-AB GEMM cannot run K={k}, N={n}, group {group_size}")
    # 16 or 32 batch columns (a 64-column tile takes 255 registers at 3.7 instructions per
    # weight in SASS against 2.1 / 2.4): more M tiles re-read the weight tile from L2.
    block_m = block_m or (16 if m <= 16 else 32)
    fold = _fold_rows(group_size)
    block_k = block_k or math.gcd(fold, 128)
    assert fold % block_k == 0 and block_k % 16 == 0, (group_size, block_k)
    block_r = block_r or ROWS
    assert ROWS % block_r == 0 and block_r % 16 == 0, block_r
    m_tiles, n_tiles = triton.cdiv(m, block_m), n // (block_r * per)
    if split_k is None:
        split_k = split_k_within(m_tiles * n_tiles, k // fold, x2.device, waves)
    split_k, k_per_split = split_k_plan(k, fold, split_k)
    out, partial = split_k_buffers(m, n, split_k, x2)
    _swapab_kernel[(n_tiles, m_tiles, split_k)](
        x2, qweight, scales, zeros, out, partial,
        split_k_counters(x2.device, m_tiles * n_tiles * per),
        m, k, k_per_split, split_k,
        x2.stride(0), x2.stride(1), qweight.stride(0), scales.stride(0), scales.stride(1),
        zeros.stride(0), zeros.stride(1), out.stride(0), out.stride(1),
        partial.stride(0), partial.stride(1), partial.stride(2),
        GROUP=group_size, FOLD=fold, BITS=bits, MAGIC=_magic(x2.dtype, bits),
        ASM=not interpreting(),
        BLOCK_M=block_m, BLOCK_R=block_r, BLOCK_K=block_k, LAYOUT_ROWS=ROWS,
        num_warps=block_r // 16,
        num_stages=num_stages or 3, **pdl_args(x2.device),
        **({"maxnreg": maxnreg} if maxnreg else {}),
    )  # fmt: skip
    return out


@triton.jit
def _dequantize_kernel(
    qw_ptr, s_ptr, z_ptr, w_ptr, K,
    stride_qr, stride_sg, stride_sn, stride_zg, stride_zn, stride_wn,
    GROUP: tl.constexpr, BITS: tl.constexpr, ROWS: tl.constexpr, BLOCK_K: tl.constexpr,
    ONE_GROUP: tl.constexpr,
):  # fmt: skip
    # Grid (N / (ROWS * PER) layout blocks, K tiles): one block's int16 rows [ROWS, BLOCK_K]
    # become PER row blocks of the float weight's transpose [N, K]: K contiguous in and out,
    # so the stores are as coalesced as the loads.
    pid_t = tl.program_id(0)
    pid_k = tl.program_id(1)
    PER: tl.constexpr = 16 // BITS
    offs_r = tl.arange(0, ROWS)
    offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    k_mask = offs_k[None, :] < K
    p = tl.load(qw_ptr + (pid_t * ROWS + offs_r)[:, None] * stride_qr + offs_k[None, :],
                mask=k_mask, other=0).to(tl.int32)
    for c in tl.static_range(PER):
        n = pid_t * ROWS * PER + c * ROWS + offs_r
        q = ((p >> (c * BITS)) & ((1 << BITS) - 1)).to(tl.float32)
        if ONE_GROUP:  # the tile lies in one group: one scale and zero point per row
            g = pid_k * BLOCK_K // GROUP
            s = tl.load(s_ptr + g * stride_sg + n * stride_sn).to(tl.float32)[:, None]
            z = tl.load(z_ptr + g * stride_zg + n * stride_zn).to(tl.float32)[:, None]
        else:
            g = (offs_k // GROUP)[None, :]
            s = tl.load(s_ptr + g * stride_sg + n[:, None] * stride_sn, mask=k_mask,
                        other=0.0).to(tl.float32)
            z = tl.load(z_ptr + g * stride_zg + n[:, None] * stride_zn, mask=k_mask,
                        other=0.0).to(tl.float32)
        w = (q - z) * s
        tl.store(w_ptr + n[:, None] * stride_wn + offs_k[None, :],
                 w.to(w_ptr.dtype.element_ty), mask=k_mask)


def dequantize_swapab(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                      group_size: int, bits: int, dtype: torch.dtype, block_k: int = 128,
                      num_warps: int = 8) -> torch.Tensor:
    """The float weight [K, N] in ``dtype`` from ``pack_swapab``'s layout (computed in float32,
    rounded once, as ``w4a16_gemm.dequantize_ref``), for batches too large for the swap-AB
    GEMM: dequantize, then cuBLAS. Returned as the transpose of a K-contiguous [N, K] tensor
    (the layout of a torch Linear's weight, which cuBLAS reads as fast): the kernel then
    writes along K as it reads (H200, 4-bit gate_up with cuBLAS at 128 rows: 197.6 -> 163.0
    us). Tiles from ``quantized_gemm.py --dequant-sweep``: 8 warps for the 64 x 128 tile was
    the best or within 4% of it on the Llama-8B shapes (gate_up 90.3 -> 85.3 us)."""
    require_triton("dequantize_swapab")
    per = _per(bits)
    rows, k = qweight.shape
    n = rows * per
    w = torch.empty(n, k, device=qweight.device, dtype=dtype)
    one_group = group_size % block_k == 0 and k % block_k == 0
    _dequantize_kernel[(rows // ROWS, triton.cdiv(k, block_k))](
        qweight, scales, zeros, w, k, qweight.stride(0), scales.stride(0), scales.stride(1),
        zeros.stride(0), zeros.stride(1), w.stride(0),
        GROUP=group_size, BITS=bits, ROWS=ROWS, BLOCK_K=block_k, ONE_GROUP=one_group,
        num_warps=num_warps)
    return w.t()
