"""Block-scaled FP8 weights (e4m3 [N, K], a float32 scale per block of ROW_BLOCK rows and
GROUP columns, usually 128 x 128) times 1-2 rows of bf16/fp16 activations, with the scales
folded into the activations.

``fp8_gemv``'s block mode (U8 = 3) keeps every K step inside one block column and adds each
step's sum times its block's scale: steps of at most 128 weights, a per-row scale gathered
every step and a second multiply per word (4.75 sm_90 instructions per weight at its 32 x 128
plan against 3.26 for the row-scaled GEMV's 16 x 1,024). Here a program's rows lie in one
block row (two with ``GLU``: the gate half and the up half), so one block row's scales serve
every row of it: each step multiplies its activations by the scale of their block column
(a [BLOCK_K] vector, shared by the program's rows) and the weights meet them exactly as in
the row-scaled GEMV, with its plan's wide steps (``fp8_gemv._plan``). ``y = sum_b s_b
sum_{k in b} x_k w_k = sum_k (x_k s_b(k)) w_k``: one float32 rounding of ``x_k s`` more per
activation, none per weight.

GLU (an MLP's [gate | up] weight, N = 2I, I a multiple of the block rows): a program takes
BLOCK_N / 2 gate rows and the same up rows, two accumulators with their own scaled
activations, and its store writes ``silu(gate) * up`` (``split_k.store_or_reduce``), as the
row-scaled GEMV's GLU does.
"""

from __future__ import annotations

import torch

from octavo.kernels import fp8_gemv as gemv
from octavo.kernels.pdl import begin as pdl_begin
from octavo.kernels.pdl import launch_args as pdl_args
from octavo.kernels.split_k import buffers as split_k_buffers
from octavo.kernels.split_k import counters as split_k_counters
from octavo.kernels.split_k import store_or_reduce
from octavo.kernels.triton_utils import require_triton, tl, triton


@triton.jit
def _scales(s_row, wi, offs_w, w_end, stride_sg, GROUP: tl.constexpr, BLOCK_W: tl.constexpr):
    """The scales of a step's activations from one block row's scales (``s_row``): one
    number where every step lies in one block column (GROUP a multiple of BLOCK_K), else
    [1, BLOCK_W] (a word's 4 weights in one block column: GROUP a multiple of 4)."""
    if GROUP % (BLOCK_W * 4) == 0:
        return tl.load(s_row + ((wi * 4) // GROUP) * stride_sg)
    g = (offs_w * 4) // GROUP
    return tl.load(s_row + g * stride_sg, mask=offs_w < w_end, other=0.0)[None, :]


@triton.jit
def _folded_dot(acc, wf, x0, x1, x2, x3, s):
    return acc + wf[0] * (x0 * s) + wf[1] * (x1 * s) + wf[2] * (x2 * s) + wf[3] * (x3 * s)


@triton.jit
def _convert(w, BITS: tl.constexpr):
    if BITS:
        return gemv._e4m3x4_bits(w)
    return gemv._e4m3x4_cvt(w)


@triton.jit
def _fp8_block_gemv_kernel(
    x_ptr, w_ptr, s_ptr, out_ptr, part_ptr, cnt_ptr,
    M, N, K, K_PER_SPLIT, NUM_SPLITS,
    stride_xm, stride_xk, stride_wn, stride_sn, stride_sg, stride_om, stride_on,
    stride_ps, stride_pm, stride_pn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BITS: tl.constexpr,
    X_LOAD: tl.constexpr, GLU: tl.constexpr, STAGES: tl.constexpr, PDL: tl.constexpr,
    GROUP: tl.constexpr, ROW_BLOCK: tl.constexpr,
):  # fmt: skip
    # Grid (N tiles, K splits). w_ptr: the weight as int32 words [N, K / 4]; BLOCK_K counts
    # weights. HALF rows per accumulator: BLOCK_N (one), or BLOCK_N / 2 gate rows and the
    # same up rows (GLU); each accumulator's rows inside one block row (the launcher's
    # conditions), whose scales s_ptr + block row * stride_sn + block column * stride_sg.
    BLOCK_W: tl.constexpr = BLOCK_K // 4
    HALF: tl.constexpr = BLOCK_N // 2 if GLU else BLOCK_N
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n_rows = N // 2 if GLU else N
    row0 = pid_n * HALF
    offs_r = row0 + tl.arange(0, HALF)
    r_mask = offs_r < n_rows
    w_start = pid_k * (K_PER_SPLIT // 4)
    w_end = tl.minimum(w_start + K_PER_SPLIT // 4, K // 4)
    offs_w = w_start + tl.arange(0, BLOCK_W)
    x1_ptr = x_ptr + stride_xm
    s_g = s_ptr + (row0 // ROW_BLOCK) * stride_sn
    s_u = s_ptr + ((n_rows + row0) // ROW_BLOCK) * stride_sn
    up = n_rows * stride_wn
    g_ptrs = w_ptr + offs_r[:, None] * stride_wn + offs_w[None, :]
    acc_g0 = tl.zeros((HALF, BLOCK_W), dtype=tl.float32)
    acc_g1 = tl.zeros((HALF, BLOCK_W), dtype=tl.float32)
    acc_u0 = tl.zeros((HALF, BLOCK_W), dtype=tl.float32)
    acc_u1 = tl.zeros((HALF, BLOCK_W), dtype=tl.float32)
    mask = r_mask[:, None] & (offs_w < w_end)[None, :]
    w_g = tl.load(g_ptrs, mask=mask, other=0)
    w_u = w_g
    if GLU:
        w_u = tl.load(g_ptrs + up, mask=mask, other=0)
    if STAGES == 3:  # a second step's weights in flight too
        mask = r_mask[:, None] & ((offs_w + BLOCK_W) < w_end)[None, :]
        a_g = tl.load(g_ptrs + BLOCK_W, mask=mask, other=0)
        a_u = a_g
        if GLU:
            a_u = tl.load(g_ptrs + BLOCK_W + up, mask=mask, other=0)
    # The first step's scales (scales are weights: before the wait).
    sg = _scales(s_g, w_start, offs_w, w_end, stride_sg, GROUP, BLOCK_W)
    su = sg
    if GLU:
        su = _scales(s_u, w_start, offs_w, w_end, stride_sg, GROUP, BLOCK_W)
    pdl_begin(PDL)  # the first weights are on their way while the previous kernel ends
    for wi in tl.range(w_start, w_end, BLOCK_W, loop_unroll_factor=2):
        g_ptrs += BLOCK_W
        nxt = offs_w + (STAGES - 1) * BLOCK_W
        mask = r_mask[:, None] & (nxt < w_end)[None, :]
        n_g = tl.load(g_ptrs + (STAGES - 2) * BLOCK_W, mask=mask, other=0)
        n_u = n_g
        if GLU:
            n_u = tl.load(g_ptrs + (STAGES - 2) * BLOCK_W + up, mask=mask, other=0)
        # The next step's scales on their way too (past the last step: masked, or a reload).
        ahead = tl.minimum(wi + BLOCK_W, w_end - 1)
        ng = _scales(s_g, ahead, offs_w + BLOCK_W, w_end, stride_sg, GROUP, BLOCK_W)
        nu = ng
        if GLU:
            nu = _scales(s_u, ahead, offs_w + BLOCK_W, w_end, stride_sg, GROUP, BLOCK_W)
        x0, x1, x2, x3 = gemv._x_planes(x_ptr, offs_w, w_end, stride_xk, BITS, X_LOAD)
        wf = _convert(w_g, BITS)
        acc_g0 = _folded_dot(acc_g0, wf, x0, x1, x2, x3, sg)
        if GLU:
            wu = _convert(w_u, BITS)
            acc_u0 = _folded_dot(acc_u0, wu, x0, x1, x2, x3, su)
        if BLOCK_M > 1:
            y0, y1, y2, y3 = gemv._x_planes(x1_ptr, offs_w, w_end, stride_xk, BITS, X_LOAD)
            acc_g1 = _folded_dot(acc_g1, wf, y0, y1, y2, y3, sg)
            if GLU:
                acc_u1 = _folded_dot(acc_u1, wu, y0, y1, y2, y3, su)
        sg = ng
        su = nu
        if STAGES == 3:
            w_g = a_g
            w_u = a_u
            a_g = n_g
            a_u = n_u
        else:
            w_g = n_g
            w_u = n_u
        offs_w += BLOCK_W
    out_scale = 1.0
    if BITS:
        out_scale = gemv.BITS_OUT_SCALE
    r0 = tl.sum(acc_g0, axis=1) * out_scale
    r1 = tl.sum(acc_g1, axis=1) * out_scale
    if GLU:  # tile column 2p: gate row p, 2p + 1: up row p (store_or_reduce's GLU pairs)
        r0 = tl.reshape(tl.join(r0, tl.sum(acc_u0, axis=1) * out_scale), (BLOCK_N,))
        r1 = tl.reshape(tl.join(r1, tl.sum(acc_u1, axis=1) * out_scale), (BLOCK_N,))
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    res = tl.where(offs_m[:, None] == 0, r0[None, :], 0.0)
    if BLOCK_M > 1:
        res = tl.where(offs_m[:, None] == 1, r1[None, :], res)
    store_or_reduce(res, offs_m, offs_n, (offs_m[:, None] < M) & (offs_n < N)[None, :],
                    out_ptr, stride_om, stride_on, part_ptr, stride_ps, stride_pm,
                    stride_pn, cnt_ptr, pid_n, pid_k, NUM_SPLITS, GLU=GLU)


def plan(n: int, k: int, block: tuple[int, int], glu: bool = False, m: int = 1
         ) -> tuple[int, int, int, int, int] | None:
    """(block_n, block_k, num_warps, waves, stages) for an [n, k] weight in ``block`` =
    (rows, columns) blocks, or None where the folded kernel cannot take it: the row-scaled
    GEMV's plan (``fp8_gemv._plan``) where each accumulator's rows lie inside one block row
    (with ``glu``, the halves' rows too: n / 2 a multiple of the block rows) and a word's 4
    weights inside one block column. ``m``: the rows of x (one row has a plan of its own
    for o's shape)."""
    rows, cols = block
    block_n, block_k, warps, waves, stages = gemv._plan(n, k)
    if m == 1 and n * k <= 4096 * 4096 and k % 1024 == 0:
        # o's shape (4,096 x 4,096) on an H200 (session 45, benchmarks/gemv_scaling.py):
        # 16 x 1,024 over 4 warps, 1 wave, 6.65 us from HBM against the row-scaled plan's
        # (8 x 512 over 8 warps) 7.68 (qkv and down: the row-scaled plans were best). Not
        # for two rows: there it compiles to 255 registers with local loads in the loop.
        block_n, block_k, warps, waves, stages = 16, 1024, 4, 1, 2
    half = block_n // 2 if glu else block_n
    if (cols % 4 or k % 4 or rows % half
            or (glu and (n % 2 or (n // 2) % rows))):
        return None
    return block_n, block_k, warps, waves, stages


def fp8_block_gemv_folded(x2: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                          block: tuple[int, int], glu: bool = False,
                          tiles: tuple[int, int, int, int, int] | None = None,
                          bits: bool | None = None, x_load: int | None = None
                          ) -> torch.Tensor:
    """``x2 [M, K] @ W^T`` for M <= gemv.MAX_M in x2's dtype, ``W = weight * scale`` of each
    ``block`` = (rows, columns) block (float32 ``scale`` [ceil(N / rows), ceil(K /
    columns)]); ``glu`` as ``fp8_gemv.fp8_gemv`` (output [M, N / 2]). ``tiles``: a plan
    (:func:`plan`'s tuple) instead of :func:`plan`'s, for the benchmark's sweeps; ``bits``,
    ``x_load`` as ``fp8_gemv.fp8_gemv``. Raises ValueError where :func:`plan` refuses the
    shape."""
    require_triton("fp8_block_gemv")
    m, k = x2.shape
    n = weight.shape[0]
    assert 1 <= m <= gemv.MAX_M and weight.shape[1] == k and weight.is_contiguous(), (
        x2.shape, weight.shape)
    assert scale.dtype == torch.float32 and tuple(scale.shape) == (
        -(-n // block[0]), -(-k // block[1])), (scale.shape, scale.dtype, n, k, block)
    chosen = tiles or plan(n, k, block, glu, m)
    if chosen is None:
        raise ValueError(f"fp8_block_gemv: no folded plan for [{n}, {k}] in {block} blocks"
                         f"{' (glu)' if glu else ''}")
    block_n, block_k, num_warps, waves, stages = chosen
    n_tiles, split_k, k_per_split = gemv.grid(n, k, block_n, block_k, waves, x2.device)
    out, partial = split_k_buffers(m, n, split_k, x2, out_n=n // 2 if glu else None)
    xs, x_load = gemv.x_view(x2, x_load)
    _fp8_block_gemv_kernel[(n_tiles, split_k)](
        xs, weight.view(torch.int32), scale, out, partial, split_k_counters(x2.device, n_tiles),
        m, n, k, k_per_split, split_k,
        xs.stride(0), xs.stride(1), k // 4, scale.stride(0), scale.stride(1),
        out.stride(0), out.stride(1), partial.stride(0), partial.stride(1), partial.stride(2),
        BLOCK_M=m, BLOCK_N=block_n, BLOCK_K=block_k,
        BITS=not x2.is_cuda if bits is None else bits, X_LOAD=x_load, GLU=glu, STAGES=stages,
        GROUP=block[1], ROW_BLOCK=block[0], num_warps=num_warps, **pdl_args(x2.device),
    )  # fmt: skip
    return out
