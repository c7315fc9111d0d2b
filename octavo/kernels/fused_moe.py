"""Fused mixture-of-experts MLP: each token's k routed experts, SiLU-gated, weighted and summed.

``out[t] = sum_j w[t, j] * (W2[e] @ (silu(W13[e, :I] @ x[t]) * (W13[e, I:] @ x[t])))``
with ``e = topk_ids[t, j]``, in two grouped GEMM launches instead of a loop over experts.

Why it is shaped this way:

- **Alignment.** The T*k (token, expert) pairs are sorted by expert and each expert's run is
  padded to a multiple of BLOCK_M (:func:`align_by_expert`), so every BLOCK_M tile of sorted
  rows belongs to one expert: a program loads that one expert's weight tile and runs ``tl.dot``
  on it against a gathered tile of rows, as a dense GEMM would. Padded slots hold the sentinel
  T*k and are masked.
- **No host synchronisation.** The engine captures decode steps in CUDA graphs, so no buffer's
  size may depend on the routing: the sorted index has room for the worst case,
  ``T*k + min(E, T*k) * (BLOCK_M - 1)`` rows rounded up to a tile (at most min(E, T*k)
  experts receive tokens, each wasting under a tile), and the grid covers all of it; tiles
  past the routing's end read the expert sentinel E and return at once. Up to
  ``moe_route.MAX_PAIRS`` pairs (decode) the alignment is one launch of one program
  (``octavo.kernels.moe_route``, which can also do the routing itself); beyond, torch ops that
  do not sync (counts by ``scatter_add_``, not ``bincount``, whose CUDA version reads the
  input's max on the host; a stable ``argsort``; ``cumsum``; ``searchsorted`` for each
  tile's expert). Both give the same rows.
- **Gate/up with the activation in its epilogue** (:func:`_gate_up_kernel`): one program
  accumulates the gate and the up tile of the same columns, so ``silu(gate) * up``
  (``octavo.kernels.activation.silu_mul``, float32) is applied before the store and the
  [T*k, 2I] pre-activation never reaches memory. The product is rounded to x's dtype once, as
  an unfused implementation in that dtype would feed the down projection.
- **Down projection, deterministic sum** (:func:`_down_kernel`): each (token, expert) row is
  multiplied by its routing weight and stored in float32 at its own slot of a [T, k, H]
  buffer; one more launch (:func:`_sum_pairs_kernel`) adds the k experts in order and rounds
  once. No atomics, so the result does not depend on program scheduling.

The intermediate activations are indexed by the (token, expert) pair (``t * k + j``), not by
the padded sorted position, so they take [T*k, I] and padded slots are never written.

Tiles (:func:`default_tiles`): BLOCK_M 16 while experts get few rows each (decode), 64 once
they average 32 or more; BLOCK_N = BLOCK_K = 64. These GPU tiles are unmeasured defaults, not
tuned. ``fused_moe_reference`` (a loop over experts in torch) is the reference the kernel is
tested against and the path where Triton cannot run.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from octavo.kernels import moe_route
from octavo.kernels.activation import silu_mul
from octavo.kernels.triton_utils import HAS_TRITON, interpreting, require_triton, tl, triton

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class MoeTiles(NamedTuple):
    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3


class Alignment(NamedTuple):
    """The (token, expert) pairs sorted by expert, each expert's run padded to BLOCK_M.

    ``sorted_ids`` int32 [padded_rows]: flat pair index ``t * k + j``, or T*k in padded slots.
    ``tile_experts`` int32 [padded_rows // BLOCK_M]: each tile's expert, or E past the end."""

    sorted_ids: torch.Tensor
    tile_experts: torch.Tensor


def default_tiles(num_tokens: int, topk: int, num_experts: int,
                  dtype: torch.dtype = torch.bfloat16, fp8: bool = False) -> MoeTiles:
    """GPU tiles for a launch: 64-row tiles once experts average 32+ rows (unmeasured); below,
    16 x 64 x 128, best or within 2% of the best of 8 at 1, 4, 16 and 64 tokens on an H100
    (Qwen3-30B-A3B's experts, ``benchmarks/moe_kernel.py``, 2026-12-05; 34.6 us a layer at one
    token against 38.9 for 16 x 64 x 64). Float32 keeps K steps of 64: three stages of 128
    would take 216 KB of shared memory. FP8 weights (``fp8``) decode in 16 x 32 x 128 tiles
    of four stages: 30.1 / 154.6 us a layer at 1 / 16 tokens against 36.6 / 164.7 for 16 x
    64 x 128 (H100, 128 x 128 blocks, session 43)."""
    if num_tokens * topk >= 32 * num_experts:
        return MoeTiles(64, 64, 64)
    if fp8 and dtype != torch.float32:
        return MoeTiles(16, 32, 128, 4, 4)
    return MoeTiles(16, 64, 64 if dtype == torch.float32 else 128)


def padded_rows(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Rows of the sorted index for ``num_pairs`` = T*k pairs: the worst case over routings."""
    worst = num_pairs + min(num_experts, num_pairs) * (block_m - 1)
    return -(-worst // block_m) * block_m


def align_by_expert(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> Alignment:
    """Sort the flattened ``topk_ids`` [T, k] by expert, padding each expert to ``block_m``
    rows; all sizes are functions of (T, k, E, block_m) only, and nothing syncs the host."""
    flat = topk_ids.reshape(-1).to(torch.int64)
    n = flat.numel()
    device = flat.device
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_ends = torch.cumsum(padded, 0)
    order = torch.argsort(flat, stable=True)
    sorted_experts = flat[order]
    # Rank of each sorted pair within its expert, placed after the expert's padded start.
    first = torch.cumsum(counts, 0) - counts
    rank = torch.arange(n, device=device) - first[sorted_experts]
    dest = (padded_ends - padded)[sorted_experts] + rank
    rows = padded_rows(n, num_experts, block_m)
    sorted_ids = torch.full((rows,), n, dtype=torch.int32, device=device)
    sorted_ids.scatter_(0, dest, order.to(torch.int32))
    tile_starts = torch.arange(0, rows, block_m, device=device)
    tile_experts = torch.searchsorted(padded_ends, tile_starts, right=True).to(torch.int32)
    return Alignment(sorted_ids, tile_experts)


def resolve_alignment(x: torch.Tensor, topk_ids: torch.Tensor, num_experts: int, block_m: int,
                      alignment: Alignment | None, caller: str) -> Alignment:
    """``alignment`` where given (checked against the rows tiles of ``block_m`` need), else
    the pairs of ``topk_ids`` aligned now: ``moe_route``'s one launch where it serves this
    size, else :func:`align_by_expert`."""
    pairs = topk_ids.numel()
    if alignment is not None:
        rows = padded_rows(pairs, num_experts, block_m)
        if alignment.sorted_ids.numel() != rows:
            raise ValueError(f"{caller}: the alignment holds {alignment.sorted_ids.numel()} "
                             f"rows, not the {rows} of {pairs} pairs in tiles of {block_m}")
        return alignment
    if moe_route.available(x, pairs, num_experts):
        routed = moe_route.align(topk_ids, num_experts, block_m)
        return Alignment(routed.sorted_ids, routed.tile_experts)
    return align_by_expert(topk_ids, num_experts, block_m)


@triton.jit
def _tile_rows(sorted_ptr, tiles_ptr, NUM_PAIRS, NUM_EXPERTS, BLOCK_M: tl.constexpr):
    """A program's tile: its expert (int64; NUM_EXPERTS past the routing's end), its pair
    indices and their mask (padded slots hold NUM_PAIRS)."""
    pid_m = tl.program_id(0)
    expert = tl.load(tiles_ptr + pid_m).to(tl.int64)
    pairs = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    return expert, pairs, pairs < NUM_PAIRS


@triton.jit
def _dot(a, b, acc, FP32_DOT: tl.constexpr):
    """``acc + a @ b``; FP32_DOT: in float32 at IEEE precision (float32 inputs, not TF32; and
    bf16 ones in the CPU interpreter, which mis-computes bf16 dots: exact products either way)."""
    if FP32_DOT:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc)


@triton.jit
def _scale(s_ptr, expert, rows, n_mask, k0, stride_se, stride_sn, SCALE_N, SCALE_K):
    """float32 [BLOCK_N]: the scales of weight rows ``rows`` for the K step at ``k0`` (a
    block-scaled FP8 expert's ``s[e, row // SCALE_N, k0 // SCALE_K]``; per-row scales are
    blocks of one row spanning K)."""
    return tl.load(s_ptr + expert * stride_se + (rows // SCALE_N) * stride_sn + k0 // SCALE_K,
                   mask=n_mask, other=0.0)


@triton.jit
def _scaled_dot(a, w, acc, s_ptr, expert, rows, n_mask, k0, stride_se, stride_sn, SCALE_N,
                SCALE_K, SCALED: tl.constexpr, FP32_DOT: tl.constexpr):
    """``acc + a @ w`` for a [BLOCK_K, BLOCK_N] weight tile as stored: float (SCALED 0), or
    FP8 converted exactly to a's dtype, times its rows' scales at the end (SCALED 1, one per
    row: :func:`_row_scaled`) or per K step (SCALED 2, blocks whose K side the step divides)."""
    if SCALED == 0:
        return _dot(a, w, acc, FP32_DOT)
    w = w.to(a.dtype)
    if SCALED == 1:
        return _dot(a, w, acc, FP32_DOT)
    part = _dot(a, w, tl.zeros(acc.shape, dtype=tl.float32), FP32_DOT)
    s = _scale(s_ptr, expert, rows, n_mask, k0, stride_se, stride_sn, SCALE_N, SCALE_K)
    return acc + part * s[None, :]


@triton.jit
def _row_scaled(acc, s_ptr, expert, rows, n_mask, stride_se, stride_sn, SCALED: tl.constexpr):
    """The accumulator times its rows' scales where they were left to the end (SCALED 1)."""
    if SCALED == 1:
        s = _scale(s_ptr, expert, rows, n_mask, 0, stride_se, stride_sn, 1, 1)
        return acc * s[None, :]
    return acc


@triton.jit
def _gate_up_kernel(
    x_ptr, w_ptr, out_ptr, sorted_ptr, tiles_ptr, s_ptr,
    NUM_PAIRS, NUM_EXPERTS, TOPK, H, INTER,
    stride_xt, stride_we, stride_wn, stride_op, stride_se, stride_sn, SCALE_N, SCALE_K,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    FP32_DOT: tl.constexpr, SCALED: tl.constexpr = 0,
):  # fmt: skip
    # Grid (sorted tiles, INTER tiles):
    # out[pair, n] = silu(x[t] @ W13[e, n]) * (x[t] @ W13[e, INTER + n]), in x's dtype.
    expert, pairs, m_mask = _tile_rows(sorted_ptr, tiles_ptr, NUM_PAIRS, NUM_EXPERTS, BLOCK_M)
    if expert >= NUM_EXPERTS:
        return
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < INTER
    tokens = pairs // TOPK
    w_base = w_ptr + expert * stride_we
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < H
        a = tl.load(x_ptr + tokens[:, None] * stride_xt + offs_k[None, :],
                    mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        # [BLOCK_K, BLOCK_N] views of the gate rows n and the up rows INTER + n (K contiguous).
        w_ptrs = w_base + offs_k[:, None] + offs_n[None, :] * stride_wn
        w_mask = k_mask[:, None] & n_mask[None, :]
        wg = tl.load(w_ptrs, mask=w_mask, other=0.0)
        wu = tl.load(w_ptrs + INTER * stride_wn, mask=w_mask, other=0.0)
        acc_g = _scaled_dot(a, wg, acc_g, s_ptr, expert, offs_n, n_mask, k0, stride_se,
                            stride_sn, SCALE_N, SCALE_K, SCALED, FP32_DOT)
        acc_u = _scaled_dot(a, wu, acc_u, s_ptr, expert, INTER + offs_n, n_mask, k0, stride_se,
                            stride_sn, SCALE_N, SCALE_K, SCALED, FP32_DOT)
    acc_g = _row_scaled(acc_g, s_ptr, expert, offs_n, n_mask, stride_se, stride_sn, SCALED)
    acc_u = _row_scaled(acc_u, s_ptr, expert, INTER + offs_n, n_mask, stride_se, stride_sn,
                        SCALED)
    h = silu_mul(acc_g, acc_u)
    tl.store(out_ptr + pairs[:, None] * stride_op + offs_n[None, :],
             h.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def _down_kernel(
    h_ptr, w_ptr, weights_ptr, out_ptr, sorted_ptr, tiles_ptr, s_ptr,
    NUM_PAIRS, NUM_EXPERTS, H, INTER,
    stride_hp, stride_we, stride_wn, stride_op, stride_se, stride_sn, SCALE_N, SCALE_K,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    FP32_DOT: tl.constexpr, SCALED: tl.constexpr = 0,
):  # fmt: skip
    # Grid (sorted tiles, H tiles). out[pair, n] = weight[pair] * (h[pair] @ W2[e, n]), float32.
    expert, pairs, m_mask = _tile_rows(sorted_ptr, tiles_ptr, NUM_PAIRS, NUM_EXPERTS, BLOCK_M)
    if expert >= NUM_EXPERTS:
        return
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < H
    w_base = w_ptr + expert * stride_we
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, INTER, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < INTER
        a = tl.load(h_ptr + pairs[:, None] * stride_hp + offs_k[None, :],
                    mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        w = tl.load(w_base + offs_k[:, None] + offs_n[None, :] * stride_wn,
                    mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        acc = _scaled_dot(a, w, acc, s_ptr, expert, offs_n, n_mask, k0, stride_se, stride_sn,
                          SCALE_N, SCALE_K, SCALED, FP32_DOT)
    acc = _row_scaled(acc, s_ptr, expert, offs_n, n_mask, stride_se, stride_sn, SCALED)
    weight = tl.load(weights_ptr + pairs, mask=m_mask, other=0.0)
    tl.store(out_ptr + pairs[:, None] * stride_op + offs_n[None, :], acc * weight[:, None],
             mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def _sum_pairs_kernel(partial_ptr, out_ptr, weights_ptr, H, TOPK: tl.constexpr,
                      BLOCK_H: tl.constexpr, WEIGHTED: tl.constexpr = False):
    # Grid (T, H tiles): out[t] = sum over j in order of partial[t * TOPK + j] (times
    # weights[t * TOPK + j] where WEIGHTED), in float32, rounded once.
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    ok = cols < H
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for j in tl.static_range(TOPK):
        row = tl.load(partial_ptr + (t * TOPK + j) * H + cols, mask=ok, other=0.0)
        if WEIGHTED:
            row = row.to(tl.float32) * tl.load(weights_ptr + t * TOPK + j)
        acc += row
    tl.store(out_ptr + t * H + cols, acc.to(out_ptr.dtype.element_ty), mask=ok)


def sum_pairs(partial: torch.Tensor, t: int, k: int, dtype: torch.dtype,
              weights: torch.Tensor | None = None) -> torch.Tensor:
    """[T, H] in ``dtype``: each token's k rows of ``partial`` [T * k, H] added in order in
    float32 (each times its float32 routing weight where ``weights`` [T * k] is given)."""
    h = partial.shape[1]
    out = torch.empty(t, h, dtype=dtype, device=partial.device)
    block_h = 1024
    _sum_pairs_kernel[(t, triton.cdiv(h, block_h))](
        partial, out, partial if weights is None else weights, h, TOPK=k, BLOCK_H=block_h,
        WEIGHTED=weights is not None, num_warps=4)
    return out


class Fp8Experts(NamedTuple):
    """Stacked FP8 (e4m3) experts, weight-only: ``W = w * s`` with float32 scales per output
    row (``block`` None: ``s13`` [E, 2I], ``s2`` [E, H]) or per block of ``block`` = (rows,
    columns) of each weight (``s13`` [E, ceil(2I / rows), ceil(H / columns)], ``s2`` [E,
    ceil(H / rows), ceil(I / columns)]; the gate/up split must fall on a block edge)."""

    w13: torch.Tensor  # float8_e4m3fn [E, 2I, H]
    w2: torch.Tensor  # float8_e4m3fn [E, H, I]
    s13: torch.Tensor
    s2: torch.Tensor
    block: tuple[int, int] | None = None


FP8 = getattr(torch, "float8_e4m3fn", None)


def supports(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
             fp8: Fp8Experts | None = None) -> bool:
    """True where :func:`fused_moe` can run these tensors: Triton importable, x on CUDA (or
    the Triton interpreter on), one float16/bfloat16/float32 dtype for all three (FP8
    weights where ``fp8`` holds them: on CUDA from compute capability 8.9), contiguous
    weights, x [T, H], w13 [E, 2I, H], w2 [E, H, I]."""
    if not HAS_TRITON or not (x.is_cuda or interpreting()):
        return False
    wdt = x.dtype if fp8 is None else FP8
    if x.dtype not in _DTYPES or w13.dtype != wdt or w2.dtype != wdt:
        return False
    if fp8 is not None and x.is_cuda and torch.cuda.get_device_capability(x.device) < (8, 9):
        return False
    if x.dim() != 2 or w13.dim() != 3 or w2.dim() != 3:
        return False
    e, two_i, h = w13.shape
    return (two_i % 2 == 0 and two_i > 0 and h == x.shape[1] and h > 0
            and tuple(w2.shape) == (e, h, two_i // 2)
            and w13.is_contiguous() and w2.is_contiguous())


def _scale_args(fp8: Fp8Experts | None, which: str, n: int, k: int, block_k: int, dummy):
    """(scales, stride_se, stride_sn, SCALE_N, SCALE_K, SCALED) of one launch's weight [E, n,
    k]; errors name the shape that does not fit."""
    if fp8 is None:
        return dummy, 0, 0, 1, 1, 0
    s = getattr(fp8, "s" + which)
    e = getattr(fp8, "w" + which).shape[0]
    if fp8.block is None:
        if tuple(s.shape) != (e, n) or s.dtype != torch.float32 or s.stride(1) != 1:
            raise ValueError(f"fused_moe: s{which} is {tuple(s.shape)} {s.dtype}, not float32 "
                             f"{(e, n)} (one scale per row)")
        return s, s.stride(0), 1, 1, 1, 1
    bn, bk = fp8.block
    want = (e, -(-n // bn), -(-k // bk))
    if tuple(s.shape) != want or s.dtype != torch.float32 or not s.is_contiguous():
        raise ValueError(f"fused_moe: s{which} is {tuple(s.shape)} {s.dtype}, not float32 "
                         f"{want} (blocks of {fp8.block})")
    if bk % block_k:
        raise ValueError(f"fused_moe: a K step of {block_k} does not divide the scale blocks' "
                         f"{bk} columns")
    return s, s.stride(0), s.stride(1), bn, bk, 2


def fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
              topk_weights: torch.Tensor, topk_ids: torch.Tensor, *,
              tiles: MoeTiles | None = None,
              alignment: Alignment | None = None,
              fp8: Fp8Experts | None = None) -> torch.Tensor:
    """``x`` [T, H], ``w13`` [E, 2I, H] (gate rows then up rows), ``w2`` [E, H, I],
    ``topk_weights`` float32 [T, k], ``topk_ids`` int [T, k] in [0, E) -> [T, H] in x's dtype:
    ``sum_j topk_weights[t, j] * (w2[e] @ (silu(w13[e, :I] @ x[t]) * (w13[e, I:] @ x[t])))``.
    The activation product is rounded to x's dtype before the down projection; accumulation
    and the sum over experts are float32. ``tiles``: overrides :func:`default_tiles`;
    ``alignment``: the pairs already aligned for the tiles' BLOCK_M (``moe_route``);
    ``fp8``: the weights are its FP8 ones (pass ``fp8.w13``, ``fp8.w2``), each tile converted
    exactly to x's dtype in the main loop, its scales applied to the float32 sums (per K
    step for blocks, at the end for rows)."""
    require_triton("fused_moe")
    assert supports(x, w13, w2, fp8), (x.shape, x.dtype, w13.shape, w13.dtype, w2.shape,
                                       w2.dtype)
    t, h = x.shape
    e, two_i, _ = w13.shape
    inter = two_i // 2
    k = topk_ids.shape[1]
    if t == 0:
        return x.new_empty(0, h)
    x = x if x.stride(1) == 1 else x.contiguous()
    block_m, block_n, block_k, warps, stages = tiles or default_tiles(t, k, e, x.dtype,
                                                                      fp8 is not None)
    if fp8 is not None and fp8.block is not None:
        block_k = min(block_k, fp8.block[1])
        if inter % fp8.block[0]:
            raise ValueError(f"fused_moe: the gate/up split at row {inter} is not on an edge "
                             f"of the {fp8.block} scale blocks")
    s13 = _scale_args(fp8, "13", two_i, h, block_k, w13)
    s2 = _scale_args(fp8, "2", h, inter, block_k, w2)
    align = resolve_alignment(x, topk_ids, e, block_m, alignment, "fused_moe")
    n_tiles = align.tile_experts.numel()
    fp32_dot = x.dtype == torch.float32 or (x.dtype == torch.bfloat16 and not x.is_cuda)
    hidden = torch.empty(t * k, inter, dtype=x.dtype, device=x.device)
    _gate_up_kernel[(n_tiles, triton.cdiv(inter, block_n))](
        x, w13, hidden, align.sorted_ids, align.tile_experts, s13[0],
        t * k, e, k, h, inter,
        x.stride(0), w13.stride(0), w13.stride(1), hidden.stride(0), *s13[1:5],
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, FP32_DOT=fp32_dot, SCALED=s13[5],
        num_warps=warps, num_stages=stages,
    )  # fmt: skip
    weights = topk_weights.reshape(-1).to(torch.float32).contiguous()
    partial = torch.empty(t * k, h, dtype=torch.float32, device=x.device)
    _down_kernel[(n_tiles, triton.cdiv(h, block_n))](
        hidden, w2, weights, partial, align.sorted_ids, align.tile_experts, s2[0],
        t * k, e, h, inter,
        hidden.stride(0), w2.stride(0), w2.stride(1), partial.stride(0), *s2[1:5],
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, FP32_DOT=fp32_dot, SCALED=s2[5],
        num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return sum_pairs(partial, t, k, x.dtype)


def dequantize_fp8_weight(w: torch.Tensor, s: torch.Tensor,
                          block: tuple[int, int] | None) -> torch.Tensor:
    """FP8 weights [..., N, K] times their scales, float32: per row (``block`` None, ``s``
    [..., N]) or per ``block`` = (rows, columns) (``s`` [..., ceil(N / rows), ceil(K /
    columns)])."""
    if block is None:
        return w.float() * s.float()[..., None]
    full = s.float().repeat_interleave(block[0], -2).repeat_interleave(block[1], -1)
    return w.float() * full[..., :w.shape[-2], :w.shape[-1]]


def dequantize_fp8_experts(fp8: Fp8Experts) -> tuple[torch.Tensor, torch.Tensor]:
    """(w13, w2) float32: each FP8 weight times its row's or block's scale."""
    return (dequantize_fp8_weight(fp8.w13, fp8.s13, fp8.block),
            dequantize_fp8_weight(fp8.w2, fp8.s2, fp8.block))


def fused_moe_reference(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                        topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """:func:`fused_moe` as a loop over experts in torch (float32 math, the activation product
    rounded to x's dtype, one rounding of the result)."""
    t, h = x.shape
    inter = w13.shape[1] // 2
    out = torch.zeros(t, h, dtype=torch.float32, device=x.device)
    xf = x.float()
    for e in range(w13.shape[0]):
        tok, slot = torch.nonzero(topk_ids == e, as_tuple=True)
        if tok.numel() == 0:
            continue
        gate_up = xf[tok] @ w13[e].float().t()
        act = (F.silu(gate_up[:, :inter]) * gate_up[:, inter:]).to(x.dtype).float()
        y = (act @ w2[e].float().t()) * topk_weights[tok, slot].float()[:, None]
        out.index_add_(0, tok, y)
    return out.to(x.dtype)
