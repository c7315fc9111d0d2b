"""Rotary position embedding, applied in place to query and key.

``cos_sin_cache`` is ``[max_position, rot_dim]``: cos in the first ``rot_dim // 2`` columns, sin
in the second half. Only the first ``rot_dim`` features of each head are rotated (``rot_dim ==
head_dim`` for Llama/Qwen; smaller for partial-rotary models).

* NeoX style (``is_neox=True``, Llama/Qwen in Hugging Face): pairs ``(x[i], x[i + rot_dim/2])``.
* GPT-J style (``is_neox=False``): pairs ``(x[2i], x[2i + 1])``.
"""

from __future__ import annotations

import torch

from octavo.kernels.pdl import begin as pdl_begin
from octavo.kernels.pdl import launch_args as pdl_args
from octavo.kernels.reshape_and_cache import kv_store_args, load_token_kv, store_token_kv
from octavo.kernels.triton_utils import next_power_of_2, require_triton, tl, triton


@triton.jit
def _head_offsets(offs_r, HALF: tl.constexpr, IS_NEOX: tl.constexpr):
    """Offsets in a head of the two halves rotated together (NeoX: halves; GPT-J: pairs)."""
    if IS_NEOX:
        return offs_r, offs_r + HALF
    return offs_r * 2, offs_r * 2 + 1


@triton.jit
def load_heads(x_ptr, token, stride_t, stride_h, num_heads, offs_h, offs_r,
                HALF: tl.constexpr, IS_NEOX: tl.constexpr):
    """A token's heads as the two float32 halves [H_P, HALF_P] that rotate together, and
    their mask."""
    first, second = _head_offsets(offs_r, HALF, IS_NEOX)
    mask = (offs_h[:, None] < num_heads) & (offs_r[None, :] < HALF)
    base = x_ptr + token * stride_t + offs_h[:, None] * stride_h
    x1 = tl.load(base + first[None, :], mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(base + second[None, :], mask=mask, other=0.0).to(tl.float32)
    return x1, x2, mask


@triton.jit
def rotate_halves(x1, x2, cos, sin):
    """The rotation of the two float32 halves that rotate together (``cos``, ``sin`` of their
    shape or broadcast to it), in float32: one expression for every kernel that must give the
    bits of this one (the FP8 GEMV's rotating store, ``fp8_gemv``'s ROPE)."""
    return x1 * cos - x2 * sin, x2 * cos + x1 * sin


@triton.jit
def rotate_store(x_ptr, x1, x2, mask, token, stride_t, stride_h, cos, sin, offs_h, offs_r,
                  HALF: tl.constexpr, IS_NEOX: tl.constexpr):
    """Rotate ``load_heads``' halves and store them back; returns the rotated halves."""
    first, second = _head_offsets(offs_r, HALF, IS_NEOX)
    base = x_ptr + token * stride_t + offs_h[:, None] * stride_h
    y1, y2 = rotate_halves(x1, x2, cos[None, :], sin[None, :])
    y1 = y1.to(x_ptr.dtype.element_ty)
    y2 = y2.to(x_ptr.dtype.element_ty)
    tl.store(base + first[None, :], y1, mask=mask)
    tl.store(base + second[None, :], y2, mask=mask)
    return y1, y2


@triton.jit
def token_cos_sin(pos_ptr, cache_ptr, token, stride_cache, offs_r, HALF: tl.constexpr):
    """The cos and sin halves (float32, ``offs_r`` wide, zero past HALF) of the table row
    at ``token``'s position."""
    pos = tl.load(pos_ptr + token).to(tl.int64)
    r_ok = offs_r < HALF
    row = cache_ptr + pos * stride_cache
    cos = tl.load(row + offs_r, mask=r_ok, other=0.0).to(tl.float32)
    sin = tl.load(row + HALF + offs_r, mask=r_ok, other=0.0).to(tl.float32)
    return cos, sin


@triton.jit
def _rotary_kernel(
    q_ptr,
    k_ptr,
    pos_ptr,
    cache_ptr,
    v_ptr,
    kc_ptr,
    vc_ptr,
    slot_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_cache,
    stride_vt,
    stride_vh,
    stride_cb,
    stride_ct,
    stride_ch,
    block_size,
    num_q_heads,
    num_k_heads,
    HAS_K: tl.constexpr,
    STORE_KV: tl.constexpr,
    HALF: tl.constexpr,
    HALF_P: tl.constexpr,
    QH_P: tl.constexpr,
    KH_P: tl.constexpr,
    IS_NEOX: tl.constexpr,
    PDL: tl.constexpr,
):
    # One program per token: every head of q (and k) shares the token's cos/sin row.
    pdl_begin(PDL)
    t = tl.program_id(0).to(tl.int64)
    offs_r = tl.arange(0, HALF_P)
    offs_q = tl.arange(0, QH_P)
    offs_k = tl.arange(0, KH_P)
    # Every input first (none depends on another, and a load after a store must wait for
    # it): at one token the launch is a chain of memory round trips, not bandwidth.
    q1, q2, q_mask = load_heads(q_ptr, t, stride_qt, stride_qh, num_q_heads, offs_q, offs_r,
                                 HALF, IS_NEOX)
    if HAS_K:
        k1, k2, k_mask = load_heads(k_ptr, t, stride_kt, stride_kh, num_k_heads, offs_k,
                                     offs_r, HALF, IS_NEOX)
        if STORE_KV:
            slot, v = load_token_kv(v_ptr, slot_ptr, t, stride_vt, stride_vh, num_k_heads,
                                    KH_P, HALF, HALF_P)
    cos, sin = token_cos_sin(pos_ptr, cache_ptr, t, stride_cache, offs_r, HALF)
    rotate_store(q_ptr, q1, q2, q_mask, t, stride_qt, stride_qh, cos, sin, offs_q, offs_r,
                  HALF, IS_NEOX)
    if HAS_K:
        k1, k2 = rotate_store(k_ptr, k1, k2, k_mask, t, stride_kt, stride_kh, cos, sin,
                               offs_k, offs_r, HALF, IS_NEOX)
        if STORE_KV:  # NeoX halves of the whole head (supports_kv_store)
            store_token_kv(k1, k2, k_mask, slot, v, kc_ptr, vc_ptr, stride_cb, stride_ct,
                           stride_ch, block_size, num_k_heads, offs_r, HALF, KH_P, HALF_P)


def supports_kv_store(q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor,
                      head_dim: int) -> bool:
    """Whether ``rotary_embedding`` can also store K/V: [T, H, D] q and k with a contiguous
    last dim, the whole head rotated (the store writes the two rotated halves as the head)."""
    return (q.dim() == 3 and k.dim() == 3 and k.stride(-1) == 1 and q.stride(-1) == 1
            and k.shape[-1] == head_dim and cos_sin_cache.shape[-1] == head_dim)


def _heads_view(x: torch.Tensor, head_dim: int) -> tuple[int, int, int]:
    """(num_heads, token stride, head stride) of ``[T, H*D]`` or ``[T, H, D]``."""
    assert x.stride(-1) == 1, "rotary_embedding needs a contiguous last dimension"
    if x.dim() == 2:
        assert x.shape[1] % head_dim == 0, (x.shape, head_dim)
        return x.shape[1] // head_dim, x.stride(0), head_dim
    assert x.dim() == 3 and x.shape[2] == head_dim, (x.shape, head_dim)
    return x.shape[1], x.stride(0), x.stride(1)


def rotary_embedding(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor | None,
    cos_sin_cache: torch.Tensor,
    head_dim: int,
    is_neox: bool = True,
    kv_store=None,
) -> None:
    """Rotate ``q`` (and ``k``) in place; ``q``/``k`` are ``[T, H*D]`` or ``[T, H, D]`` and may
    be strided views (e.g. slices of a fused QKV output). ``positions`` is ``[T]``.
    ``kv_store`` (octavo.attention.backend.KVStore; see ``supports_kv_store``): the same
    launch writes the rotated k and ``kv_store.v`` into the paged cache, as
    ``reshape_and_cache`` would."""
    require_triton("rotary_embedding")
    rot_dim = cos_sin_cache.shape[-1]
    assert rot_dim % 2 == 0 and rot_dim <= head_dim, (rot_dim, head_dim)
    assert cos_sin_cache.stride(-1) == 1
    num_tokens = positions.numel()
    assert q.shape[0] == num_tokens, (q.shape, positions.shape)
    if num_tokens == 0:
        return
    positions = positions.reshape(-1)
    qh, sqt, sqh = _heads_view(q, head_dim)
    if k is not None:
        assert k.shape[0] == num_tokens
        kh, skt, skh = _heads_view(k, head_dim)
    else:
        kh, skt, skh = 1, 0, 0
    half = rot_dim // 2
    half_p = next_power_of_2(half)
    if kv_store is not None:
        assert k is not None and is_neox and supports_kv_store(q, k, cos_sin_cache, head_dim)
    v, kc, vc, slots, *cache_strides = kv_store_args(kv_store, k if k is not None else q)
    _rotary_kernel[(num_tokens,)](
        q, k if k is not None else q, positions, cos_sin_cache, v, kc, vc, slots,
        sqt, sqh, skt, skh, cos_sin_cache.stride(0), *cache_strides, qh, kh,
        HAS_K=k is not None, STORE_KV=kv_store is not None, HALF=half, HALF_P=half_p,
        QH_P=next_power_of_2(qh), KH_P=next_power_of_2(kh), IS_NEOX=is_neox,
        num_warps=4 if next_power_of_2(qh) * half_p >= 1024 else 1, **pdl_args(q.device),
    )  # fmt: skip


def _rotate_ref(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int, is_neox: bool
) -> None:
    shape = x.shape
    xh = x.view(shape[0], -1, head_dim)
    rot_dim = cos.shape[-1] * 2
    rot = xh[..., :rot_dim].float()
    if is_neox:
        x1, x2 = rot[..., : rot_dim // 2], rot[..., rot_dim // 2 :]
    else:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
    y1 = x1 * cos - x2 * sin
    y2 = x2 * cos + x1 * sin
    if is_neox:
        y = torch.cat([y1, y2], dim=-1)
    else:
        y = torch.stack([y1, y2], dim=-1).flatten(-2)
    xh[..., :rot_dim] = y.to(x.dtype)


def rotary_embedding_ref(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor | None,
    cos_sin_cache: torch.Tensor,
    head_dim: int,
    is_neox: bool = True,
) -> None:
    """Pure-torch reference of :func:`rotary_embedding` (in place, fp32 math)."""
    cs = cos_sin_cache[positions.reshape(-1).long()].float()  # [T, rot_dim]
    half = cs.shape[-1] // 2
    cos, sin = cs[:, None, :half], cs[:, None, half:]
    _rotate_ref(q, cos, sin, head_dim, is_neox)
    if k is not None:
        _rotate_ref(k, cos, sin, head_dim, is_neox)
