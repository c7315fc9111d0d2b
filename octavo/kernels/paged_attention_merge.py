"""Merging the KV splits of :mod:`octavo.kernels.paged_attention` ("flash decoding"): each
split of a query token's context leaves an unnormalised partial state per head in fp32
(``acc`` [T, H, S, HEAD_DIM_P], (running max, running sum) pairs [T, H, S, 2], the max in the
log2 domain), and the output is their softmax-weighted sum.

Three ways in: a decode launch's last program of each (request, KV head) merges in place
(``_merge_in_place``); otherwise a second launch merges decodes (``_split_reduce_kernel``) or
prefill chunks (``_split_reduce_tokens_kernel``). ``_split_tokens`` is the one rule for how a
context is cut, shared by the attention kernel and the decode merges.
"""

from __future__ import annotations

from octavo.kernels.pdl import begin as pdl_begin
from octavo.kernels.triton_utils import tl, triton


@triton.jit
def _split_tokens(kv_end, num_splits, BLOCK_N: tl.constexpr, MIN_SPLIT: tl.constexpr):
    """Keys per split of a context of ``kv_end`` keys: an even, BLOCK_N-aligned share of
    ``num_splits``, at least MIN_SPLIT."""
    return tl.maximum(tl.cdiv(tl.cdiv(kv_end, num_splits), BLOCK_N) * BLOCK_N, MIN_SPLIT)


@triton.jit
def _merged_head(part_acc_ptr, part_ml_ptr, row, num_splits, used, offs_d, d_ok,
                 HEAD_DIM_P: tl.constexpr, SPLITS_P: tl.constexpr):
    """The float32 output of one (token, head) partial row ``row`` (= token * heads + head)
    from its first ``used`` splits, each of which holds at least one key. Read through L2
    (.cg): in the in-place merge other programs wrote the partials (an L1 line could be
    stale)."""
    offs_s = tl.arange(0, SPLITS_P)
    s_ok = offs_s < used
    p = row * num_splits + offs_s
    m = tl.load(part_ml_ptr + p * 2, mask=s_ok, other=float("-inf"), cache_modifier=".cg")
    l_s = tl.load(part_ml_ptr + p * 2 + 1, mask=s_ok, other=0.0, cache_modifier=".cg")
    acc = tl.load(part_acc_ptr + p[:, None] * HEAD_DIM_P + offs_d[None, :],
                  mask=s_ok[:, None] & d_ok[None, :], other=0.0, cache_modifier=".cg")
    w = tl.exp2(m - tl.max(m, 0))
    return tl.sum(acc * w[:, None], 0) / tl.sum(w * l_s, 0)


@triton.jit
def _merge_in_place(out_ptr, part_acc_ptr, part_ml_ptr, cnt, tok, kv_head, offs_d, d_ok,
                    num_heads, num_splits, used, stride_ot, stride_oh, GROUP: tl.constexpr,
                    HEAD_DIM_P: tl.constexpr, SPLITS_P: tl.constexpr):
    """Decode (one query token ``tok``): take a ticket from this (request, KV head)'s counter;
    the program that takes the last of ``used`` merges the used splits into the output rows
    of the group's heads and resets the counter (as :mod:`octavo.kernels.split_k` does for
    GEMMs). One launch instead of a second, merging kernel."""
    tl.debug_barrier()  # every thread's partials are written before the ticket is taken
    ticket = tl.atomic_add(cnt, 1, sem="acq_rel")
    if ticket == used - 1:
        for g in tl.static_range(GROUP):
            head = kv_head * GROUP + g
            out = _merged_head(part_acc_ptr, part_ml_ptr, tok * num_heads + head, num_splits,
                               used, offs_d, d_ok, HEAD_DIM_P, SPLITS_P)
            tl.store(out_ptr + tok * stride_ot + head * stride_oh + offs_d,
                     out.to(out_ptr.dtype.element_ty), mask=d_ok)
        tl.atomic_xchg(cnt, 0)


@triton.jit(do_not_specialize=["num_splits"])
def _split_reduce_kernel(
    out_ptr,
    part_acc_ptr,
    part_ml_ptr,
    qsl_ptr,
    seq_lens_ptr,
    num_heads,
    num_splits,
    stride_ot,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P: tl.constexpr,
    SPLITS_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MIN_SPLIT: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_begin(PDL)
    # One program per (request, head): merge the per-split partial softmax states of a decode.
    b = tl.program_id(0)
    h = tl.program_id(1)
    tok = tl.load(qsl_ptr + b)
    if tl.load(qsl_ptr + b + 1) - tok != 1:
        return
    seq_len = tl.load(seq_lens_ptr + b)  # a decode's keys: kv_end in the attention kernel
    used = tl.cdiv(seq_len, _split_tokens(seq_len, num_splits, BLOCK_N, MIN_SPLIT))
    if used == 1:  # the attention program wrote the output itself
        return
    offs_d = tl.arange(0, HEAD_DIM_P)
    d_ok = offs_d < HEAD_DIM
    out = _merged_head(part_acc_ptr, part_ml_ptr, tok.to(tl.int64) * num_heads + h, num_splits,
                       used, offs_d, d_ok, HEAD_DIM_P, SPLITS_P)
    o_ptrs = out_ptr + tok.to(tl.int64) * stride_ot + h * stride_oh + offs_d
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=d_ok)


@triton.jit(do_not_specialize=["num_seqs", "num_splits"])
def _split_reduce_tokens_kernel(
    out_ptr,
    part_acc_ptr,
    part_ml_ptr,
    qsl_ptr,
    num_seqs,
    num_heads,
    num_splits,
    stride_ot,
    stride_oh,
    HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P: tl.constexpr,
    SPLITS_P: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_begin(PDL)
    # Prefill launch's merge: one program per (token, HEADS heads), all splits of all its
    # heads loaded at once (a chain of dependent loads per head would cost more than the
    # arithmetic). Only tokens of requests with more than one new token have partials.
    t = tl.program_id(0)
    # The last request starting at or before t owns it (empty requests before it start at
    # the same place; a padding token finds b == num_seqs).
    lo = t * 0
    hi = lo + num_seqs
    while lo < hi:
        mid = (lo + hi + 1) // 2
        ok = tl.load(qsl_ptr + mid) <= t
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid - 1)
    if lo >= num_seqs:
        return
    if tl.load(qsl_ptr + lo + 1) - tl.load(qsl_ptr + lo) <= 1:
        return
    offs_h = tl.program_id(1) * HEADS + tl.arange(0, HEADS)
    offs_s = tl.arange(0, SPLITS_P)
    offs_d = tl.arange(0, HEAD_DIM_P)
    h_ok = offs_h < num_heads
    ok = h_ok[:, None] & (offs_s < num_splits)[None, :]  # [HEADS, SPLITS_P]
    part = ((t.to(tl.int64) * num_heads + offs_h) * num_splits)[:, None] + offs_s[None, :]
    # Absent splits weigh exp2(-1e30 - max) = 0; absent heads are never stored.
    m = tl.load(part_ml_ptr + part * 2, mask=ok, other=-1.0e30)
    l_s = tl.load(part_ml_ptr + part * 2 + 1, mask=ok, other=0.0)
    w = tl.exp2(m - tl.max(m, 1)[:, None])
    denom = tl.sum(w * l_s, 1)
    d_ok = offs_d < HEAD_DIM
    acc = tl.load(part_acc_ptr + part[:, :, None] * HEAD_DIM_P + offs_d[None, None, :],
                  mask=ok[:, :, None] & d_ok[None, None, :], other=0.0)
    out = tl.sum(acc * w[:, :, None], 1) / tl.maximum(denom, 1.0e-30)[:, None]
    o_ptrs = (out_ptr + t.to(tl.int64) * stride_ot + offs_h[:, None] * stride_oh
              + offs_d[None, :])
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=h_ok[:, None] & d_ok[None, :])
