"""A mixture-of-experts layer's routing and expert alignment in one launch, for decode batches.

``fused_moe`` needs, before its two grouped GEMMs, each token's top-k experts and weights
(softmax over the router's logits, the top k, optionally renormalised, rounded to the
activations' dtype) and the (token, expert) pairs sorted by expert with each expert's run padded
to BLOCK_M (``fused_moe.align_by_expert``). In torch that is 30 ops a layer after the router's
matmul (softmax, topk, the renormalisation and casts; then the counts, cumsums, a stable sort,
gathers, a scatter and a searchsorted), some of them several launches. At a decode batch each
moves a few hundred bytes, so Qwen3-30B-A3B's 48 layers issued over 1,400 such launches a step
around their 96 grouped-GEMM launches.

Here one launch does all of it: each program routes a block of tokens, and the program that
takes the last ticket (``split_k.counters``, left zeroed) aligns the pairs in three more passes
over data that stay in registers or L2:

1. (``ROUTE``) per block of tokens: softmax over the logits in float32, the top k by repeated
   argmax (descending, as ``torch.topk`` returns them; ties to the lowest expert), renormalised,
   rounded to the activations' dtype and back; ids and weights stored.
2. Per block of pairs ``t * k + j``: each pair's rank inside its expert, from an atomic count
   per expert. The order inside an expert is then the device's (the interpreter's: the
   pairs'), where torch's stable sort keeps the pairs' order; no output depends on it, since
   every row of a tile is its own dot products.
3. The padded per-expert starts (a cumsum), then each pair scattered to start + rank after the
   sorted index was filled with the sentinel T*k.
4. Each BLOCK_M tile's expert: the number of padded expert ends at or before its first row
   (``searchsorted(right=True)``), E past the routing's end.

Passes 3 and 4 take the starts and ends from registers: each load of a value this launch
wrote waits on L2 (~0.5 us), and at one token a binary search over the ends in memory had
made the launch 7.3 us (H100, 2026-12-05).

All sizes are functions of (T, k, E, BLOCK_M), nothing syncs the host, so CUDA graphs capture
it. The alignment is serial in one program, so it is for small T*k (``MAX_PAIRS``); larger
batches (prefill) keep the torch path, whose launches are then small against the GEMMs.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from octavo import envs
from octavo.kernels.split_k import counters as split_k_counters
from octavo.kernels.triton_utils import HAS_TRITON, interpreting, next_power_of_2, tl, triton

# Pairs (T * k) up to which the launch replaces the torch ops: its alignment walks the pairs
# in one program, in blocks of up to 128, so 2,048 pairs (batch 256 at k = 8) take 16 short
# steps a pass.
MAX_PAIRS = 4096
MAX_EXPERTS = 1024
# Float dtypes the weights may be rounded to (``round_to``), as codes for the kernel.
_ROUND = {None: 0, torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


class Routed(NamedTuple):
    """``weights`` float32 [T, k], ``ids`` int32 [T, k]; ``sorted_ids`` and ``tile_experts``
    as ``fused_moe.Alignment`` holds them."""

    weights: torch.Tensor
    ids: torch.Tensor
    sorted_ids: torch.Tensor
    tile_experts: torch.Tensor


@triton.jit
def _align(ids_ptr, rank_ptr, cnt_ptr, sorted_ptr, tiles_ptr, n, E, ROWS,
           BLOCK_M: tl.constexpr, E_PAD: tl.constexpr, BLOCK_P: tl.constexpr,
           BLOCK_R: tl.constexpr, BLOCK_TILES: tl.constexpr):
    cols = tl.arange(0, E_PAD)
    # Pass 2: each pair's rank inside its expert, from a count per expert (atomics; the
    # order inside an expert is the device's, which no output depends on).
    ecount = cnt_ptr + cols
    tl.store(ecount, tl.zeros((E_PAD,), dtype=tl.int32))
    tl.debug_barrier()
    prow = tl.arange(0, BLOCK_P)
    for p0 in range(0, n, BLOCK_P):
        pairs = p0 + prow
        ok = pairs < n
        e = tl.load(ids_ptr + pairs, mask=ok, other=0, cache_modifier=".cg").to(tl.int32)
        e = tl.minimum(tl.maximum(e, 0), E - 1)  # never a count outside the experts'
        tl.store(rank_ptr + pairs, tl.atomic_add(cnt_ptr + e, 1, mask=ok), mask=ok)
    tl.debug_barrier()

    # Pass 3: padded runs, the sentinel fill, then every pair at its row.
    counts = tl.load(ecount, cache_modifier=".cg")
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, 0)
    starts = ends - padded
    for r0 in range(0, ROWS, BLOCK_R):
        r = r0 + tl.arange(0, BLOCK_R)
        tl.store(sorted_ptr + r, tl.zeros((BLOCK_R,), dtype=tl.int32) + n, mask=r < ROWS)
    tl.debug_barrier()  # the fill lands before the scatter overwrites it
    for p0 in range(0, n, BLOCK_P):
        pairs = p0 + prow
        ok = pairs < n
        e = tl.load(ids_ptr + pairs, mask=ok, other=0, cache_modifier=".cg").to(tl.int32)
        e = tl.minimum(tl.maximum(e, 0), E - 1)
        # The expert's start from the registers (a load would wait on L2 once more).
        start = tl.sum(tl.where(e[:, None] == cols[None, :], starts[None, :], 0), 1)
        rank = tl.load(rank_ptr + pairs, mask=ok, other=0, cache_modifier=".cg")
        tl.store(sorted_ptr + start + rank, pairs.to(tl.int32), mask=ok)

    # Pass 4: each tile's expert, the number of real experts whose padded run ends at or
    # before the tile's first row (E past the routing's end).
    tcol = tl.arange(0, BLOCK_TILES)
    for r0 in range(0, ROWS // BLOCK_M, BLOCK_TILES):
        tile = r0 + tcol
        done = (ends[None, :] <= (tile * BLOCK_M)[:, None]) & (cols < E)[None, :]
        tl.store(tiles_ptr + tile, tl.sum(done.to(tl.int32), 1), mask=tile < ROWS // BLOCK_M)


@triton.jit
def _route_align_kernel(
    logits_ptr, ids_ptr, weights_ptr, rank_ptr, cnt_ptr, sorted_ptr, tiles_ptr, ticket_ptr,
    T, E, stride_lt, ROWS,
    TOPK: tl.constexpr, ROUTE: tl.constexpr, RENORM: tl.constexpr, ROUND: tl.constexpr,
    BLOCK_M: tl.constexpr, E_PAD: tl.constexpr, K_PAD: tl.constexpr, BLOCK_T: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_TILES: tl.constexpr,
):  # fmt: skip
    cols = tl.arange(0, E_PAD)
    real = cols < E
    if ROUTE:
        # This program's block of tokens.
        kcols = tl.arange(0, K_PAD)
        rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        ok = rows < T
        lg = tl.load(logits_ptr + rows[:, None] * stride_lt + cols[None, :],
                     mask=ok[:, None] & real[None, :], other=float("-inf")).to(tl.float32)
        lg = tl.where(ok[:, None], lg, 0.0)  # rows past T: finite, never stored
        p = tl.exp(lg - tl.max(lg, 1)[:, None])
        probs = p / tl.sum(p, 1)[:, None]
        # A NaN or infinite logit makes its row's probabilities NaN. Placed at -0.5 (under
        # every real probability, over the -1 of padded and picked experts), such a row
        # takes its lowest experts, distinct and in range, and its weights stay NaN.
        probs = tl.where(probs == probs, probs, -0.5)
        probs = tl.where(real[None, :], probs, -1.0)  # padded experts are never chosen
        w = tl.zeros((BLOCK_T, K_PAD), dtype=tl.float32)
        ids = tl.zeros((BLOCK_T, K_PAD), dtype=tl.int32)
        for j in tl.static_range(TOPK):
            best = tl.max(probs, 1)
            # The lowest index among equal maxima (as argmax).
            pick = tl.min(tl.where(probs == best[:, None], cols[None, :], E_PAD), 1)
            pick = tl.minimum(pick, E - 1)
            best = tl.where(best == -0.5, float("nan"), best)
            w = tl.where(kcols[None, :] == j, best[:, None], w)
            ids = tl.where(kcols[None, :] == j, pick[:, None], ids)
            probs = tl.where(cols[None, :] == pick[:, None], -1.0, probs)
        if RENORM:
            w = w / tl.sum(w, 1)[:, None]
        if ROUND == 1:
            w = w.to(tl.float16).to(tl.float32)
        elif ROUND == 2:
            w = w.to(tl.bfloat16).to(tl.float32)
        out = rows[:, None] * TOPK + kcols[None, :]
        keep = ok[:, None] & (kcols[None, :] < TOPK)
        tl.store(weights_ptr + out, w, mask=keep)
        tl.store(ids_ptr + out, ids, mask=keep)
    # The program that takes the last ticket (every block's ids stored) aligns the pairs.
    tl.debug_barrier()
    ticket = tl.atomic_add(ticket_ptr, 1, sem="acq_rel")
    if ticket == tl.num_programs(0) - 1:
        _align(ids_ptr, rank_ptr, cnt_ptr, sorted_ptr, tiles_ptr, T * TOPK, E, ROWS,
               BLOCK_M, E_PAD, BLOCK_P, BLOCK_R, BLOCK_TILES)
        tl.atomic_xchg(ticket_ptr, 0)


def available(x: torch.Tensor, num_pairs: int, num_experts: int) -> bool:
    """Whether the one-program launch serves a layer on ``x``'s device at this size (and
    ``OCTAVO_MOE_ROUTE`` is on)."""
    return (envs.moe_route() and HAS_TRITON and (x.is_cuda or interpreting())
            and 0 < num_pairs <= MAX_PAIRS and num_experts <= MAX_EXPERTS)


def blocks(t: int, n: int, e_pad: int) -> tuple[int, int, int]:
    """(BLOCK_T, BLOCK_P, BLOCK_TILES) for ``t`` tokens, ``n`` pairs and ``e_pad`` padded
    experts: each [block, E_PAD] register tile at most ~4K elements (2K for the float routing
    tile), and no wider than the tokens or pairs there are."""
    block_t = max(1, min(next_power_of_2(t), 2048 // e_pad, 4))
    block_p = max(16, min(128, next_power_of_2(n), 4096 // e_pad))
    block_tiles = max(4, min(32, 4096 // e_pad))
    return block_t, block_p, block_tiles


def _launch(logits, ids, weights, t: int, k: int, e: int, block_m: int, renormalize: bool,
            round_to: torch.dtype | None, route: bool) -> Routed:
    from octavo.kernels.fused_moe import padded_rows

    n = t * k
    device = ids.device
    rows = padded_rows(n, e, block_m)
    if n == 0:  # nothing to route: empty outputs, no launch (a grid of zero programs)
        empty = torch.empty(0, dtype=torch.int32, device=device)
        return Routed(weights, ids, empty, empty)
    sorted_ids = torch.empty(rows, dtype=torch.int32, device=device)
    tile_experts = torch.empty(rows // block_m, dtype=torch.int32, device=device)
    e_pad = max(16, next_power_of_2(e))
    # Scratch: each pair's rank, each expert's count.
    scratch = torch.empty(n + e_pad, dtype=torch.int32, device=device)
    rank, cnt = scratch[:n], scratch[n:]
    block_t, block_p, block_tiles = blocks(t, n, e_pad)
    _route_align_kernel[(triton.cdiv(t, block_t) if route else 1,)](
        logits, ids, weights, rank, cnt, sorted_ids, tile_experts,
        split_k_counters(device, 1), t, e, logits.stride(0), rows,
        TOPK=k, ROUTE=route, RENORM=renormalize, ROUND=_ROUND[round_to], BLOCK_M=block_m,
        E_PAD=e_pad, K_PAD=max(2, next_power_of_2(k)), BLOCK_T=block_t, BLOCK_P=block_p,
        BLOCK_R=128, BLOCK_TILES=block_tiles, num_warps=4,
    )  # fmt: skip
    return Routed(weights, ids, sorted_ids, tile_experts)


def route_and_align(logits: torch.Tensor, top_k: int, renormalize: bool, block_m: int,
                    round_to: torch.dtype | None = None) -> Routed:
    """From router logits [T, E] (any float dtype): float32 softmax, the top ``top_k``
    (descending), renormalised to sum to one if ``renormalize``, rounded to ``round_to`` and
    back to float32; and the pairs' alignment for tiles of ``block_m`` rows."""
    t, e = logits.shape
    if not 1 <= top_k <= e:
        raise ValueError(f"route_and_align: top_k={top_k} must be in [1, {e}] (the experts)")
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    weights = torch.empty(t, top_k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(t, top_k, dtype=torch.int32, device=logits.device)
    return _launch(logits, ids, weights, t, top_k, e, block_m, renormalize, round_to, True)


def align(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> Routed:
    """``fused_moe.align_by_expert`` in one launch (the same rows but for the order inside
    each expert's run): ``topk_ids`` [T, k] of any integer dtype; the weights are unset."""
    t, k = topk_ids.shape
    ids = topk_ids if topk_ids.is_contiguous() else topk_ids.contiguous()
    dummy = torch.empty(1, 1, dtype=torch.float32, device=ids.device)
    return _launch(dummy, ids, dummy, t, k, num_experts, block_m, False, None, False)
