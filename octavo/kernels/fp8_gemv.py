"""FP8 (e4m3) weights times bf16/fp16 activations for decode batches (M = 1..2), on CUDA cores:
``y[m, n] = scale[n] * sum_k x[m, k] * w[n, k]``, the weight in its checkpoint layout
([N, K] row-major, K contiguous) with one float32 scale per output row.

At batch 1 the FP8 tensor-core path (``torch._scaled_mm``) pays for quantizing the activations
(an amax, a divide, a cast: extra launches) and pads M to a tile, so it decodes slower than
bf16 although it reads half the bytes. Here the activations stay in their dtype (one rounding
fewer than W8A8) and every product is a float32 FMA of the exact weight value.

The kernel is bound by instructions per weight, not by the FMA itself, so the conversion is
what it is built around. The weight is read as int32 words (4 weights each, a view of the same
storage), and each word becomes 4 float32 with no byte shuffling: ``_e4m3x4_cvt`` (the
default on CUDA; sm_89+, like the FP8 layers that call this) takes each half-word through one
``cvt.rn.f16x2.e4m3x2`` and each half through a f16 -> f32 conversion (6 instructions per 4
weights); ``_e4m3x4_bits`` (the Triton interpreter, which runs no inline assembly; also a
tuning option) places the bits with integer ops (11 per 4). Triton's own ``w.to(tl.float32)``
on an fp8 tensor repacks every byte pair before its cvt (about 4 instructions per weight). The
4 weights of a word meet the 4 activations ``x[4j .. 4j + 3]`` ("planes" of the activation
block), each plane accumulating into one float32 per word: a quarter of the accumulator
registers of one per weight. bf16 activations are read the same way, as int64 words of 4
split by bit placement (``_x_planes``; 80 registers at 32 x 256 over 4 warps where a split
[BLOCK_W, 4] tile took 130 in Triton 3.9).

The next step's weights are loaded before this step's arithmetic (double-buffered by hand; the
loop is unrolled twice so that the buffers swap without register copies), and K is split over
programs only as far as needed to fill the GPU; the last program of each tile adds the partial
sums (``octavo.kernels.split_k``).
"""

from __future__ import annotations

import torch

from octavo.envs import fp8_gemv_stages
from octavo.kernels.pdl import begin as pdl_begin
from octavo.kernels.pdl import launch_args as pdl_args
from octavo.kernels.qkv_rope_store import inputs_supported as rope_inputs_supported
from octavo.kernels.qkv_rope_store import rope_rows, rope_store
from octavo.kernels.split_k import buffers as split_k_buffers
from octavo.kernels.split_k import counters as split_k_counters
from octavo.kernels.split_k import plan as split_k_plan
from octavo.kernels.split_k import store_or_reduce
from octavo.kernels.split_k import to_fill as split_k_to_fill
from octavo.kernels.triton_utils import require_triton, tl, triton
from octavo.kernels.w4a16_gemv import _byte_value

# How the activations are read (``_x_planes``); 0 was the only way before session 27.
DEFAULT_X_LOAD = 2
MAX_M = 2  # at 4 rows _scaled_mm was faster on the wide shapes (gate_up 65 vs 123 us)
SMALLEST_STEP = 32  # K per step at the least (BLOCK_K) where scales come in groups of K

# _e4m3x4_bits yields weight * 2**-120 (down to 2**-129, a float32 subnormal); the activations
# take 2**64 and the row scale 2**56, so a product is w * x * 2**-56: still a normal float32
# (rounded once, as in the reference) for |w * x| >= 2**-70, e.g. the smallest weight 2**-9
# times x = 1e-3, and finite for |x| < 2**64.
BITS_X_SCALE = tl.constexpr(2.0**64)
BITS_OUT_SCALE = tl.constexpr(2.0**56)


@triton.jit
def _e4m3x4_cvt(w):
    """The 4 e4m3 bytes of each int32 word (byte i = weight 4j + i), as float32: exact
    (e4m3 -> f16 -> f32); the NaN codes (0x7F, 0xFF) give NaN."""
    return tl.inline_asm_elementwise(
        """{
        .reg .b16 lo, hi;
        .reg .b32 h01, h23;
        .reg .f16 h0, h1, h2, h3;
        mov.b32 {lo, hi}, $4;
        cvt.rn.f16x2.e4m3x2 h01, lo;
        cvt.rn.f16x2.e4m3x2 h23, hi;
        mov.b32 {h0, h1}, h01;
        mov.b32 {h2, h3}, h23;
        cvt.f32.f16 $0, h0;
        cvt.f32.f16 $1, h1;
        cvt.f32.f16 $2, h2;
        cvt.f32.f16 $3, h3;
        }""",
        "=r,=r,=r,=r,r", [w], dtype=(tl.float32, tl.float32, tl.float32, tl.float32),
        is_pure=True, pack=1)


@triton.jit
def _e4m3_bits(w, SHIFT: tl.constexpr):
    # The byte moved to the top (sign at bit 31), shifted right by 4 with the sign copied into
    # bits 27..30, those masked off: float32 bits (b & 0x80) << 24 | (b & 0x7F) << 20.
    return (((w << SHIFT) >> 4) & -0x78100000).to(tl.float32, bitcast=True)  # 0x87F00000


@triton.jit
def _e4m3x4_bits(w):
    """The 4 e4m3 bytes of each int32 word as float32, times 2**-120, by placing bits: the
    e4m3 exponent field becomes the low 4 bits of float32's (bias 127 = 7 + 120) and an e4m3
    subnormal (exponent 0) a float32 subnormal of the same scale, so every value is exact as
    long as nothing flushes subnormals (the smallest, 2**-9, is 2**-129 here). The NaN codes
    (0x7F, 0xFF) turn into finite numbers (+-480 * 2**-120): checkpoint weights hold no NaN."""
    return _e4m3_bits(w, 24), _e4m3_bits(w, 16), _e4m3_bits(w, 8), _e4m3_bits(w, 0)


@triton.jit
def _u8_prmt(w, BASE_BITS, j: tl.constexpr, EXACT: tl.constexpr):
    """Byte ``j`` of each int32 word placed in a float by one PRMT: EXACT, as the low byte of
    2**23's bits (BASE_BITS 0x4B000000: the float 2**23 + q); else at bits 8-15 of 1.0f's
    (BASE_BITS 0x3F800000: 1 + q * 2**-15, the along-K 8-bit GEMV's ``_byte_value``). Both
    exact."""
    if not EXACT:
        return _byte_value(w, BASE_BITS, j).to(tl.float32, bitcast=True)
    if j == 0:
        code: tl.constexpr = "prmt.b32 $0, $1, $2, 0x7650;"
    elif j == 1:
        code: tl.constexpr = "prmt.b32 $0, $1, $2, 0x7651;"
    elif j == 2:
        code: tl.constexpr = "prmt.b32 $0, $1, $2, 0x7652;"
    else:
        code: tl.constexpr = "prmt.b32 $0, $1, $2, 0x7653;"
    return tl.inline_asm_elementwise(code, "=r,r,r", [w, BASE_BITS], dtype=tl.int32,
                                     is_pure=True, pack=1).to(tl.float32, bitcast=True)


@triton.jit
def _u8_shift(w, BASE_BITS, j: tl.constexpr, EXACT: tl.constexpr):
    """``_u8_prmt``'s float by a shift and a mask-or (the interpreter runs no assembly)."""
    if EXACT:
        v = (w >> (8 * j)) & 0xFF
    elif j == 0:
        v = (w << 8) & 0xFF00
    else:
        v = (w >> (8 * (j - 1))) & 0xFF00
    return (v | BASE_BITS).to(tl.float32, bitcast=True)


@triton.jit
def _u8x4(w, BASE_BITS, ASM: tl.constexpr, EXACT: tl.constexpr):
    """The 4 bytes of each int32 word (byte i = weight 4j + i, an unsigned 8-bit q) as
    float32: ``2**23 + q`` (EXACT) or ``1 + q * 2**-15``, one PRMT each (``ASM``)."""
    if ASM:
        return (_u8_prmt(w, BASE_BITS, 0, EXACT), _u8_prmt(w, BASE_BITS, 1, EXACT),
                _u8_prmt(w, BASE_BITS, 2, EXACT), _u8_prmt(w, BASE_BITS, 3, EXACT))
    return (_u8_shift(w, BASE_BITS, 0, EXACT), _u8_shift(w, BASE_BITS, 1, EXACT),
            _u8_shift(w, BASE_BITS, 2, EXACT), _u8_shift(w, BASE_BITS, 3, EXACT))


@triton.jit
def _group_consts(s_ptr, z_ptr, zero, rows, n_mask, word, stride_sg, stride_sn, stride_zg,
                  stride_zn, GROUP: tl.constexpr, HAS_Z: tl.constexpr, EXACT: tl.constexpr,
                  ROW_BLOCK: tl.constexpr = 1):
    """U8: the [BLOCK_N, 1] factors of the group holding K word ``word`` (a step lies in one
    group), the zero ``z`` a tensor [G, N] (HAS_Z) or the one number ``zero``. EXACT:
    (s, 2**23 + z), the step adding s sum x ((2**23 + q) - (2**23 + z)); else
    (s * 2**15, s * (2**15 + z)), the step adding s 2**15 sum x (1 + q 2**-15) -
    s (2**15 + z) sum x = s (sum x q - z sum x). Block-scaled FP8 (U8 = 3) takes the EXACT
    pair and reads only s. ROW_BLOCK: one scale per that many rows (block-scaled FP8: row
    ``rows // ROW_BLOCK`` of the scales)."""
    g = (word * 4) // GROUP
    if ROW_BLOCK > 1:
        rows = rows // ROW_BLOCK
    s = tl.load(s_ptr + g * stride_sg + rows * stride_sn, mask=n_mask, other=0.0).to(tl.float32)
    if HAS_Z:
        z = tl.load(z_ptr + g * stride_zg + rows * stride_zn, mask=n_mask,
                    other=0.0).to(tl.float32)
    else:
        z = zero
    if EXACT:
        return s[:, None], (8388608.0 + z + s * 0.0)[:, None]
    return (s * 32768.0)[:, None], (s * (32768.0 + z))[:, None]


@triton.jit
def _x_planes(x_ptr, offs_w, w_end, stride_xk, BITS: tl.constexpr, X_LOAD: tl.constexpr):
    """x[4j + i] for the block's words j, as 4 float32 planes i = 0..3 (times 2**64 for
    _e4m3x4_bits), each [1, BLOCK_W]. X_LOAD picks how they are read:

    * 0: one [BLOCK_W, 4] load split in registers. Triton routes the split through shared
      memory, with barriers in the hot loop (the loop of session 21's ncu run: barrier
      stalls 1.47 per instruction) and 130 registers at 32 x 256 over 4 warps.
    * 1: four strided loads (x is tiny and stays in L1); no barrier, 98 registers.
    * 2: x (bf16, contiguous) read as int64 words, 4 activations each, and split by bit
      placement (bf16 is the top half of a float32): one load and 4 integer ops per word.
      ``x_ptr`` then points at the int64 view of x.
    """
    ok = offs_w < w_end
    if X_LOAD == 2:
        v = tl.load(x_ptr + offs_w, mask=ok, other=0)
        lo = v.to(tl.int32)
        hi = (v >> 32).to(tl.int32)
        x0 = (lo << 16).to(tl.float32, bitcast=True)
        x1 = (lo & -65536).to(tl.float32, bitcast=True)
        x2 = (hi << 16).to(tl.float32, bitcast=True)
        x3 = (hi & -65536).to(tl.float32, bitcast=True)
    elif X_LOAD == 1:
        ptrs = x_ptr + offs_w * (4 * stride_xk)
        x0 = tl.load(ptrs, mask=ok, other=0.0).to(tl.float32)
        x1 = tl.load(ptrs + stride_xk, mask=ok, other=0.0).to(tl.float32)
        x2 = tl.load(ptrs + 2 * stride_xk, mask=ok, other=0.0).to(tl.float32)
        x3 = tl.load(ptrs + 3 * stride_xk, mask=ok, other=0.0).to(tl.float32)
    else:
        offs = offs_w[:, None] * 4 + tl.arange(0, 4)[None, :]
        x = tl.load(x_ptr + offs * stride_xk, mask=ok[:, None], other=0.0).to(tl.float32)
        even, odd = tl.split(tl.reshape(x, (offs_w.shape[0], 2, 2)))
        x0, x2 = tl.split(even)
        x1, x3 = tl.split(odd)
    if BITS:
        x0 = x0 * BITS_X_SCALE
        x1 = x1 * BITS_X_SCALE
        x2 = x2 * BITS_X_SCALE
        x3 = x3 * BITS_X_SCALE
    return x0[None, :], x1[None, :], x2[None, :], x3[None, :]


@triton.jit
def _word_dot(acc, wf, x_ptr, offs_w, w_end, stride_xk, BITS: tl.constexpr,
              X_LOAD: tl.constexpr, U8: tl.constexpr, sq, sx):
    x0, x1, x2, x3 = _x_planes(x_ptr, offs_w, w_end, stride_xk, BITS, X_LOAD)
    if U8 == 3:  # e4m3 weights with a scale per group: the step adds s sum x w
        p = wf[0] * x0
        p += wf[1] * x1
        p += wf[2] * x2
        p += wf[3] * x3
        acc += p * sq
    elif U8 == 2:  # wf = 2**23 + q, sx = 2**23 + z: exact q - z (``_group_consts``)
        p = (wf[0] - sx) * x0
        p += (wf[1] - sx) * x1
        p += (wf[2] - sx) * x2
        p += (wf[3] - sx) * x3
        acc += p * sq
    elif U8:  # wf = 1 + q 2**-15: the step adds s (sum x q - z sum x) (``_group_consts``)
        p = wf[0] * x0
        p += wf[1] * x1
        p += wf[2] * x2
        p += wf[3] * x3
        acc += p * sq
        acc -= (x0 + x1 + x2 + x3) * sx
    else:
        acc += wf[0] * x0
        acc += wf[1] * x1
        acc += wf[2] * x2
        acc += wf[3] * x3
    return acc


@triton.jit
def _fp8_gemv_kernel(
    x_ptr, w_ptr, s_ptr, out_ptr, part_ptr, cnt_ptr,
    M, N, K, K_PER_SPLIT, NUM_SPLITS,
    stride_xm, stride_xk, stride_wn, stride_om, stride_on,
    stride_ps, stride_pm, stride_pn,
    pos_ptr, cs_ptr, kc_ptr, vc_ptr, slot_ptr, stride_cs, stride_cb, stride_ct, stride_ch,
    block_size, Q_N, QK_N,
    z_ptr, zero, BASE_BITS, stride_sg, stride_sn, stride_zg, stride_zn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BITS: tl.constexpr,
    X_LOAD: tl.constexpr, GLU: tl.constexpr, ROPE: tl.constexpr, HEAD_DIM: tl.constexpr,
    STAGES: tl.constexpr, PDL: tl.constexpr, TILED: tl.constexpr,
    U8: tl.constexpr = 0, GROUP: tl.constexpr = 1, HAS_Z: tl.constexpr = False,
    ASM: tl.constexpr = True, ROW_BLOCK: tl.constexpr = 1,
):  # fmt: skip
    # Grid (N tiles, K splits). w_ptr: the weight as int32 words [N, K / 4]; BLOCK_K counts
    # weights. One accumulator [BLOCK_N, BLOCK_K / 4] per row of x (BLOCK_M = M, 1 or 2).
    # GLU: the weight is an MLP's [gate | up] (N = 2I); tile column 2p reads gate row p and
    # 2p + 1 up row I + p, and the store writes silu(gate) * up to output column p.
    # ROPE (one K split): the weight is a qkv projection's [q | k | v] (q: Q_N rows, q and
    # k: QK_N, heads of HEAD_DIM); the tile's column pairs are the NeoX pairs of q and k
    # (``qkv_rope_store.rope_rows``) and the store rotates them, writes q to out_ptr and k / v
    # into the paged KV cache (``qkv_rope_store.rope_store``); the pos_ptr .. QK_N arguments
    # serve ROPE only.
    # TILED: the weight pre-tiled by ``fp8_tiled.tile_fp8_weight`` for these BLOCK_N x
    # BLOCK_K (N and K multiples of them), int32 words [N / BLOCK_N, K / BLOCK_K, BLOCK_N,
    # BLOCK_W], tile column c's row already the weight row ``rows[c]``: a step of a tile is
    # one contiguous block, a program's K range too. Only the weight's addresses change.
    # U8 (``octavo.kernels.int8_gemv``): the bytes are unsigned 8-bit integers q with a scale
    # s (s_ptr [G, N], strides stride_sg / stride_sn) and a zero z (z_ptr [G, N] if HAS_Z,
    # else the number ``zero``) per GROUP weights of K, W = (q - z) s; GROUP a multiple of
    # BLOCK_K, so a step lies in one group and adds s (sum x q - z sum x) (``_word_dot``):
    # U8 = 2 with exact q - z (a subtraction per weight), U8 = 1 through 1 + q 2**-15 (one
    # correction per word; ~2**-16 of the result, for 16-bit activations). BASE_BITS: the
    # float bits the bytes are placed in (``_u8_prmt``), at run time (a constant is
    # re-materialized before every PRMT). U8 = 3: the bytes are e4m3 (converted as without
    # U8) with a float32 scale per GROUP weights of K and ROW_BLOCK rows (block-scaled FP8
    # checkpoints: s_ptr the [ceil(N / ROW_BLOCK), ceil(K / GROUP)] scales read through
    # stride_sn / stride_sg), no zero point.
    BLOCK_W: tl.constexpr = BLOCK_K // 4
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    rows = offs_n
    if GLU:
        rows = offs_n // 2 + (offs_n % 2) * (N // 2)
    if ROPE:
        rows = rope_rows(offs_n, QK_N, HEAD_DIM)
    x1 = x_ptr + stride_xm
    acc0 = tl.zeros((BLOCK_N, BLOCK_W), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_N, BLOCK_W), dtype=tl.float32)
    w_start = pid_k * (K_PER_SPLIT // 4)
    w_end = tl.minimum(w_start + K_PER_SPLIT // 4, K // 4)
    offs_w = w_start + tl.arange(0, BLOCK_W)
    if TILED:  # (tile, step) blocks of BLOCK_N x BLOCK_W words, a row's words contiguous
        W_STEP: tl.constexpr = BLOCK_N * BLOCK_W
        step0 = pid_n * (K // BLOCK_K) + pid_k * (K_PER_SPLIT // BLOCK_K)
        w_ptrs = (w_ptr + step0 * W_STEP + tl.arange(0, BLOCK_N)[:, None] * BLOCK_W
                  + tl.arange(0, BLOCK_W)[None, :])
    else:
        W_STEP: tl.constexpr = BLOCK_W
        w_ptrs = w_ptr + rows[:, None] * stride_wn + offs_w[None, :]
    w = tl.load(w_ptrs, mask=n_mask[:, None] & (offs_w < w_end)[None, :], other=0)
    if STAGES == 3:  # a second step's weights in flight too
        w_ptrs += W_STEP
        w_ahead = tl.load(w_ptrs, mask=n_mask[:, None] & ((offs_w + BLOCK_W) < w_end)[None, :],
                          other=0)
    sq = 0.0
    sx = 0.0
    if U8:  # the first step's group factors (scales are weights: before the wait)
        sq, sx = _group_consts(s_ptr, z_ptr, zero, rows, n_mask, w_start, stride_sg,
                               stride_sn, stride_zg, stride_zn, GROUP, HAS_Z, U8 != 1,
                               ROW_BLOCK)
    pdl_begin(PDL)  # the first weights are on their way while the previous kernel ends
    for wi in tl.range(w_start, w_end, BLOCK_W, loop_unroll_factor=2):
        w_ptrs += W_STEP
        next_mask = (offs_w + (STAGES - 1) * BLOCK_W) < w_end
        w_next = tl.load(w_ptrs, mask=n_mask[:, None] & next_mask[None, :], other=0)
        if U8:
            # The next step's group factors on their way too (the last step's: a reload).
            sq_next, sx_next = _group_consts(
                s_ptr, z_ptr, zero, rows, n_mask, tl.minimum(wi + BLOCK_W, w_end - 1),
                stride_sg, stride_sn, stride_zg, stride_zn, GROUP, HAS_Z, U8 != 1, ROW_BLOCK)
        if U8 == 1 or U8 == 2:
            wf = _u8x4(w, BASE_BITS, ASM, U8 == 2)
        elif BITS:
            wf = _e4m3x4_bits(w)
        else:
            wf = _e4m3x4_cvt(w)
        acc0 = _word_dot(acc0, wf, x_ptr, offs_w, w_end, stride_xk, BITS, X_LOAD, U8, sq, sx)
        if BLOCK_M > 1:
            acc1 = _word_dot(acc1, wf, x1, offs_w, w_end, stride_xk, BITS, X_LOAD, U8, sq, sx)
        if U8:
            sq = sq_next
            sx = sx_next
        if STAGES == 3:
            w = w_ahead
            w_ahead = w_next
        else:
            w = w_next
        offs_w += BLOCK_W
    if U8:  # the scales are in the sums already
        scale = tl.full((BLOCK_N,), 1.0, tl.float32)
    else:
        scale = tl.load(s_ptr + rows, mask=n_mask, other=0.0)
    if BITS:
        scale = scale * BITS_OUT_SCALE
    offs_m = tl.arange(0, BLOCK_M)
    res = tl.where(offs_m[:, None] == 0, (tl.sum(acc0, axis=1) * scale)[None, :], 0.0)
    if BLOCK_M > 1:
        res = tl.where(offs_m[:, None] == 1, (tl.sum(acc1, axis=1) * scale)[None, :], res)
    if ROPE:
        rope_store(res, offs_m, pid_n, M, N, Q_N, QK_N, out_ptr, stride_om, pos_ptr, cs_ptr,
                    stride_cs, kc_ptr, vc_ptr, slot_ptr, stride_cb, stride_ct, stride_ch,
                    block_size, BLOCK_N, HEAD_DIM)
    else:
        store_or_reduce(res, offs_m, offs_n, (offs_m[:, None] < M) & n_mask[None, :],
                        out_ptr, stride_om, stride_on, part_ptr, stride_ps, stride_pm,
                        stride_pn, cnt_ptr, pid_n, pid_k, NUM_SPLITS, GLU=GLU)


def fp8_gemv_ref(x2: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The reference: float32 ``x2 @ (weight * scale)^T``, rounded once to x2's dtype."""
    w = weight.to(torch.float32) * scale.reshape(-1, 1).to(torch.float32)
    return (x2.to(torch.float32) @ w.t()).to(x2.dtype)


def _plan(n: int, k: int) -> tuple[int, int, int, int, int]:
    """(block_n, block_k, num_warps, waves, stages) for an [n, k] weight, from ``python
    benchmarks/quantized_gemm.py --fp8 --m 1`` on an H200 (Llama-3.1-8B shapes, us from HBM):
    the wide gate_up (N = 28,672) 32 x 256 over 4 warps, 2 waves (30.1 us, 81% of HBM); the
    long-K down (K = 14,336) 16 x 1,024 over 4 warps, 1 wave (session 28, ``--fp8-stages``:
    16.4 against 17.0 at session 27's 32 x 512 over 8 warps); o (N = K = 4,096) 8 x 512
    over 8 warps with two steps of weights in flight (5.5 against 6.4: a small weight whose
    programs were short of bytes in flight); qkv 16 x 512 over 8 warps, 1 wave (7.6; no
    other tile or depth faster)."""
    if n >= 16384:
        return 32, 256, 4, 2, 2
    if k >= 8192:
        return 16, 1024, 4, 1, 2
    if n * k <= 4096 * 4096:
        return 8, 512, 8, 1, 3
    return 16, 512, 8, 1, 2


def group_plan(n: int, k: int, group: int) -> tuple[int, int, int, int, int]:
    """:func:`_plan` for weights with a scale per ``group`` of K (a step may not cross one:
    ``int8_gemv``, block-scaled FP8): the FP8 GEMV's plan where the group allows its K
    steps; 128-wide steps otherwise, over 4 warps and enough K splits for about 4 programs
    per SM (session 34's sweep, us from HBM at g128: qkv 9.6, o 7.4 at 64 x 128, down 19.7
    at 32 x 128; one program per SM had left the SMs unevenly loaded: 11.3 / 12.0 /
    26.4)."""
    plan = _plan(n, k)
    if group % plan[1] == 0:
        return plan
    block_k = next(b for b in (128, 64, SMALLEST_STEP) if group % b == 0)
    block_n = 32 if k >= 8192 else 64
    return block_n, block_k, 4, 4, 2


def fp8_gemv(x2: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
             split_k: int | None = None, block_n: int | None = None,
             block_k: int | None = None, num_warps: int | None = None,
             waves: int | None = None, bits: bool | None = None,
             x_load: int | None = None, glu: bool = False,
             stages: int | None = None,
             tiled: tuple[int, int] | None = None) -> torch.Tensor:
    """``x2 [M, K] @ (weight [N, K] * scale [N])^T`` for M <= MAX_M, in x2's dtype; K a
    multiple of 4, the weight contiguous along K. The tuning arguments (None: chosen here)
    exist for the benchmark's sweeps; ``bits``: convert by bit placement (the default off
    CUDA, where the interpreter runs no inline assembly); ``x_load``: how the activations
    are read (``_x_planes``; 2 needs bf16 x contiguous along K, else 1 is used);
    ``stages``: steps of weights in flight (2: the next one; 3: two ahead). ``glu``:
    the weight is an MLP's [gate | up] (N = 2I) and the result ``silu(gate) * up`` [M, I],
    computed in the store (``split_k.store_or_reduce``): the bits of the unfused GEMV
    followed by ``silu_and_mul``, without the activation's launch. ``tiled``: the
    (block_n, block_k) that ``fp8_tiled.tile_fp8_weight`` tiled ``weight`` with (its 4-d
    layout, made with the same ``glu``); the tile is then those blocks, the same bits."""
    return _launch(x2, weight, scale, split_k, block_n, block_k, num_warps, waves, bits,
                   x_load, stages, glu=glu, tiled=tiled)


def _weight_rows(weight: torch.Tensor) -> int:
    """N of an [N, K] weight or of its tiled layout [N / BN, K / BK, BN, BK]."""
    return weight.shape[0] * weight.shape[2] if weight.dim() == 4 else weight.shape[0]


def qkv_rope_supported(x2: torch.Tensor, weight: torch.Tensor, positions: torch.Tensor,
                       cos_sin_cache: torch.Tensor, num_heads: int, num_kv_heads: int,
                       head_dim: int, kv_store) -> bool:
    """Whether :func:`fp8_gemv_qkv_rope` takes this call: M <= MAX_M rows, the weight a
    [q | k | v] of ``num_heads`` + 2 ``num_kv_heads`` heads of an even ``head_dim``, the
    whole head rotated (a [max_pos, head_dim] float table, cos then sin), one position and
    one slot per row, caches [num_blocks, block_size, Hkv, D] (one layout, the last dim
    contiguous) in x2's dtype or float8 e4m3 (``kv_cache_dtype="fp8"``)."""
    m = x2.shape[0]
    return (1 <= m <= MAX_M and head_dim % 2 == 0 and head_dim > 0
            and _weight_rows(weight) == (num_heads + 2 * num_kv_heads) * head_dim
            and rope_inputs_supported(m, x2.device, positions, cos_sin_cache, num_kv_heads,
                                      head_dim, kv_store, (x2.dtype, torch.float8_e4m3fn)))


def fp8_gemv_qkv_rope(x2: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                      positions: torch.Tensor, cos_sin_cache: torch.Tensor, num_heads: int,
                      num_kv_heads: int, head_dim: int, kv_store,
                      block_n: int | None = None, block_k: int | None = None,
                      num_warps: int | None = None, bits: bool | None = None,
                      x_load: int | None = None, stages: int | None = None,
                      tiled: tuple[int, int] | None = None) -> torch.Tensor | None:
    """A qkv projection's GEMV (``weight`` [(Hq + 2 Hkv) * D, K], no bias) whose store
    applies the NeoX rotary embedding (``positions`` [M] into ``cos_sin_cache``) to q and k
    and writes the rotated k and the v into the paged cache (``kv_store``:
    octavo.attention.backend.KVStore; its ``v`` is not read): q [M, Hq * D] in x2's dtype,
    the same bits as ``fp8_gemv`` followed by ``rotary_embedding(..., kv_store=...)``,
    without the rotary launch. One K split. None, with nothing done, where
    :func:`qkv_rope_supported` says no (the caller runs the unfused path). ``tiled``: as
    :func:`fp8_gemv`'s, the weight tiled with ``rope=(num_heads, num_kv_heads, head_dim)``."""
    if not qkv_rope_supported(x2, weight, positions, cos_sin_cache, num_heads, num_kv_heads,
                              head_dim, kv_store):
        return None
    kc, vc = kv_store.key_cache, kv_store.value_cache
    rope = (positions, cos_sin_cache, kc, vc, kv_store.slots, cos_sin_cache.stride(0),
            kc.stride(0), kc.stride(1), kc.stride(2), kc.shape[1], num_heads * head_dim,
            (num_heads + num_kv_heads) * head_dim)
    return _launch(x2, weight, scale, 1, block_n, block_k, num_warps, None, bits, x_load,
                   stages, rope=rope, head_dim=head_dim, tiled=tiled)


def grid(n: int, k: int, block_n: int, block_k: int, waves: int, device: torch.device,
         split_k: int | None = None) -> tuple[int, int, int]:
    """(N tiles, K splits, K per split) of the launch for an [n, k] weight in tiles of
    ``block_n`` x ``block_k``: ``split_k`` (None: enough to give about ``waves`` programs per
    SM), each split a whole number of steps, none empty."""
    n_tiles = triton.cdiv(n, block_n)
    k_steps = triton.cdiv(k, block_k)
    if split_k is None:
        split_k = split_k_to_fill(n_tiles, k_steps, device, waves)
    split_k, k_per_split = split_k_plan(k_steps * block_k, block_k, split_k)
    return n_tiles, split_k, k_per_split


def x_view(x2: torch.Tensor, x_load: int | None) -> tuple[torch.Tensor, int]:
    """(the activations as ``_x_planes`` reads them, the X_LOAD that applies): X_LOAD 2 (the
    default) reads bf16 rows as int64 words of 4, a view of the same storage, where the
    layout allows; else the activations as they are, X_LOAD 1."""
    x_load = DEFAULT_X_LOAD if x_load is None else x_load
    if x_load != 2:
        return x2, x_load
    if x2.dtype == torch.bfloat16 and x2.stride(1) == 1 and x2.stride(0) % 4 == 0 \
            and x2.data_ptr() % 8 == 0:
        return x2.view(torch.int64), 2  # 4 activations per word: the same storage
    return x2, 1


def _launch(x2, weight, scale, split_k, block_n, block_k, num_warps, waves, bits, x_load,
            stages, glu: bool = False, rope: tuple | None = None,
            head_dim: int = 2, tiled: tuple[int, int] | None = None,
            u8: tuple | None = None, block: tuple[int, int] | None = None) -> torch.Tensor:
    """``fp8_gemv``'s launch; ``rope``: ``_fp8_gemv_kernel``'s ROPE arguments (pos_ptr ..
    QK_N; the output then q [M, Q_N] and split_k 1), else None; ``tiled``: the weight's
    (block_n, block_k) tiling (``fp8_tiled.tile_fp8_weight``), which the tile then is.
    ``u8``: (zeros, group, exact) for unsigned 8-bit integer weights
    (``octavo.kernels.int8_gemv``; ``scale`` then float scales [K / group, N], ``zeros`` a
    tensor of that shape or one number; ``exact``: the kernel's U8 = 2), else None (float8
    weights, ``scale`` float32 per row); ``block``: (rows, columns) of the blocks of a
    block-scaled float8 weight, ``scale`` then float32 [ceil(N / rows), ceil(K / columns)]
    (the kernel's U8 = 3)."""
    require_triton("fp8_gemv")
    m, k = x2.shape
    n = _weight_rows(weight)
    if tiled is not None:
        bn, bk = tiled
        assert weight.dim() == 4 and tuple(weight.shape[2:]) == (bn, bk) \
            and weight.shape[1] * bk == k and weight.is_contiguous(), (weight.shape, tiled)
        assert block_n in (None, bn) and block_k in (None, bk), (block_n, block_k, tiled)
        block_n, block_k = bn, bk
    else:
        assert weight.dim() == 2 and weight.shape[1] == k, (x2.shape, weight.shape)
    assert 1 <= m <= MAX_M and k % 4 == 0, (x2.shape, weight.shape)
    words = weight.view(torch.int32)  # 4 weights per word: the same storage
    stride_wn = k // 4 if tiled else words.stride(0)  # TILED: not read
    assert stages in (None, 2, 3), stages
    plan = _plan(n, k)
    block_n = block_n or plan[0]
    block_k = block_k or plan[1]
    num_warps = num_warps or plan[2]
    waves = waves or plan[3]
    stages = stages or fp8_gemv_stages() or plan[4]
    if block is not None:
        bo, bi = block
        assert scale.dtype == torch.float32 and tuple(scale.shape) == (-(-n // bo), -(-k // bi)) \
            and bi % block_k == 0, (scale.shape, scale.dtype, n, k, block, block_k)
        u8_args = (scale, 0.0, 0x3F800000, scale.stride(1), scale.stride(0), 0, 0)
        u8_meta = {"U8": 3, "GROUP": bi, "HAS_Z": False, "ASM": x2.is_cuda, "ROW_BLOCK": bo}
    elif u8 is None:
        scale = scale.reshape(-1)
        assert scale.numel() == n and scale.dtype == torch.float32, (scale.shape, scale.dtype)
        u8_args = (x2, 0.0, 0x3F800000, 0, 0, 0, 0)  # placeholders: not read
        u8_meta = {}
    else:
        zeros, group, exact = u8
        assert scale.dim() == 2 and scale.shape == (k // group, n) \
            and k % group == 0 and group % block_k == 0, (scale.shape, k, group, block_k)
        has_z = isinstance(zeros, torch.Tensor)
        z = zeros if has_z else scale
        assert not has_z or zeros.shape == scale.shape, (zeros.shape, scale.shape)
        u8_args = (z, 0.0 if has_z else float(zeros), 0x4B000000 if exact else 0x3F800000,
                   scale.stride(0), scale.stride(1), z.stride(0), z.stride(1))
        u8_meta = {"U8": 2 if exact else 1, "GROUP": group, "HAS_Z": has_z,
                   "ASM": x2.is_cuda}
        bits = False
    n_tiles, split_k, k_per_split = grid(n, k, block_n, block_k, waves, x2.device, split_k)
    assert not glu or n % 2 == 0, n
    has_rope = rope is not None
    if has_rope:
        assert split_k == 1 and block_n % 2 == 0 and not glu, (split_k, block_n)
        out_n = rope[-2]
    else:
        out_n = n // 2 if glu else None
    out, partial = split_k_buffers(m, n, split_k, x2, out_n=out_n)
    if not has_rope:  # placeholders: not read without ROPE
        rope = (x2, x2, x2, x2, x2, 0, 0, 0, 0, 1, 0, 0)
    xs, x_load = x_view(x2, x_load)
    _fp8_gemv_kernel[(n_tiles, split_k)](
        xs, words, scale, out, partial, split_k_counters(x2.device, n_tiles),
        m, n, k, k_per_split, split_k,
        xs.stride(0), xs.stride(1), stride_wn,
        out.stride(0), out.stride(1), partial.stride(0), partial.stride(1), partial.stride(2),
        *rope, *u8_args,
        BLOCK_M=m, BLOCK_N=block_n, BLOCK_K=block_k,
        BITS=not x2.is_cuda if bits is None else bits, X_LOAD=x_load, GLU=glu,
        ROPE=has_rope, HEAD_DIM=head_dim, STAGES=stages, TILED=tiled is not None,
        num_warps=num_warps, **u8_meta,
        **pdl_args(x2.device),
    )  # fmt: skip
    return out
