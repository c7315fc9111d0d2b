"""bitsandbytes 4-bit weights (NF4 / FP4: two 4-bit codes per byte, the high nibble first, a
float32 absmax per ``blocksize`` consecutive weights of a row) on CUDA, without a dequantized
copy per call:

- :func:`bnb4_gemv`, decode rows (M <= MAX_M): the weight is read as int32 words (4 bytes,
  8 weights), each byte one gather from a 256-entry table of code pairs
  (``bnb_weight.byte_table`` read as int64, 2 KB; the default, ``OCTAVO_BNB4_TABLE``) or
  each nibble one gather from the 16 float32 code values (64 bytes, one cache line a warp,
  but twice the gathers: 10-20% slower on an H200); each word's sum is multiplied by its
  block's absmax. Either reads at 7-9% of an H200's HBM: gather-bound (9 sm_90
  instructions a weight, each byte's gather costing an extract, a 64-bit address and a
  load). A program takes BLOCK_N rows and BLOCK_K weights per step, its next step's words
  loaded before this step's arithmetic; K is split over programs as far as needed to fill
  the GPU (``split_k``, the last program of a tile adds the partials).
- :func:`dequantize_4bit`, what larger batches still dequantize: one launch writing the
  weight in the activations' dtype (the torch path gathers into float32 pairs and multiplies
  them: about 30 bytes moved per weight where this moves 2.5).

Both compute each weight as ``code * absmax`` in float32, as bitsandbytes does; the GEMV
keeps the product in float32 (the torch path rounds it to the activations' dtype first), so
in float32 the two agree to summation order.
"""

from __future__ import annotations

import torch

from octavo.kernels.fp8_gemv import grid
from octavo.kernels.pdl import begin as pdl_begin
from octavo.kernels.pdl import launch_args as pdl_args
from octavo.kernels.split_k import buffers as split_k_buffers
from octavo.kernels.split_k import counters as split_k_counters
from octavo.kernels.split_k import store_rows
from octavo.kernels.triton_utils import require_triton, tl, triton

MAX_M = 2


@triton.jit
def _word_dot(acc, w, t_ptr, a, x_ptr, offs_w, w_ok, X_PAIRS: tl.constexpr,
              TABLE: tl.constexpr):
    """acc [BLOCK_N, BLOCK_W] plus one row of x times the int32 words ``w`` (4 bytes, 8
    weights each: byte i holds weights 8w + 2i (high nibble) and 8w + 2i + 1), each word's
    sum times its block's absmax ``a``. The code values: TABLE 16, one gather per nibble
    from the 16 float32 codes (64 bytes: a warp's gathers stay in one cache line); TABLE 256,
    one gather per byte from the 256 code pairs (2 KB: a warp's 32 gathers spread over up to
    16 lines, each line another pass of the L1)."""
    p = tl.zeros(acc.shape, dtype=tl.float32)
    for i in tl.static_range(4):
        if TABLE == 16:
            w0 = tl.load(t_ptr + ((w >> (8 * i + 4)) & 0xF))
            w1 = tl.load(t_ptr + ((w >> (8 * i)) & 0xF))
        else:
            pair = tl.load(t_ptr + ((w >> (8 * i)) & 0xFF))  # int64: low word = high nibble
            w0 = pair.to(tl.int32).to(tl.float32, bitcast=True)
            w1 = (pair >> 32).to(tl.int32).to(tl.float32, bitcast=True)
        if X_PAIRS:  # bf16 activations read as int32 pairs, split by bit placement
            v = tl.load(x_ptr + 4 * offs_w + i, mask=w_ok, other=0)
            x0 = (v << 16).to(tl.float32, bitcast=True)
            x1 = (v & -65536).to(tl.float32, bitcast=True)
        else:
            x0 = tl.load(x_ptr + 8 * offs_w + 2 * i, mask=w_ok, other=0.0).to(tl.float32)
            x1 = tl.load(x_ptr + 8 * offs_w + 2 * i + 1, mask=w_ok, other=0.0).to(tl.float32)
        p += w0 * x0[None, :]
        p += w1 * x1[None, :]
    return acc + p * a


@triton.jit
def _bnb4_gemv_kernel(
    x_ptr, q_ptr, a_ptr, t_ptr, out_ptr, part_ptr, cnt_ptr,
    M, N, K, K_PER_SPLIT, NUM_SPLITS,
    stride_xm, stride_qn, stride_an, stride_om, stride_on, stride_ps, stride_pm, stride_pn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BS: tl.constexpr,
    X_PAIRS: tl.constexpr, PDL: tl.constexpr, TABLE: tl.constexpr = 256,
):  # fmt: skip
    # Grid (N tiles, K splits). q_ptr: the packed weight as int32 words [N, K / 8] (stride
    # stride_qn words); a_ptr: float32 absmax [N, K / BS]; t_ptr: float32 [16] codes
    # (TABLE 16) or int64 [256] code pairs (TABLE 256).
    # x_ptr: x [M, K], or its int32 view (two bf16 a word, X_PAIRS; strides then in words).
    # A step: BLOCK_K weights (BLOCK_W words) of BLOCK_N rows.
    BLOCK_W: tl.constexpr = BLOCK_K // 8
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    w_start = pid_k * (K_PER_SPLIT // 8)
    w_end = tl.minimum(w_start + K_PER_SPLIT // 8, K // 8)
    offs_w = w_start + tl.arange(0, BLOCK_W)
    q_ptrs = q_ptr + offs_n[:, None] * stride_qn + offs_w[None, :]
    a_rows = a_ptr + offs_n[:, None] * stride_an
    acc0 = tl.zeros((BLOCK_N, BLOCK_W), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_N, BLOCK_W), dtype=tl.float32)
    w = tl.load(q_ptrs, mask=n_mask[:, None] & (offs_w < w_end)[None, :], other=0)
    pdl_begin(PDL)  # the first words are on their way while the previous kernel ends
    for _ in tl.range(w_start, w_end, BLOCK_W, loop_unroll_factor=2):
        q_ptrs += BLOCK_W  # the next step's words before this step's arithmetic
        w_next = tl.load(q_ptrs, mask=n_mask[:, None] & ((offs_w + BLOCK_W) < w_end)[None, :],
                         other=0)
        w_ok = offs_w < w_end
        mask = n_mask[:, None] & w_ok[None, :]
        a = tl.load(a_rows + ((8 * offs_w) // BS)[None, :], mask=mask, other=0.0)
        acc0 = _word_dot(acc0, w, t_ptr, a, x_ptr, offs_w, w_ok, X_PAIRS, TABLE)
        if BLOCK_M > 1:
            acc1 = _word_dot(acc1, w, t_ptr, a, x_ptr + stride_xm, offs_w, w_ok, X_PAIRS,
                             TABLE)
        w = w_next
        offs_w += BLOCK_W
    store_rows(acc0, acc1, offs_n, n_mask, M, out_ptr, stride_om, stride_on, part_ptr,
               stride_ps, stride_pm, stride_pn, cnt_ptr, pid_n, pid_k, NUM_SPLITS, BLOCK_M)


def supported(m: int, k: int, blocksize: int) -> bool:
    """Whether :func:`bnb4_gemv` takes [m, k] activations on a weight of ``blocksize`` blocks:
    m <= MAX_M, K whole blocks, the blocksize a multiple of 8 (a word's 8 weights in one
    block)."""
    return 1 <= m <= MAX_M and blocksize % 8 == 0 and k % blocksize == 0 and k % 8 == 0


def plan(n: int, k: int) -> tuple[int, int, int, int]:
    """(block_n, block_k, num_warps, waves): the FP8 GEMV's wide-shape tile (32 rows x 256
    weights over 4 warps, 2 waves). Not yet tuned on a GPU."""
    return 32, 256, 4, 2


def bnb4_gemv(x2: torch.Tensor, qweight: torch.Tensor, absmax: torch.Tensor,
              table: torch.Tensor, blocksize: int,
              tiles: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """``x2 [M, K] @ W^T`` for M <= MAX_M in x2's dtype, ``W[n, k] = code[nibble] *
    absmax[n, k // blocksize]`` of the packed ``qweight`` uint8 [N, K / 2] (high nibble
    first) and ``absmax`` float32 [N, K / blocksize]; ``table``: the 16 float32 code values
    (a gather per nibble) or their [256, 2] pairs (``bnb_weight.byte_table``, a gather per
    byte: the kernel's TABLE). ``tiles``: a plan (:func:`plan`'s tuple) for sweeps."""
    require_triton("bnb4_gemv")
    m, k = x2.shape
    n = qweight.shape[0]
    assert supported(m, k, blocksize) and qweight.shape[1] * 2 == k, (x2.shape, qweight.shape)
    assert qweight.dtype == torch.uint8 and qweight.stride(1) == 1, (qweight.dtype,
                                                                      qweight.stride())
    assert tuple(absmax.shape) == (n, k // blocksize) and absmax.stride(1) == 1, absmax.shape
    assert tuple(table.shape) in ((16,), (256, 2)) and table.dtype == torch.float32 \
        and table.is_contiguous(), (table.shape, table.dtype)
    entries = table.shape[0]
    block_n, block_k, num_warps, waves = tiles or plan(n, k)
    assert block_k % 8 == 0 and qweight.stride(0) % 4 == 0 and qweight.data_ptr() % 4 == 0
    n_tiles, split_k, k_per_split = grid(n, k, block_n, block_k, waves, x2.device)
    out, partial = split_k_buffers(m, n, split_k, x2)
    pairs = x2.dtype == torch.bfloat16 and x2.stride(1) == 1 and x2.stride(0) % 2 == 0 \
        and x2.data_ptr() % 4 == 0
    xs = x2.view(torch.int32) if pairs else x2
    words = qweight.view(torch.int32)
    _bnb4_gemv_kernel[(n_tiles, split_k)](
        xs, words, absmax, table if entries == 16 else table.view(torch.int64).reshape(256),
        out, partial, split_k_counters(x2.device, n_tiles), m, n, k, k_per_split, split_k,
        xs.stride(0), words.stride(0), absmax.stride(0), out.stride(0), out.stride(1),
        partial.stride(0), partial.stride(1), partial.stride(2),
        BLOCK_M=m, BLOCK_N=block_n, BLOCK_K=block_k, BS=blocksize, X_PAIRS=pairs,
        TABLE=entries, num_warps=num_warps, **pdl_args(x2.device),
    )  # fmt: skip
    return out


@triton.jit
def _dequantize_kernel(q_ptr, a_ptr, t_ptr, out_ptr, N, K, stride_qn, stride_an, stride_on,
                       BS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr):
    # Grid (N tiles, byte tiles): out[n, 2b + i] = table[q[n, b], i] * absmax[n, 2b // BS].
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_b = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
    ok = (offs_n < N)[:, None] & (offs_b < K // 2)[None, :]
    q = tl.load(q_ptr + offs_n[:, None] * stride_qn + offs_b[None, :], mask=ok, other=0)
    pair = tl.load(t_ptr + q.to(tl.int32))
    a = tl.load(a_ptr + offs_n[:, None] * stride_an + (2 * offs_b[None, :]) // BS, mask=ok,
                other=0.0)
    w0 = pair.to(tl.int32).to(tl.float32, bitcast=True) * a
    w1 = (pair >> 32).to(tl.int32).to(tl.float32, bitcast=True) * a
    w = tl.reshape(tl.join(w0, w1), (BLOCK_N, 2 * BLOCK_B))
    offs_k = tl.program_id(1) * (2 * BLOCK_B) + tl.arange(0, 2 * BLOCK_B)
    tl.store(out_ptr + offs_n[:, None].to(tl.int64) * stride_on + offs_k[None, :],
             w.to(out_ptr.dtype.element_ty),
             mask=(offs_n < N)[:, None] & (offs_k < K)[None, :])


@triton.jit
def _code_of(v, C0: tl.constexpr, C1: tl.constexpr, C2: tl.constexpr, C3: tl.constexpr,
             C4: tl.constexpr, C5: tl.constexpr, C6: tl.constexpr, C7: tl.constexpr,
             C8: tl.constexpr, C9: tl.constexpr, C10: tl.constexpr, C11: tl.constexpr,
             C12: tl.constexpr, C13: tl.constexpr, C14: tl.constexpr, C15: tl.constexpr):
    """Code value ``C[v]`` of 4-bit ``v`` (int32) by a tree of 15 selects on its bits, the
    codes in the instructions: no table, no gather."""
    b = (v & 1) != 0
    l0 = tl.where(b, C1, C0)
    l1 = tl.where(b, C3, C2)
    l2 = tl.where(b, C5, C4)
    l3 = tl.where(b, C7, C6)
    l4 = tl.where(b, C9, C8)
    l5 = tl.where(b, C11, C10)
    l6 = tl.where(b, C13, C12)
    l7 = tl.where(b, C15, C14)
    b = (v & 2) != 0
    m0 = tl.where(b, l1, l0)
    m1 = tl.where(b, l3, l2)
    m2 = tl.where(b, l5, l4)
    m3 = tl.where(b, l7, l6)
    b = (v & 4) != 0
    n0 = tl.where(b, m1, m0)
    n1 = tl.where(b, m3, m2)
    return tl.where((v & 8) != 0, n1, n0)


@triton.jit
def _dequantize_select_kernel(
    q_ptr, a_ptr, out_ptr, N, K, stride_qn, stride_an, stride_on,
    BS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr,
    C0: tl.constexpr, C1: tl.constexpr, C2: tl.constexpr, C3: tl.constexpr,
    C4: tl.constexpr, C5: tl.constexpr, C6: tl.constexpr, C7: tl.constexpr,
    C8: tl.constexpr, C9: tl.constexpr, C10: tl.constexpr, C11: tl.constexpr,
    C12: tl.constexpr, C13: tl.constexpr, C14: tl.constexpr, C15: tl.constexpr,
):  # fmt: skip
    # As _dequantize_kernel, the codes decoded by _code_of instead of a table gather.
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_b = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
    ok = (offs_n < N)[:, None] & (offs_b < K // 2)[None, :]
    q = tl.load(q_ptr + offs_n[:, None] * stride_qn + offs_b[None, :], mask=ok,
                other=0).to(tl.int32)
    a = tl.load(a_ptr + offs_n[:, None] * stride_an + (2 * offs_b[None, :]) // BS, mask=ok,
                other=0.0)
    w0 = _code_of(q >> 4, C0, C1, C2, C3, C4, C5, C6, C7, C8, C9, C10, C11, C12, C13, C14,
                  C15) * a
    w1 = _code_of(q & 15, C0, C1, C2, C3, C4, C5, C6, C7, C8, C9, C10, C11, C12, C13, C14,
                  C15) * a
    w = tl.reshape(tl.join(w0, w1), (BLOCK_N, 2 * BLOCK_B))
    offs_k = tl.program_id(1) * (2 * BLOCK_B) + tl.arange(0, 2 * BLOCK_B)
    tl.store(out_ptr + offs_n[:, None].to(tl.int64) * stride_on + offs_k[None, :],
             w.to(out_ptr.dtype.element_ty),
             mask=(offs_n < N)[:, None] & (offs_k < K)[None, :])


def dequantize_4bit_select(qweight: torch.Tensor, absmax: torch.Tensor,
                           codes: tuple[float, ...], blocksize: int,
                           dtype: torch.dtype) -> torch.Tensor:
    """``dequantize_4bit``'s result with the 16 code values (float32 numbers, e.g. the
    layer's ``code.tolist()``) compiled into the kernel and picked by selects on each
    nibble's bits: the table version reads at 7-9% of HBM, bound by its gathers. Off the
    engine's path until measured on a GPU (``OCTAVO_BNB4_DEQUANT=select``)."""
    require_triton("bnb4.dequantize_4bit_select")
    assert len(codes) == 16, codes
    n, k = qweight.shape[0], qweight.shape[1] * 2
    assert qweight.stride(1) == 1 and tuple(absmax.shape) == (n, k // blocksize)
    out = torch.empty(n, k, dtype=dtype, device=qweight.device)
    block_n, block_b = 16, 128
    consts = {f"C{i}": float(c) for i, c in enumerate(codes)}
    _dequantize_select_kernel[(triton.cdiv(n, block_n), triton.cdiv(k // 2, block_b))](
        qweight, absmax, out, n, k, qweight.stride(0), absmax.stride(0), out.stride(0),
        BS=blocksize, BLOCK_N=block_n, BLOCK_B=block_b, num_warps=4, **consts)
    return out


def dequantize_4bit(qweight: torch.Tensor, absmax: torch.Tensor, table: torch.Tensor,
                    blocksize: int, dtype: torch.dtype) -> torch.Tensor:
    """The [N, K] weight in ``dtype`` (``bnb_weight.dequantize_packed``'s values: the float32
    product rounded once) in one launch; K a multiple of ``blocksize``."""
    require_triton("bnb4.dequantize_4bit")
    n, k = qweight.shape[0], qweight.shape[1] * 2
    assert qweight.stride(1) == 1 and tuple(absmax.shape) == (n, k // blocksize)
    out = torch.empty(n, k, dtype=dtype, device=qweight.device)
    block_n, block_b = 16, 128
    _dequantize_kernel[(triton.cdiv(n, block_n), triton.cdiv(k // 2, block_b))](
        qweight, absmax, table.view(torch.int64).reshape(256), out, n, k, qweight.stride(0),
        absmax.stride(0), out.stride(0), BS=blocksize, BLOCK_N=block_n, BLOCK_B=block_b,
        num_warps=4)
    return out
