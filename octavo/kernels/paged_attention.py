"""Paged attention over a flat, mixed batch of prefill chunks and decodes.

Layout (fixed by the engine):

* ``q``: ``[T, H, D]`` -- the step's new tokens of ``B`` requests, request after request.
* ``key_cache``/``value_cache``: ``[num_blocks, block_size, Hkv, D]`` (the step's own K/V must
  already be written, see :mod:`octavo.kernels.reshape_and_cache`).
* ``query_start_loc`` int32 ``[B+1]``, ``seq_lens`` int32 ``[B]`` (context length *including* the
  new tokens), ``block_tables`` int32 ``[B, max_blocks_per_seq]``.
* Causal: query ``i`` of request ``b`` sits at position ``seq_lens[b] - q_len_b + i`` and attends
  to keys ``0..position``.

Kernel design (one kernel, launched at most twice per call: decodes, then prefill chunks):

* A program owns one *query tile* of one request and one KV head. The rows of the tile are
  ``BLOCK_Q`` query tokens x the ``GROUP`` query heads sharing that KV head (GQA packing), so
  each K/V tile read from the cache feeds all heads of the group.
* Decode launch: grid axis 0 is the request; requests with exactly one new token are handled
  with ``BLOCK_Q = 1`` (memory bound: small tiles, long KV tiles), the rest exit at once.
* Prefill launch: query tiles of all requests with more than one new token share grid axis 0.
  Request ``b`` owns the tiles ``[qsl[b] // BLOCK_Q + b, qsl[b+1] // BLOCK_Q + b + 1)``, which
  bounds the grid by ``T // BLOCK_Q + B`` -- known on the host without reading device memory
  (no sync, CUDA-graph friendly). A program finds its request by binary search over
  ``query_start_loc``.
* K/V tiles of ``BLOCK_N`` tokens are gathered through the block table token by token, so
  ``BLOCK_N`` is independent of the cache block size. Tiles entirely below the first query's
  position need no causal mask; only the last few tiles of a query tile are masked.
* Online softmax in fp32 with ``exp2`` (the scale is folded with ``log2(e)``).
* Split-K ("flash decoding"): for few sequences x long context the KV range is cut into
  ``num_splits`` chunks handled by separate programs that write unnormalised partial results
  (acc, running max, running sum) per query token in fp32, merged by a second kernel
  (:mod:`octavo.kernels.paged_attention_merge`). A decode launch may instead merge in place
  (chosen by ``paged_attention_config._merge_in_launch``): the last program of each
  (request, KV head) to finish merges (a ticket from a per-pair counter, as
  :mod:`octavo.kernels.split_k` does for GEMMs). Either way each decode's own context is
  cut into parts of at least ``MIN_SPLIT`` keys; unused splits exit at once and a one-part
  request writes its output itself. The prefill launch splits the same way (without the
  minimum) when its query tiles are few and the context long (a chunk of a long prompt under
  chunked prefill).
"""

from __future__ import annotations

import torch

from octavo.envs import (
    attn_decode_splits,
    attn_decode_tile,
    attn_early_kv,
    attn_prefill_tile,
    attn_split_merge,
    attn_streamk,
)
from octavo.kernels.l2_prefetch import bulk_prefetch
from octavo.kernels.online_softmax import pv_dot, softmax_step
from octavo.kernels.paged_attention_config import (
    _MIN_SPLIT_TOKENS,
    _SPLIT_PREFILL_ROWS,
    _Config,
    _merge_in_launch,
    _pick_config,
    _pick_num_splits,
    _pick_prefill_splits,
    _rows,
    with_tile,
)
from octavo.kernels.paged_attention_merge import (
    _merge_in_place,
    _split_reduce_kernel,
    _split_reduce_tokens_kernel,
    _split_tokens,
)
from octavo.kernels.paged_attention_streamk import DecodeTiles, streamk_decode
from octavo.kernels.pdl import begin as pdl_begin
from octavo.kernels.pdl import launch_args as pdl_args
from octavo.kernels.pdl import trigger as pdl_trigger
from octavo.kernels.pdl import wait as pdl_wait
from octavo.kernels.split_k import counters as split_k_counters
from octavo.kernels.triton_utils import (
    next_power_of_2,
    require_triton,
    tl,
    triton,
)

_LOG2E = 1.4426950408889634
# Cache dtypes besides q's own (kv_cache_dtype="fp8").
FP8_KV = (torch.float8_e4m3fn,)
# Running max starts finite so fully masked tiles never produce (-inf) - (-inf) = NaN.
_NEG_BIG = -1.0e30


# --------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------


@triton.jit
def _attn_kv_loop(
    acc,
    m_i,
    l_i,
    q,
    k_base,
    v_base,
    bt_row_ptr,
    lo,
    hi,
    pos,
    stride_kb,
    stride_kt,
    stride_vb,
    stride_vt,
    qk_scale,
    offs_d,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P: tl.constexpr,
    CAUSAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    COMPUTE_DT: tl.constexpr,
):
    """Accumulate keys ``[lo, hi)`` (lo a multiple of BLOCK_N) into (acc, m_i, l_i). K/V
    tiles are converted to ``COMPUTE_DT`` (q's dtype) as loaded: a float8 cache is read at
    half the bytes and computed like the model's dtype.

    With ``CAUSAL=False`` the caller guarantees every key of every tile is visible to every row
    and ``hi - lo`` is a multiple of BLOCK_N, so nothing is masked.
    """
    offs_n = tl.arange(0, BLOCK_N)
    d_ok = offs_d < HEAD_DIM
    for start in range(lo, hi, BLOCK_N):
        n = start + offs_n
        # Paged gather: token n lives in block bt[n // BLOCK_SIZE] at offset n % BLOCK_SIZE.
        if CAUSAL:
            n_ok = n < hi
            blk = tl.load(bt_row_ptr + n // BLOCK_SIZE, mask=n_ok, other=0).to(tl.int64)
        else:
            blk = tl.load(bt_row_ptr + n // BLOCK_SIZE).to(tl.int64)
        off = (n % BLOCK_SIZE).to(tl.int64)
        k_tok = blk * stride_kb + off * stride_kt
        v_tok = blk * stride_vb + off * stride_vt
        k_ptrs = k_base + k_tok[None, :] + offs_d[:, None]  # K^T tile [D, BLOCK_N]
        if CAUSAL:
            k = tl.load(k_ptrs, mask=n_ok[None, :] & d_ok[:, None], other=0.0)
        elif HEAD_DIM_P != HEAD_DIM:
            k = tl.load(k_ptrs, mask=d_ok[:, None], other=0.0)
        else:
            k = tl.load(k_ptrs)
        k = k.to(COMPUTE_DT)
        if UPCAST_DOT:
            k = k.to(tl.float32)
        s = tl.dot(q, k, input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N]
        if CAUSAL:
            s = tl.where(n[None, :] <= pos[:, None], s, float("-inf"))
        p, alpha, m_new, l_i = softmax_step(s, m_i, l_i)
        v_ptrs = v_base + v_tok[:, None] + offs_d[None, :]  # [BLOCK_N, D]
        if CAUSAL:
            v = tl.load(v_ptrs, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        elif HEAD_DIM_P != HEAD_DIM:
            v = tl.load(v_ptrs, mask=d_ok[None, :], other=0.0)
        else:
            v = tl.load(v_ptrs)
        v = v.to(COMPUTE_DT)
        acc = acc * alpha[:, None] + pv_dot(p, v, DOT_PRECISION, UPCAST_DOT)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _prefetch_cached_rows(k_base, v_base, bt_row_ptr, lo, end, stride_kb, stride_kt,
                          stride_vb, stride_vt, ROWS: tl.constexpr, ROW_BYTES: tl.constexpr,
                          BLOCK_SIZE: tl.constexpr):
    """Ask L2 for the K and V rows (one head's ROW_BYTES each) of keys ``[lo, min(lo + ROWS,
    end))``: one bulk prefetch per row, none past ``end``."""
    n = lo + tl.arange(0, ROWS)
    ok = n < end
    blk = tl.load(bt_row_ptr + n // BLOCK_SIZE, mask=ok, other=0).to(tl.int64)
    off = (n % BLOCK_SIZE).to(tl.int64)
    size = tl.where(ok, ROW_BYTES, 0)
    bulk_prefetch(k_base + blk * stride_kb + off * stride_kt, size)
    bulk_prefetch(v_base + blk * stride_vb + off * stride_vt, size)


# Batch-dependent integers are not specialised, so changing batches never trigger recompiles.
@triton.jit(do_not_specialize=["num_seqs", "num_splits"])
def _paged_attention_kernel(
    out_ptr,
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    qsl_ptr,
    seq_lens_ptr,
    block_tables_ptr,
    part_acc_ptr,
    part_ml_ptr,
    cnt_ptr,
    order_ptr,
    qk_scale,
    num_seqs,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_vb,
    stride_vt,
    stride_vh,
    stride_bt,
    num_heads,
    num_splits,
    DECODE: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P: tl.constexpr,
    SPLIT: tl.constexpr,
    MERGE: tl.constexpr,
    MIN_SPLIT: tl.constexpr,
    SPLITS_P: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    ORDER: tl.constexpr,
    EARLY_ROWS: tl.constexpr,
    ROW_BYTES: tl.constexpr,
    PDL: tl.constexpr,
):
    # EARLY_ROWS (decodes, PDL, no ORDER): the request's metadata and the first EARLY_ROWS
    # K/V rows of its keys cached before this step (L2 prefetch) are asked for before the
    # wait: the step's input tensors and those rows are written by no kernel of the step
    # (only the step's new key, the last, is). q and everything written wait as always.
    EARLY: tl.constexpr = DECODE and EARLY_ROWS > 0 and PDL and not ORDER
    if EARLY:
        pdl_trigger(PDL)
    else:
        pdl_begin(PDL)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    if DECODE:
        # Grid axis 0 = request; only single-token requests (decodes) are handled here.
        b = tl.program_id(0)
        if ORDER:  # the requests in the order given (longest context first)
            b = tl.load(order_ptr + b)
        q_start = tl.load(qsl_ptr + b)
        q_len = tl.load(qsl_ptr + b + 1) - q_start
        if q_len != 1:
            return
        q_first = 0
    else:
        # Grid axis 0 = query tile; request b owns tiles [qsl[b] // BLOCK_Q + b, ...). Find b
        # by counting tile starts <= this tile (they increase with b). Decodes are skipped:
        # the DECODE launch handles them with a tile shape that fits one query.
        tile = tl.program_id(0)
        # Binary search for the last request whose first tile is <= this tile (tile starts
        # increase with b; request 0 starts at tile 0). A loop, not a vector compare, so one
        # compiled kernel serves every batch size.
        lo = tile * 0
        hi = lo + num_seqs
        while lo < hi:
            mid = (lo + hi + 1) // 2
            start = tl.load(qsl_ptr + mid) // BLOCK_Q + mid
            lo = tl.where(start <= tile, mid, lo)
            hi = tl.where(start <= tile, hi, mid - 1)
        b = lo
        if b >= num_seqs:
            return
        q_start = tl.load(qsl_ptr + b)
        q_len = tl.load(qsl_ptr + b + 1) - q_start
        q_first = (tile - (q_start // BLOCK_Q + b)) * BLOCK_Q
        if q_len <= 1:
            return
        if q_first >= q_len:
            return
    seq_len = tl.load(seq_lens_ptr + b)
    ctx_len = seq_len - q_len  # tokens cached before this step
    # Keys this tile needs: [0, last query position].
    q_last = tl.minimum(q_first + BLOCK_Q, q_len) - 1
    kv_end = ctx_len + q_last + 1
    if SPLIT:
        # Each request cuts its own context into even, BLOCK_N-aligned parts (of at least
        # MIN_SPLIT keys), so a launch sized for the longest context (a CUDA graph) still
        # balances short ones; a decode's unused splits leave at once.
        split_tokens = _split_tokens(kv_end, num_splits, BLOCK_N, MIN_SPLIT)
        if DECODE:
            used = tl.cdiv(kv_end, split_tokens)
            if split >= used:
                return
        lo = split * split_tokens
        hi = tl.minimum(lo + split_tokens, kv_end)
    else:
        lo = 0
        hi = kv_end

    # Rows = (query token, head of the GQA group); padding rows are clamped to valid
    # coordinates so they compute harmless finite values and are simply not stored.
    offs_m = tl.arange(0, BLOCK_M)
    # Rows are packed densely (row m = query m // GROUP, head m % GROUP), so a group of 3
    # fills 63 of 64 rows rather than 48 with a power-of-two stride.
    q_idx = q_first + offs_m // GROUP
    g_idx = offs_m % GROUP
    row_ok = (offs_m // GROUP < BLOCK_Q) & (q_idx < q_len)
    q_idx = tl.minimum(q_idx, q_len - 1)
    head = kv_head * GROUP + tl.minimum(g_idx, GROUP - 1)
    tok = (q_start + q_idx).to(tl.int64)
    pos = ctx_len + q_idx

    bt_row = block_tables_ptr + b.to(tl.int64) * stride_bt
    k_base = k_cache_ptr + kv_head * stride_kh
    v_base = v_cache_ptr + kv_head * stride_vh
    if EARLY:
        _prefetch_cached_rows(k_base, v_base, bt_row, lo, tl.minimum(hi, ctx_len), stride_kb,
                              stride_kt, stride_vb, stride_vt, EARLY_ROWS, ROW_BYTES,
                              BLOCK_SIZE)
        pdl_wait(PDL)
    offs_d = tl.arange(0, HEAD_DIM_P)
    d_ok = offs_d < HEAD_DIM
    q_ptrs = q_ptr + tok[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if UPCAST_DOT:
        q = q.to(tl.float32)

    # Tiles wholly below the first query's position + 1 are visible to every row and skip
    # masking.
    full_end = (ctx_len + q_first + 1) // BLOCK_N * BLOCK_N
    mid = tl.maximum(lo, tl.minimum(full_end, hi))

    acc = tl.zeros([BLOCK_M, HEAD_DIM_P], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc, m_i, l_i = _attn_kv_loop(
        acc, m_i, l_i, q, k_base, v_base, bt_row, lo, mid, pos,
        stride_kb, stride_kt, stride_vb, stride_vt, qk_scale, offs_d,
        BLOCK_SIZE, BLOCK_N, HEAD_DIM, HEAD_DIM_P, False, DOT_PRECISION, UPCAST_DOT,
        q_ptr.dtype.element_ty,
    )  # fmt: skip
    acc, m_i, l_i = _attn_kv_loop(
        acc, m_i, l_i, q, k_base, v_base, bt_row, mid, hi, pos,
        stride_kb, stride_kt, stride_vb, stride_vt, qk_scale, offs_d,
        BLOCK_SIZE, BLOCK_N, HEAD_DIM, HEAD_DIM_P, True, DOT_PRECISION, UPCAST_DOT,
        q_ptr.dtype.element_ty,
    )  # fmt: skip

    o_ptrs = out_ptr + tok[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :]
    o_mask = row_ok[:, None] & d_ok[None, :]
    if DECODE and SPLIT:
        if used == 1:  # the whole context in this program: no partials, nothing to merge
            tl.store(o_ptrs, (acc / l_i[:, None]).to(out_ptr.dtype.element_ty), mask=o_mask)
        else:
            p_idx = (tok * num_heads + head) * num_splits + split
            tl.store(part_acc_ptr + p_idx[:, None] * HEAD_DIM_P + offs_d[None, :], acc,
                     mask=row_ok[:, None])
            tl.store(part_ml_ptr + p_idx * 2, m_i, mask=row_ok)
            tl.store(part_ml_ptr + p_idx * 2 + 1, l_i, mask=row_ok)
            if MERGE:
                _merge_in_place(out_ptr, part_acc_ptr, part_ml_ptr,
                                cnt_ptr + b * tl.num_programs(1) + kv_head,
                                q_start.to(tl.int64), kv_head, offs_d, d_ok, num_heads,
                                num_splits, used, stride_ot, stride_oh, GROUP, HEAD_DIM_P,
                                SPLITS_P)
    elif SPLIT:
        # Partials per query token: acc [T, H, S, HEAD_DIM_P] and (max, sum) pairs
        # [T, H, S, 2], contiguous fp32.
        p_idx = (tok * num_heads + head) * num_splits + split
        p_acc = part_acc_ptr + p_idx[:, None] * HEAD_DIM_P + offs_d[None, :]
        tl.store(p_acc, acc, mask=row_ok[:, None])
        tl.store(part_ml_ptr + p_idx * 2, m_i, mask=row_ok)
        tl.store(part_ml_ptr + p_idx * 2 + 1, l_i, mask=row_ok)
    else:
        tl.store(o_ptrs, (acc / l_i[:, None]).to(out_ptr.dtype.element_ty), mask=o_mask)


# --------------------------------------------------------------------------------------------
# Python entry point
# --------------------------------------------------------------------------------------------


def paged_attention(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    max_query_len: int | None = None,
    *,
    max_seq_len: int | None = None,
    num_splits: int | None = None,
    prefill_splits: int | None = None,
    min_split_keys: int | None = None,
    decode_order: torch.Tensor | None = None,
    decode_tiles: DecodeTiles | None = None,
) -> torch.Tensor:
    """Causal attention of ``q`` ``[T, H, D]`` over the paged cache; returns ``[T, H, D]``.

    Two launches at most: decodes (requests with one new token) with a one-query tile, and
    prefill chunks (more than one new token) with a large query tile. Which are needed is
    decided from host-side facts only (never a device read, so CUDA-graph safe):
    ``max_query_len == 1`` means decodes only (pass it for decode steps: it saves a launch);
    a single request with ``T > 1`` means prefill only; otherwise both launches run and each
    program skips the requests of the other kind. Requests with no new token are allowed.

    ``max_seq_len`` (must be >= every ``seq_lens`` entry; default: block-table width x block
    size) bounds the KV range cut by split-K; the heuristic splits decode-only batches only; ``num_splits`` forces the number of KV splits
    of the decode launch, in any batch (1 disables split-K; ``None`` = heuristic);
    ``prefill_splits`` does the same for the prefill launch (the heuristic splits it on the
    GPU when its query tiles cannot fill the device and ``max_seq_len`` is long).
    ``min_split_keys``: each split decode's own context is cut into parts of at least this
    many keys (default: 256 on the GPU with the in-launch merge, else one KV tile), so a
    short context in a launch split for a long one runs in fewer programs.
    ``decode_order`` (int32 ``[B]``, a permutation of the requests): the decode launch's
    programs take the requests in this order (e.g. longest context first, so the launch
    does not end on a long one).
    ``decode_tiles``: the step's stream-K work list
    (:func:`octavo.kernels.paged_attention_streamk.decode_tiles`, shared by every layer):
    given, the decode launch is stream-K's (:mod:`octavo.kernels.paged_attention_streamk`),
    as it is for decode-only calls without a split count under OCTAVO_ATTN_STREAMK (then
    the work list is computed here, in ``decode_order``).
    """
    require_triton("paged_attention")
    num_tokens, num_heads, head_dim = q.shape
    num_blocks, block_size, num_kv_heads, head_dim_c = key_cache.shape
    assert head_dim_c == head_dim and value_cache.shape == key_cache.shape
    assert num_heads % num_kv_heads == 0, (num_heads, num_kv_heads)
    assert value_cache.dtype == key_cache.dtype and key_cache.dtype in (q.dtype, *FP8_KV), (
        key_cache.dtype, q.dtype)
    assert key_cache.stride(-1) == 1 and value_cache.stride(-1) == 1
    num_seqs = seq_lens.shape[0]
    assert query_start_loc.shape[0] == num_seqs + 1 and block_tables.shape[0] == num_seqs
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    assert out.shape == q.shape and out.stride(-1) == 1
    if num_tokens == 0 or num_seqs == 0:
        return out
    if q.stride(-1) != 1:
        q = q.contiguous()

    group = num_heads // num_kv_heads
    head_dim_p = max(16, next_power_of_2(head_dim))
    on_gpu = q.device.type == "cuda"
    decode_only = max_query_len is not None and max_query_len <= 1
    prefill_only = not decode_only and num_seqs == 1 and num_tokens > 1
    kv_upper = block_tables.shape[1] * block_size
    if max_seq_len is not None:
        kv_upper = min(kv_upper, max_seq_len)

    common = dict(
        GROUP=group,
        BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim,
        HEAD_DIM_P=head_dim_p,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        # Triton's CPU interpreter mis-computes bf16 tl.dot; do those dots in fp32 there.
        UPCAST_DOT=not on_gpu and q.dtype == torch.bfloat16,
    )
    args = (
        out, q, key_cache, value_cache, query_start_loc, seq_lens, block_tables,
    )  # fmt: skip
    strides = (
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        block_tables.stride(0),
    )  # fmt: skip
    qk_scale = float(scale) * _LOG2E
    pdl = pdl_args(q.device)
    row_bytes = head_dim * key_cache.element_size()  # one (token, KV head) row of the cache

    def launch(decode: bool, grid0: int, cfg: _Config, splits: int,
               order: torch.Tensor | None = None) -> None:
        if splits > 1:
            f32 = dict(dtype=torch.float32, device=q.device)
            part_acc = torch.empty((num_tokens, num_heads, splits, head_dim_p), **f32)
            part_ml = torch.empty((num_tokens, num_heads, splits, 2), **f32)
        else:
            part_acc = part_ml = out  # unused placeholders
        # Decode splits merge inside the launch (the last split of each request and KV head
        # to finish) for grids large enough, else in a second launch; OCTAVO_ATTN_SPLIT_MERGE
        # forces either.
        split_decode = decode and splits > 1
        forced = attn_split_merge()
        merge = split_decode and (_merge_in_launch(num_seqs * num_kv_heads, q.device)
                                  if forced is None else forced)
        keys = min_split_keys
        if keys is None:  # the interpreter's tests split tiny contexts
            keys = _MIN_SPLIT_TOKENS if on_gpu and merge else 0
        # The minimum part applies to decodes; a prefill chunk's parts are its even share.
        min_split = max(cfg.block_n, keys) if decode else cfg.block_n
        cnt = split_k_counters(q.device, grid0 * num_kv_heads) if merge else seq_lens
        # A split decode's first K/V rows asked for before its PDL wait (OCTAVO_ATTN_EARLY_KV;
        # a row must be whole 16-byte units for the bulk prefetch).
        early = (split_decode and pdl["PDL"] and order is None and attn_early_kv()
                 and row_bytes % 16 == 0)
        _paged_attention_kernel[(grid0, num_kv_heads, splits)](
            *args, part_acc, part_ml, cnt, seq_lens if order is None else order, qk_scale,
            num_seqs, *strides, num_heads, splits,
            DECODE=decode, BLOCK_Q=cfg.block_q, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
            SPLIT=splits > 1, MERGE=merge, MIN_SPLIT=min_split,
            SPLITS_P=next_power_of_2(splits), ORDER=order is not None,
            EARLY_ROWS=2 * cfg.block_n if early else 0, ROW_BYTES=row_bytes, **common,
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages, **pdl,
        )  # fmt: skip
        splits_p = next_power_of_2(splits)
        if split_decode and not merge:
            _split_reduce_kernel[(num_seqs, num_heads)](
                out, part_acc, part_ml, query_start_loc, seq_lens, num_heads, splits,
                out.stride(0), out.stride(1),
                HEAD_DIM=head_dim, HEAD_DIM_P=head_dim_p, SPLITS_P=splits_p,
                BLOCK_N=cfg.block_n, MIN_SPLIT=min_split,
                num_warps=4 if head_dim_p >= 128 else 2, **pdl,
            )  # fmt: skip
        elif splits > 1:
            # Heads per program: as many as keep a program's partials within 8K floats.
            heads = min(next_power_of_2(num_heads), max(1, 8192 // (splits_p * head_dim_p)))
            _split_reduce_tokens_kernel[(num_tokens, triton.cdiv(num_heads, heads))](
                out, part_acc, part_ml, query_start_loc, num_seqs, num_heads, splits,
                out.stride(0), out.stride(1), HEADS=heads,
                HEAD_DIM=head_dim, HEAD_DIM_P=head_dim_p, SPLITS_P=splits_p, num_warps=4,
                **pdl,
            )  # fmt: skip

    if not prefill_only and (decode_tiles is not None or (
            decode_only and num_splits is None and attn_streamk())):
        streamk_decode(q, key_cache, value_cache, query_start_loc, seq_lens, block_tables,
                       scale, out, tiles=decode_tiles, order=decode_order,
                       max_seq_len=max_seq_len)
    elif not prefill_only:
        splits = num_splits
        if splits is None:
            # Mixed batches are left unsplit: the prefill launch dominates them, and the
            # number of decodes (hence of programs) is not known on the host.
            splits = 1
            if decode_only:
                splits = attn_decode_splits() or _pick_num_splits(
                    num_seqs * num_kv_heads, kv_upper, q.device)
        splits = max(1, int(splits))
        cfg = _pick_config(True, group, head_dim_p, q.element_size(), on_gpu, split=splits > 1)
        cfg = with_tile(cfg, attn_decode_tile() if on_gpu else None)  # a measurement's override
        if decode_order is not None:
            assert decode_order.shape == (num_seqs,) and decode_order.dtype == torch.int32
        launch(True, num_seqs, cfg, splits, decode_order)

    if not decode_only:
        cfg = _pick_config(False, group, head_dim_p, q.element_size(), on_gpu)
        cfg = with_tile(cfg, attn_prefill_tile() if on_gpu else None)  # a measurement's override
        num_tiles = num_tokens // cfg.block_q + num_seqs
        splits = prefill_splits
        if splits is None:
            splits = 1
            if on_gpu:
                splits = _pick_prefill_splits(num_tiles * num_kv_heads, kv_upper, q.device)
                if splits > 1 and _SPLIT_PREFILL_ROWS > cfg.block_m:
                    # Splitting anyway: taller query tiles read each K/V tile for more rows,
                    # and the splits give back the parallelism.
                    block_q, block_m = _rows(_SPLIT_PREFILL_ROWS, group)
                    cfg = _Config(block_q, block_m, cfg.block_n, 4, 2)
                    num_tiles = num_tokens // cfg.block_q + num_seqs
                    splits = _pick_prefill_splits(num_tiles * num_kv_heads, kv_upper,
                                                  q.device)
        launch(False, num_tiles, cfg, max(1, int(splits)))
    return out
