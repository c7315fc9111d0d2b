"""Fused mixture-of-experts MLP over weight-only integer experts (GPTQ, AWQ, compressed-tensors
W4A16 / W8A16): ``fused_moe``'s two grouped launches with each weight tile dequantized in the
main loop, so a quantized MoE model's decode step is a few launches, graph-capturable, instead
of a loop over experts that reads the routing on the host.

The experts keep the along-K layout of ``octavo.kernels.w4a16_gemm`` (each expert's linear
layers repack into it at load), stacked: ``qweight`` int32 [E, K / pack, N], ``scales`` and
``zeros`` (floats holding integers) [E, K / group, N], ``W[e, k, n] = (q - zeros) * scales``
of k's group. gate/up is the merged [K = H, N = 2I] weight (gate columns, then up), down is
[K = I, N = H]. Act order (GPTQ ``desc_act``): each expert's rows were sorted by group at
load and the activations follow through that expert's permutation, here a gather of the
A tile's columns (``perm13`` [E, H], ``perm2`` [E, I]).

Alignment, routing, the SiLU-gated epilogue, the routing weight on the down projection's
float32 rows and the ordered k-sum are ``fused_moe``'s (same helpers, same rounding points:
the activation product is rounded to x's dtype once before the down projection).

Each weight value is put into 2**23's mantissa (no conversion instruction), ``(q - z) * s``
is computed in float32 and rounded to x's dtype before the dot, as the dense integer GEMM
does. Measured and dropped (H100, session 42): 4-bit values as exact ``bias + q`` 16-bit
floats by one OR into the exponent's pattern, zero points and scales applied to the tile's
sums: 8% fewer loop instructions offline, but 1.2-2.3x slower (Qwen3-30B-A3B's experts,
one token: 62-113 us a layer against 43-50).

``fused_moe_int_reference`` (dequantize each routed expert, then the float reference) is what
the kernel is tested against.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from octavo import envs
from octavo.kernels import fused_moe as moe
from octavo.kernels import w4a16_gemm as along_k
from octavo.kernels import w4a16_gemv as gemv
from octavo.kernels.activation import silu_and_mul, silu_mul
from octavo.kernels.triton_utils import HAS_TRITON, interpreting, require_triton, tl, triton


class IntExperts(NamedTuple):
    """Stacked integer experts (one rank's shard under tensor parallelism)."""

    w13: torch.Tensor  # int32 [E, H / pack, 2I]
    s13: torch.Tensor  # [E, H / group13, 2I]
    z13: torch.Tensor  # [E, H / group13, 2I]
    w2: torch.Tensor  # int32 [E, I / pack, H]
    s2: torch.Tensor  # [E, I / group2, H]
    z2: torch.Tensor  # [E, I / group2, H]
    group13: int
    group2: int
    bits: int
    perm13: torch.Tensor | None = None  # int32 [E, H]: expert e's input column order
    perm2: torch.Tensor | None = None  # int32 [E, I]

    @property
    def num_experts(self) -> int:
        return self.w13.shape[0]

    @property
    def hidden(self) -> int:
        return self.w13.shape[1] * (32 // self.bits)

    @property
    def inter(self) -> int:
        return self.w13.shape[2] // 2


def block_k(experts: IntExperts) -> int:
    """The K step both launches take: at most 64 (a dequantized float32 tile of 128 x 64
    values per operand spills at four warps), dividing both groups and both K."""
    for bk in (64, 32, 16):
        if all(g % bk == 0 for g in (experts.group13, experts.group2, experts.hidden,
                                     experts.inter)):
            return bk
    raise ValueError(f"fused_moe_int: groups {experts.group13} / {experts.group2} and K "
                     f"{experts.hidden} / {experts.inter} have no common step of 16 or more")


def default_tiles(num_tokens: int, topk: int, experts: IntExperts) -> moe.MoeTiles:
    """``fused_moe``'s rows per tile (16 in decode, 64 once experts average 32 rows). Columns
    and K steps from ``benchmarks/moe_kernel.py --bits 4`` on an H100 (Qwen3-30B-A3B's
    experts, g128, session 42): with fewer (token, expert) pairs than experts, 32 columns
    and K steps of 128 over 4 stages where the groups allow (43.3 us a layer at one token
    against 49.8 for 64 x 64 x 3); otherwise 64 x :func:`block_k` (198 us at 16 tokens,
    the best of 7)."""
    rows = moe.default_tiles(num_tokens, topk, experts.num_experts).block_m
    wide = all(g % 128 == 0 for g in (experts.group13, experts.group2, experts.hidden,
                                      experts.inter))
    if num_tokens * topk < experts.num_experts and wide:
        return moe.MoeTiles(rows, 32, 128, 4, 4)
    return moe.MoeTiles(rows, 64, block_k(experts))


def supports(x: torch.Tensor, experts: IntExperts) -> bool:
    """Whether :func:`fused_moe_int` runs these tensors: Triton, x on CUDA (or the
    interpreter) in float16 / bfloat16 / float32, 4- or 8-bit experts of x's width whose
    groups and widths allow a common K step."""
    if not HAS_TRITON or not (x.is_cuda or interpreting()) or x.dim() != 2:
        return False
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32) or experts.bits not in (
            4, 8) or experts.hidden != x.shape[1]:
        return False
    try:
        block_k(experts)
    except ValueError:
        return False
    return True


@triton.jit
def _weight_tile(qw_ptr, s_ptr, z_ptr, k0, offs_n, n_mask, stride_qk, stride_sg,
                 GROUP: tl.constexpr, BITS: tl.constexpr, BLOCK_K: tl.constexpr,
                 BLOCK_N: tl.constexpr):
    """The float32 [BLOCK_K, BLOCK_N] tile of rows k0.. and columns offs_n of one expert's
    along-K weight: each packed int32 loaded once and spread over its rows, the value put
    into 2**23's mantissa (no conversion instruction), then (q - zero) * scale of the group."""
    PACK: tl.constexpr = 32 // BITS
    MASK: tl.constexpr = (1 << BITS) - 1
    offs_p = k0 // PACK + tl.arange(0, BLOCK_K // PACK)
    packed = tl.load(qw_ptr + offs_p[:, None] * stride_qk + offs_n[None, :],
                     mask=n_mask[None, :], other=0)
    shifts = tl.arange(0, PACK) * BITS
    bits = tl.reshape((packed[:, None, :] >> shifts[None, :, None]) & MASK, (BLOCK_K, BLOCK_N))
    q = (bits | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
    g = k0 // GROUP
    s = along_k.group_row(s_ptr, g, stride_sg, offs_n, 1, n_mask)
    z = along_k.group_row(z_ptr, g, stride_sg, offs_n, 1, n_mask)
    return q * s[None, :] - (z * s)[None, :]


@triton.jit
def _step(a, qw_ptr, s_ptr, z_ptr, k0, offs_n, n_mask, stride_qk, stride_sg, acc,
          GROUP: tl.constexpr, BITS: tl.constexpr, FP32_DOT: tl.constexpr,
          BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
    """``acc + a @ W[k0:k0 + BLOCK_K, offs_n]``, the weight tile rounded to a's dtype."""
    w = _weight_tile(qw_ptr, s_ptr, z_ptr, k0, offs_n, n_mask, stride_qk, stride_sg, GROUP,
                     BITS, BLOCK_K, BLOCK_N)
    return moe._dot(a, w.to(a.dtype), acc, FP32_DOT)


@triton.jit
def _expert_tile(qw_ptr, s_ptr, z_ptr, perm_ptr, sorted_ptr, tiles_ptr, NUM_PAIRS, NUM_EXPERTS,
                 N, stride_qe, stride_se, stride_pe, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr):
    """A program's tile (``moe._tile_rows``), its columns of N with their mask, and its
    expert's weight, scales, zeros and permutation pointers."""
    expert, pairs, m_mask = moe._tile_rows(sorted_ptr, tiles_ptr, NUM_PAIRS, NUM_EXPERTS,
                                           BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    return (expert, pairs, m_mask, offs_n, offs_n < N, qw_ptr + expert * stride_qe,
            s_ptr + expert * stride_se, z_ptr + expert * stride_se, perm_ptr + expert * stride_pe)


@triton.jit
def _columns(perm_ptr, k0, BLOCK_K: tl.constexpr, PERM: tl.constexpr):
    """The A tile's columns for K rows k0..: the expert's act-order permutation (int32), or
    k (one type on both branches: compiled Triton requires it, the interpreter does not)."""
    offs_k = k0 + tl.arange(0, BLOCK_K)
    if PERM:
        return tl.load(perm_ptr + offs_k)
    return offs_k


@triton.jit
def _int_gate_up_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, perm_ptr, out_ptr, sorted_ptr, tiles_ptr,
    NUM_PAIRS, NUM_EXPERTS, TOPK, H, INTER,
    stride_xt, stride_qe, stride_qk, stride_se, stride_sg, stride_pe, stride_op,
    GROUP: tl.constexpr, BITS: tl.constexpr, PERM: tl.constexpr, FP32_DOT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    # Grid (sorted tiles, INTER tiles): out[pair, n] = silu(x[t] @ Wg) * (x[t] @ Wu), x's dtype.
    expert, pairs, m_mask, offs_n, n_mask, qw, s, z, perm = _expert_tile(
        qw_ptr, s_ptr, z_ptr, perm_ptr, sorted_ptr, tiles_ptr, NUM_PAIRS, NUM_EXPERTS, INTER,
        stride_qe, stride_se, stride_pe, BLOCK_M, BLOCK_N)
    if expert >= NUM_EXPERTS:
        return
    tokens = pairs // TOPK
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        cols = _columns(perm, k0, BLOCK_K, PERM)
        a = tl.load(x_ptr + tokens[:, None] * stride_xt + cols[None, :], mask=m_mask[:, None],
                    other=0.0)
        acc_g = _step(a, qw, s, z, k0, offs_n, n_mask, stride_qk, stride_sg, acc_g, GROUP, BITS,
                      FP32_DOT, BLOCK_K, BLOCK_N)
        acc_u = _step(a, qw, s, z, k0, offs_n + INTER, n_mask, stride_qk, stride_sg, acc_u,
                      GROUP, BITS, FP32_DOT, BLOCK_K, BLOCK_N)
    h = silu_mul(acc_g, acc_u)
    tl.store(out_ptr + pairs[:, None] * stride_op + offs_n[None, :],
             h.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def _int_down_kernel(
    h_ptr, qw_ptr, s_ptr, z_ptr, perm_ptr, weights_ptr, out_ptr, sorted_ptr, tiles_ptr,
    NUM_PAIRS, NUM_EXPERTS, H, INTER,
    stride_hp, stride_qe, stride_qk, stride_se, stride_sg, stride_pe, stride_op,
    GROUP: tl.constexpr, BITS: tl.constexpr, PERM: tl.constexpr, FP32_DOT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    # Grid (sorted tiles, H tiles): out[pair, n] = weight[pair] * (h[pair] @ W2[e][:, n]), f32.
    expert, pairs, m_mask, offs_n, n_mask, qw, s, z, perm = _expert_tile(
        qw_ptr, s_ptr, z_ptr, perm_ptr, sorted_ptr, tiles_ptr, NUM_PAIRS, NUM_EXPERTS, H,
        stride_qe, stride_se, stride_pe, BLOCK_M, BLOCK_N)
    if expert >= NUM_EXPERTS:
        return
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, INTER, BLOCK_K):
        cols = _columns(perm, k0, BLOCK_K, PERM)
        a = tl.load(h_ptr + pairs[:, None] * stride_hp + cols[None, :], mask=m_mask[:, None],
                    other=0.0)
        acc = _step(a, qw, s, z, k0, offs_n, n_mask, stride_qk, stride_sg, acc, GROUP, BITS,
                    FP32_DOT, BLOCK_K, BLOCK_N)
    weight = tl.load(weights_ptr + pairs, mask=m_mask, other=0.0)
    tl.store(out_ptr + pairs[:, None] * stride_op + offs_n[None, :], acc * weight[:, None],
             mask=m_mask[:, None] & n_mask[None, :])


def _check(experts: IntExperts) -> None:
    e, kp, two_i = experts.w13.shape
    h, inter = experts.hidden, experts.inter
    want = {"w13": (e, kp, two_i), "s13": (e, h // experts.group13, two_i),
            "z13": (e, h // experts.group13, two_i),
            "w2": (e, inter // (32 // experts.bits), h), "s2": (e, inter // experts.group2, h),
            "z2": (e, inter // experts.group2, h)}
    for name, shape in want.items():
        t = getattr(experts, name)
        if tuple(t.shape) != shape or not t.is_contiguous():
            raise ValueError(f"fused_moe_int: {name} is {tuple(t.shape)}"
                             f"{'' if t.is_contiguous() else ' (not contiguous)'}, expected "
                             f"{shape} contiguous")
    for name, width in (("perm13", h), ("perm2", inter)):
        p = getattr(experts, name)
        if p is not None and (tuple(p.shape) != (e, width) or not p.is_contiguous()):
            raise ValueError(f"fused_moe_int: {name} is {tuple(p.shape)}, expected {(e, width)}")


def fused_moe_int(x: torch.Tensor, experts: IntExperts, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor, *, tiles: moe.MoeTiles | None = None,
                  alignment: moe.Alignment | None = None) -> torch.Tensor:
    """``fused_moe`` over stacked integer experts: ``x`` [T, H], ``topk_weights`` float32
    [T, k], ``topk_ids`` [T, k] in [0, E) -> [T, H] in x's dtype. ``tiles`` overrides
    :func:`default_tiles`; ``alignment``: the pairs already aligned for its BLOCK_M."""
    require_triton("fused_moe_int")
    if not supports(x, experts):
        raise ValueError(f"fused_moe_int: x {tuple(x.shape)} {x.dtype} on {x.device} with "
                         f"{experts.bits}-bit experts of width {experts.hidden} is not "
                         "supported")
    _check(experts)
    t, h = x.shape
    e, inter, k = experts.num_experts, experts.inter, topk_ids.shape[1]
    if t == 0:
        return x.new_empty(0, h)
    x = x if x.stride(1) == 1 else x.contiguous()
    if tiles is None and gemv_applies(experts, t * k):
        return _gemv_path(x, experts, topk_weights, topk_ids)
    block_m, block_n, bk, warps, stages = tiles or default_tiles(t, k, experts)
    if any(g % bk for g in (experts.group13, experts.group2, h, inter)):
        raise ValueError(f"fused_moe_int: BLOCK_K={bk} must divide the groups "
                         f"({experts.group13}, {experts.group2}) and K ({h}, {inter})")
    align = moe.resolve_alignment(x, topk_ids, e, block_m, alignment, "fused_moe_int")
    n_tiles = align.tile_experts.numel()
    fp32_dot = x.dtype == torch.float32 or (x.dtype == torch.bfloat16 and not x.is_cuda)
    perm13, perm2 = experts.perm13, experts.perm2
    hidden = torch.empty(t * k, inter, dtype=x.dtype, device=x.device)
    _int_gate_up_kernel[(n_tiles, triton.cdiv(inter, block_n))](
        x, experts.w13, experts.s13, experts.z13, perm13 if perm13 is not None else x,
        hidden, align.sorted_ids, align.tile_experts,
        t * k, e, k, h, inter,
        x.stride(0), experts.w13.stride(0), experts.w13.stride(1), experts.s13.stride(0),
        experts.s13.stride(1), h, hidden.stride(0),
        GROUP=experts.group13, BITS=experts.bits, PERM=perm13 is not None, FP32_DOT=fp32_dot,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=bk, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    weights = topk_weights.reshape(-1).to(torch.float32).contiguous()
    partial = torch.empty(t * k, h, dtype=torch.float32, device=x.device)
    _int_down_kernel[(n_tiles, triton.cdiv(h, block_n))](
        hidden, experts.w2, experts.s2, experts.z2, perm2 if perm2 is not None else x,
        weights, partial, align.sorted_ids, align.tile_experts,
        t * k, e, h, inter,
        hidden.stride(0), experts.w2.stride(0), experts.w2.stride(1), experts.s2.stride(0),
        experts.s2.stride(1), inter, partial.stride(0),
        GROUP=experts.group2, BITS=experts.bits, PERM=perm2 is not None, FP32_DOT=fp32_dot,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=bk, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return moe.sum_pairs(partial, t, k, x.dtype)


def gemv_applies(experts: IntExperts, num_pairs: int) -> bool:
    """Whether :func:`fused_moe_int` takes the grouped GEMV for ``num_pairs`` (token, expert)
    pairs: up to ``OCTAVO_MOE_INT_GEMV`` of them (default 128), experts without act
    order whose groups the GEMV's steps fit."""
    return (0 < num_pairs <= envs.moe_int_gemv_max_pairs()
            and experts.perm13 is None and experts.perm2 is None
            and gemv.supports(1, experts.hidden, experts.group13, experts.bits)
            and gemv.supports(1, experts.inter, experts.group2, experts.bits))


def _gemv_path(x: torch.Tensor, experts: IntExperts, topk_weights: torch.Tensor,
               topk_ids: torch.Tensor) -> torch.Tensor:
    """Decode on CUDA cores, no sorting: the grouped GEMV gives each (token, expert) pair its
    gate/up row (rounded to x's dtype, as the loop over experts stores it), the activation,
    the grouped GEMV again for the down rows, then each token's k rows weighted and added in
    order in float32."""
    t, k = topk_ids.shape
    ids = topk_ids.reshape(-1).to(torch.int32)
    pairs = torch.arange(t * k, device=x.device, dtype=torch.int32)
    gate_up = gemv.w4a16_gemv(x, experts.w13, experts.s13, experts.z13, experts.group13,
                              experts.bits, rows=pairs // k, experts=ids)
    down = gemv.w4a16_gemv(silu_and_mul(gate_up), experts.w2, experts.s2, experts.z2,
                           experts.group2, experts.bits, rows=pairs, experts=ids)
    weights = topk_weights.reshape(-1).to(torch.float32).contiguous()
    return moe.sum_pairs(down, t, k, x.dtype, weights)


def dequantize(experts: IntExperts, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The float experts ``(w13 [E, 2I, H], w2 [E, H, I])`` in ``fused_moe``'s layout, in the
    checkpoint's input order (act-order permutations undone), rounded once to ``dtype``."""
    w13, w2 = [], []
    for e in range(experts.num_experts):
        for qw, s, z, g, perm, out in (
                (experts.w13, experts.s13, experts.z13, experts.group13, experts.perm13, w13),
                (experts.w2, experts.s2, experts.z2, experts.group2, experts.perm2, w2)):
            w = along_k.dequantize_ref(qw[e], s[e], z[e], g, experts.bits, torch.float32)
            if perm is not None:  # row i of w is input feature perm[e, i]
                w = torch.empty_like(w).index_copy_(0, perm[e].long(), w)
            out.append(w.t().to(dtype))
    return torch.stack(w13), torch.stack(w2)


def fused_moe_int_reference(x: torch.Tensor, experts: IntExperts, topk_weights: torch.Tensor,
                            topk_ids: torch.Tensor) -> torch.Tensor:
    """:func:`fused_moe_int` as dequantize-then-``fused_moe_reference``."""
    w13, w2 = dequantize(experts, x.dtype)
    return moe.fused_moe_reference(x, w13, w2, topk_weights, topk_ids)
