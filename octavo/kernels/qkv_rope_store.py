"""The store of a qkv projection's decode rows with the rotary embedding applied (a GEMV's
epilogue: ``octavo.kernels.fp8_gemv``'s ROPE mode): which weight row each tile column reads
(:func:`rope_rows`, the NeoX pairs of q and k side by side) and the store that rotates the
pairs, writes q and puts the rotated k and the v into the paged KV cache
(:func:`rope_store`), the bits of the rotary kernel followed by ``reshape_and_cache``."""

from __future__ import annotations

import torch

from octavo.kernels.rotary import rotate_halves
from octavo.kernels.triton_utils import tl, triton


def inputs_supported(m: int, device: torch.device, positions: torch.Tensor,
                     cos_sin_cache: torch.Tensor, num_kv_heads: int, head_dim: int, kv_store,
                     cache_dtypes: tuple) -> bool:
    """Whether a rotating store (this module's, or ``swapab_mma``'s) takes these inputs for
    ``m`` rows: the whole head rotated (a [max_pos, head_dim] float32 table, cos then sin),
    one integer position and slot per row, caches [num_blocks, block_size, Hkv, D] (one
    layout, the last dim contiguous) of one of ``cache_dtypes``, all on ``device``."""
    kc, vc, slots = kv_store.key_cache, kv_store.value_cache, kv_store.slots
    return (cos_sin_cache.dim() == 2 and cos_sin_cache.shape[-1] == head_dim
            and cos_sin_cache.stride(-1) == 1 and cos_sin_cache.dtype == torch.float32
            and positions.dim() == 1 and positions.shape[0] == m and positions.stride(0) == 1
            and not positions.is_floating_point()
            and slots.dim() == 1 and slots.shape[0] == m and slots.stride(0) == 1
            and not slots.is_floating_point()
            and kc.dim() == 4 and kc.shape == vc.shape and kc.stride() == vc.stride()
            and tuple(kc.shape[2:]) == (num_kv_heads, head_dim) and kc.stride(-1) == 1
            and kc.dtype == vc.dtype and kc.dtype in cache_dtypes
            and all(t.device == device for t in (positions, cos_sin_cache, kc, vc, slots)))


@triton.jit
def rope_store(res, offs_m, pid_n, M, N, Q_N, QK_N, out_ptr, stride_om, pos_ptr, cs_ptr,
                stride_cs, kc_ptr, vc_ptr, slot_ptr, stride_cb, stride_ct, stride_ch,
                block_size, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    """ROPE's store (one K split): ``res`` [BLOCK_M, BLOCK_N] holds the tile's column pairs
    (:func:`rope_rows`), each member first rounded to the output dtype as a stored [q | k | v]
    would be. A q or k pair (x1, x2) = (head h's features i, i + D/2) becomes x1 * cos -
    x2 * sin, x2 * cos + x1 * sin (``rotate_halves``, cos / sin of the row's position:
    the rotary kernel's bits); q goes to ``out_ptr`` [M, Hq * D], the rotated k and the v
    pairs (two consecutive features, as they are) into the paged caches at the row's slot,
    as ``reshape_and_cache`` writes them (cast to the cache's dtype; slot -1: not
    stored)."""
    HALF: tl.constexpr = HEAD_DIM // 2
    PAIRS: tl.constexpr = BLOCK_N // 2
    bm: tl.constexpr = res.shape[0]
    dtype = out_ptr.dtype.element_ty
    x1, x2 = tl.split(tl.reshape(res.to(dtype).to(tl.float32), (bm, PAIRS, 2)))
    col = 2 * (pid_n * PAIRS + tl.arange(0, PAIRS))  # the pair's first column
    h = col // HEAD_DIM
    i = (col % HEAD_DIM) // 2
    m_ok = offs_m < M
    is_qk = col < QK_N
    pos = tl.load(pos_ptr + offs_m, mask=m_ok, other=0).to(tl.int64)
    cs = cs_ptr + pos[:, None] * stride_cs + i[None, :]
    rot = m_ok[:, None] & is_qk[None, :]
    cos = tl.load(cs, mask=rot, other=0.0).to(tl.float32)
    sin = tl.load(cs + HALF, mask=rot, other=0.0).to(tl.float32)
    y1, y2 = rotate_halves(x1, x2, cos, sin)
    y1 = y1.to(dtype)
    y2 = y2.to(dtype)
    q_ok = m_ok[:, None] & (col < Q_N)[None, :]
    q = out_ptr + offs_m[:, None] * stride_om + (h * HEAD_DIM + i)[None, :]
    tl.store(q, y1, mask=q_ok)
    tl.store(q + HALF, y2, mask=q_ok)
    slot = tl.load(slot_ptr + offs_m, mask=m_ok, other=-1).to(tl.int64)
    stored = m_ok & (slot >= 0)
    row = (slot // block_size) * stride_cb + (slot % block_size) * stride_ct
    k_ok = stored[:, None] & ((col >= Q_N) & is_qk)[None, :]
    k = kc_ptr + row[:, None] + ((h - Q_N // HEAD_DIM) * stride_ch + i)[None, :]
    tl.store(k, y1.to(kc_ptr.dtype.element_ty), mask=k_ok)
    tl.store(k + HALF, y2.to(kc_ptr.dtype.element_ty), mask=k_ok)
    e = col - QK_N  # v's feature
    v_ok = stored[:, None] & ((col >= QK_N) & (col < N))[None, :]
    v = vc_ptr + row[:, None] + ((e // HEAD_DIM) * stride_ch + e % HEAD_DIM)[None, :]
    tl.store(v, x1.to(dtype).to(vc_ptr.dtype.element_ty), mask=v_ok)
    tl.store(v + 1, x2.to(dtype).to(vc_ptr.dtype.element_ty), mask=v_ok)


@triton.jit
def rope_rows(offs_n, QK_N, HEAD_DIM: tl.constexpr):
    """ROPE's weight row of each tile column: in the q / k part (columns < QK_N) column 2p
    reads head h's row i and 2p + 1 its row i + D/2 (the NeoX pair p = h * D/2 + i that
    rotates together), in the v part column c reads row c."""
    pair = offs_n // 2
    first = (pair // (HEAD_DIM // 2)) * HEAD_DIM + pair % (HEAD_DIM // 2)
    return tl.where(offs_n < QK_N, first + (offs_n % 2) * (HEAD_DIM // 2), offs_n)
