"""Write a step's new keys/values into the paged KV cache.

Cache layout (per layer): ``[num_blocks, block_size, num_kv_heads, head_dim]``; token slot ``s``
lives at block ``s // block_size``, offset ``s % block_size``. ``slot_mapping[t] == -1`` means
"do not store token t" (padding, e.g. CUDA-graph filler tokens).
"""

from __future__ import annotations

import torch

from octavo.kernels.pdl import begin as pdl_begin
from octavo.kernels.pdl import launch_args as pdl_args
from octavo.kernels.triton_utils import next_power_of_2, require_triton, tl, triton


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr,
    value_ptr,
    key_cache_ptr,
    value_cache_ptr,
    slot_mapping_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kcb,
    stride_kct,
    stride_kch,
    stride_vcb,
    stride_vct,
    stride_vch,
    block_size,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEADS_P: tl.constexpr,
    HEAD_DIM_P: tl.constexpr,
    PDL: tl.constexpr,
):
    # One program per token: all kv heads of the token are copied at once.
    pdl_begin(PDL)
    t = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + t).to(tl.int64)
    if slot < 0:
        return
    blk = slot // block_size
    off = slot % block_size

    offs_h = tl.arange(0, HEADS_P)
    offs_d = tl.arange(0, HEAD_DIM_P)
    mask = (offs_h[:, None] < NUM_HEADS) & (offs_d[None, :] < HEAD_DIM)

    src_k = key_ptr + t.to(tl.int64) * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :]
    src_v = value_ptr + t.to(tl.int64) * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :]
    k = tl.load(src_k, mask=mask)
    v = tl.load(src_v, mask=mask)

    dst_k = key_cache_ptr + blk * stride_kcb + off * stride_kct
    dst_v = value_cache_ptr + blk * stride_vcb + off * stride_vct
    dst_k = dst_k + offs_h[:, None] * stride_kch + offs_d[None, :]
    dst_v = dst_v + offs_h[:, None] * stride_vch + offs_d[None, :]
    tl.store(dst_k, k.to(key_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(dst_v, v.to(value_cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def load_token_kv(v_ptr, slot_ptr, t, stride_vt, stride_vh, num_k_heads,
                  KH_P: tl.constexpr, HALF: tl.constexpr, HALF_P: tl.constexpr):
    """Token ``t``'s cache slot and its v [KH_P, 2 * HALF_P], loaded as early as the calling
    kernel can (right after its wait): neither depends on the rotation, and issued after the
    rotated stores they would add two dependent memory round trips to a one-token launch."""
    slot = tl.load(slot_ptr + t).to(tl.int64)
    offs_h = tl.arange(0, KH_P)
    offs_d = tl.arange(0, 2 * HALF_P)
    v_mask = (offs_h[:, None] < num_k_heads) & (offs_d[None, :] < 2 * HALF)
    v = tl.load(v_ptr + t * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :],
                mask=v_mask)
    return slot, v


@triton.jit
def store_token_kv(k1, k2, mask, slot, v, kc_ptr, vc_ptr, stride_cb, stride_ct, stride_ch,
                   block_size, num_k_heads, offs_r, HALF: tl.constexpr, KH_P: tl.constexpr,
                   HALF_P: tl.constexpr):
    """Token ``t``'s k (rotated by the calling kernel: halves ``k1``, ``k2`` [KH_P, HALF_P]
    in registers, ``mask`` their valid part) and its v (``load_token_kv``'s) into the paged
    cache, as ``reshape_and_cache`` writes them (slot -1: not stored). The two caches share
    one layout."""
    if slot >= 0:
        offs_h = tl.arange(0, KH_P)
        row = (slot // block_size) * stride_cb + (slot % block_size) * stride_ct
        dst = row + offs_h[:, None] * stride_ch
        tl.store(kc_ptr + dst + offs_r[None, :], k1.to(kc_ptr.dtype.element_ty), mask=mask)
        tl.store(kc_ptr + dst + HALF + offs_r[None, :], k2.to(kc_ptr.dtype.element_ty),
                 mask=mask)
        offs_d = tl.arange(0, 2 * HALF_P)
        v_mask = (offs_h[:, None] < num_k_heads) & (offs_d[None, :] < 2 * HALF)
        tl.store(vc_ptr + dst + offs_d[None, :], v.to(vc_ptr.dtype.element_ty), mask=v_mask)


def kv_store_args(kv_store, k: torch.Tensor) -> tuple:
    """The arguments ``store_token_kv`` takes from a kernel launch, for ``kv_store``
    (octavo.attention.backend.KVStore, or None: placeholders, nothing stored): (v, key
    cache, value cache, slots, and the six strides / sizes after them)."""
    if kv_store is None:
        return (k, k, k, k, 0, 0, 0, 0, 0, 1)
    v, kc, vc, slots = kv_store.v, kv_store.key_cache, kv_store.value_cache, kv_store.slots
    assert v.shape == k.shape and v.stride(-1) == 1 and slots.shape[0] == k.shape[0]
    assert kc.shape == vc.shape and kc.stride() == vc.stride() and kc.shape[2:] == k.shape[1:]
    return (v, kc, vc, slots, v.stride(0), v.stride(1), kc.stride(0), kc.stride(1),
            kc.stride(2), kc.shape[1])


def _check(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    assert key.dim() == 3 and key.shape == value.shape, (key.shape, value.shape)
    assert key_cache.dim() == 4 and key_cache.shape == value_cache.shape
    assert key_cache.shape[2:] == key.shape[1:], (key_cache.shape, key.shape)
    assert slot_mapping.dim() == 1 and slot_mapping.shape[0] == key.shape[0]


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store ``key``/``value`` ``[T, Hkv, D]`` into the caches at ``slot_mapping`` (in place).

    ``key``/``value`` may be strided views (e.g. slices of a fused QKV output) as long as the
    last dimension is contiguous. Slots < 0 are skipped.
    """
    require_triton("reshape_and_cache")
    _check(key, value, key_cache, value_cache, slot_mapping)
    num_tokens, num_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    if key.stride(-1) != 1:
        key = key.contiguous()
    if value.stride(-1) != 1:
        value = value.contiguous()
    assert key_cache.stride(-1) == 1 and value_cache.stride(-1) == 1
    heads_p = next_power_of_2(num_heads)
    head_dim_p = next_power_of_2(head_dim)
    num_warps = 4 if heads_p * head_dim_p >= 2048 else 1
    _reshape_and_cache_kernel[(num_tokens,)](
        key,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        value_cache.stride(0),
        value_cache.stride(1),
        value_cache.stride(2),
        key_cache.shape[1],
        NUM_HEADS=num_heads,
        HEAD_DIM=head_dim,
        HEADS_P=heads_p,
        HEAD_DIM_P=head_dim_p,
        num_warps=num_warps,
        **pdl_args(key.device),
    )


def reshape_and_cache_ref(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Pure-torch reference of :func:`reshape_and_cache` (in place)."""
    _check(key, value, key_cache, value_cache, slot_mapping)
    num_blocks, block_size = key_cache.shape[:2]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    flat_k = key_cache.view(num_blocks * block_size, *key_cache.shape[2:])
    flat_v = value_cache.view(num_blocks * block_size, *value_cache.shape[2:])
    flat_k.index_copy_(0, slots, key[keep].to(key_cache.dtype))
    flat_v.index_copy_(0, slots, value[keep].to(value_cache.dtype))
