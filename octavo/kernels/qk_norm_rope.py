"""Qwen3's per-head RMSNorm of q and k followed by rotary embedding, in one launch, in place.

Unfused, a layer pays five launches here: q and k are strided slices of the fused QKV output,
so each RMSNorm first copies its input contiguous, then normalises, and a third kernel
rotates both. At decode batch sizes each launch costs more than the bytes it moves, so one
program per token now normalises every head of q and k (fp32 statistics), rounds as the
separate kernels do (normalised value to the dtype, times the weight, to the dtype), rotates
(NeoX pairs, fp32 math) and writes back into the QKV output: the values of ``rms_norm`` then
``rotary_embedding`` (up to the order of the variance's sum), with no copies.
"""

from __future__ import annotations

import torch

from octavo.attention.backend import KVStore
from octavo.kernels.pdl import begin as pdl_begin
from octavo.kernels.pdl import launch_args as pdl_args
from octavo.kernels.reshape_and_cache import kv_store_args, load_token_kv, store_token_kv
from octavo.kernels.rms_norm import rms_norm_ref
from octavo.kernels.rotary import (
    load_heads,
    rotary_embedding_ref,
    rotate_store,
    token_cos_sin,
)
from octavo.kernels.triton_utils import next_power_of_2, require_triton, tl, triton


@triton.jit
def _norm_heads(x_ptr, x1, x2, w1, w2, eps, HEAD_DIM: tl.constexpr):
    """Per-head RMSNorm of ``load_heads``' float32 halves, rounded as the separate kernels
    round (normalised value to x's dtype, times the weight, to x's dtype), in float32."""
    dt = x_ptr.dtype.element_ty
    var = (tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / HEAD_DIM
    rstd = (1.0 / tl.sqrt(var + eps))[:, None]
    y1 = ((x1 * rstd).to(dt).to(tl.float32) * w1[None, :]).to(dt).to(tl.float32)
    y2 = ((x2 * rstd).to(dt).to(tl.float32) * w2[None, :]).to(dt).to(tl.float32)
    return y1, y2


@triton.jit
def _qk_norm_rope_kernel(
    q_ptr, k_ptr, pos_ptr, cache_ptr, qw_ptr, kw_ptr,
    v_ptr, kc_ptr, vc_ptr, slot_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_cache,
    stride_vt, stride_vh, stride_cb, stride_ct, stride_ch, block_size,
    num_q_heads, num_k_heads, eps,
    HALF: tl.constexpr, HALF_P: tl.constexpr, QH_P: tl.constexpr, KH_P: tl.constexpr,
    STORE_KV: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    # One program per token: every head shares the token's cos / sin row and the weights.
    t = tl.program_id(0).to(tl.int64)
    offs_r = tl.arange(0, HALF_P)
    r_ok = offs_r < HALF
    qw1 = tl.load(qw_ptr + offs_r, mask=r_ok, other=0.0).to(tl.float32)
    qw2 = tl.load(qw_ptr + HALF + offs_r, mask=r_ok, other=0.0).to(tl.float32)
    kw1 = tl.load(kw_ptr + offs_r, mask=r_ok, other=0.0).to(tl.float32)
    kw2 = tl.load(kw_ptr + HALF + offs_r, mask=r_ok, other=0.0).to(tl.float32)
    pdl_begin(PDL)  # the weights above are read before the wait; positions and q / k after
    offs_q = tl.arange(0, QH_P)
    offs_k = tl.arange(0, KH_P)
    # Every input first (none depends on another, and a load after a store must wait for
    # it): at one token the launch is a chain of memory round trips, not bandwidth.
    q1, q2, q_mask = load_heads(q_ptr, t, stride_qt, stride_qh, num_q_heads, offs_q, offs_r,
                                 HALF, True)
    k1, k2, k_mask = load_heads(k_ptr, t, stride_kt, stride_kh, num_k_heads, offs_k, offs_r,
                                 HALF, True)
    if STORE_KV:
        slot, v = load_token_kv(v_ptr, slot_ptr, t, stride_vt, stride_vh, num_k_heads, KH_P,
                                HALF, HALF_P)
    cos, sin = token_cos_sin(pos_ptr, cache_ptr, t, stride_cache, offs_r, HALF)
    q1, q2 = _norm_heads(q_ptr, q1, q2, qw1, qw2, eps, 2 * HALF)
    rotate_store(q_ptr, q1, q2, q_mask, t, stride_qt, stride_qh, cos, sin, offs_q, offs_r,
                  HALF, True)
    k1, k2 = _norm_heads(k_ptr, k1, k2, kw1, kw2, eps, 2 * HALF)
    k1, k2 = rotate_store(k_ptr, k1, k2, k_mask, t, stride_kt, stride_kh, cos, sin, offs_k,
                           offs_r, HALF, True)
    if STORE_KV:
        store_token_kv(k1, k2, k_mask, slot, v, kc_ptr, vc_ptr, stride_cb, stride_ct,
                       stride_ch, block_size, num_k_heads, offs_r, HALF, KH_P, HALF_P)


def supports(q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor,
             head_dim: int) -> bool:
    """NeoX rotation of the whole head ([T, H, D] views with a contiguous last dim)."""
    return (q.dim() == 3 and k.dim() == 3 and q.stride(-1) == 1 and k.stride(-1) == 1
            and q.shape[-1] == head_dim and k.shape[-1] == head_dim
            and cos_sin_cache.shape[-1] == head_dim and head_dim % 2 == 0
            and k.dtype == q.dtype)


def qk_norm_rope(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                 q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float,
                 cos_sin_cache: torch.Tensor, kv_store: KVStore | None = None) -> None:
    """In place: ``q = rope(rms_norm(q, q_weight))``, the same for ``k``; ``q`` [T, Hq, D] and
    ``k`` [T, Hkv, D] may be strided views of a fused QKV output. ``kv_store``: also write
    the new k and ``kv_store.v`` into the paged cache (what ``reshape_and_cache`` would)."""
    require_triton("qk_norm_rope")
    num_tokens = q.shape[0]
    if num_tokens == 0:
        return
    head_dim = q.shape[-1]
    assert supports(q, k, cos_sin_cache, head_dim), (q.shape, k.shape, cos_sin_cache.shape)
    half = head_dim // 2
    qh, kh = q.shape[1], k.shape[1]
    half_p = next_power_of_2(half)
    v, kc, vc, slots, *cache_strides = kv_store_args(kv_store, k)
    _qk_norm_rope_kernel[(num_tokens,)](
        q, k, positions.reshape(-1), cos_sin_cache, q_weight, k_weight, v, kc, vc, slots,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos_sin_cache.stride(0),
        *cache_strides, qh, kh, float(eps),
        HALF=half, HALF_P=half_p, QH_P=next_power_of_2(qh), KH_P=next_power_of_2(kh),
        STORE_KV=kv_store is not None,
        num_warps=4 if next_power_of_2(qh) * half_p >= 1024 else 1, **pdl_args(q.device),
    )  # fmt: skip


def qk_norm_rope_ref(positions, q, k, q_weight, k_weight, eps, cos_sin_cache) -> None:
    """The unfused torch reference (in place)."""
    q.copy_(rms_norm_ref(q, q_weight, eps))
    k.copy_(rms_norm_ref(k, k_weight, eps))
    rotary_embedding_ref(positions, q, k, cos_sin_cache, q.shape[-1])
