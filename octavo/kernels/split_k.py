"""Split-K without a second launch: each program of a K-split GEMM writes its float32 partial
tile, takes a ticket from a per-tile counter, and the program that takes the last ticket adds
the partials in split order (deterministic) and writes the output, then resets the counter.

Under CUDA graphs a separate reduction (sum, then cast) costs two more launches per linear
layer, several microseconds each: as much as a decode-sized GEMV itself. The counters live in
one persistent, zeroed int32 buffer per device that every call leaves zeroed again, so the
kernels capture into graphs as they are.
"""

from __future__ import annotations

import dataclasses

import torch

from octavo.kernels.activation import silu_mul
from octavo.kernels.triton_utils import num_compute_units, tl, triton

_COUNTERS: dict[torch.device, torch.Tensor] = {}
_RETIRED: list[torch.Tensor] = []


def plan(k: int, step: int, splits: int) -> tuple[int, int]:
    """(splits, K per split) for K in steps of ``step`` (K a multiple of it): at most
    ``splits``, each a whole number of steps, none empty."""
    steps = k // step
    splits = max(1, min(splits, steps))
    per_split = triton.cdiv(steps, splits) * step
    return triton.cdiv(k, per_split), per_split


def to_fill(tiles: int, k_steps: int, device: torch.device, waves: int, most: int = 32) -> int:
    """K splits that give about ``waves`` programs per SM over ``tiles`` output tiles: at
    least one, at most one per K step and ``most``."""
    return max(1, min(triton.cdiv(waves * num_compute_units(device), tiles), k_steps, most))


def within(tiles: int, k_steps: int, device: torch.device, waves: int, most: int = 16) -> int:
    """K splits that keep ``tiles`` output tiles within ``waves`` programs per SM (rounded
    down, as the integer GEMMs were tuned): at least one, at most one per K step and
    ``most``."""
    return max(1, min(k_steps, waves * num_compute_units(device) // max(1, tiles), most))


# Warps per CTA of the CUDA mma kernels: their shared reduction buffer (kMaxWarps in
# octavo/kernels/cuda/mma_common.cuh).
MAX_CTA_WARPS = 8


@dataclasses.dataclass(frozen=True)
class WarpPlan:
    """K over warps for the CUDA mma kernels (``swapab_mma``, ``dense_mma``): each warp of a
    tile a range of K in whole chunks of ``steps`` 32-wide steps, the tile's warps in
    ``splits`` CTAs of ``warps``."""

    steps: int  # 32-wide K steps per chunk
    k_per_warp: int
    warps: int  # per CTA
    splits: int  # CTAs per tile

    @property
    def chunk(self) -> int:
        return 32 * self.steps


def over_warps(k: int, tiles: int, steps: int, sms: int, warps_per_sm: int,
               most_warps: int) -> WarpPlan:
    """Split K (a multiple of the chunk) over warps so ``tiles`` output tiles make about
    ``warps_per_sm`` warps per SM: each warp a whole number of chunks, none idle but in the
    last CTA, the warps of a tile in CTAs of at most ``most_warps``."""
    chunk = 32 * steps
    chunks = k // chunk
    want = max(1, -(-warps_per_sm * sms // tiles))  # warps per tile
    per_warp = -(-chunks // min(want, chunks))
    warps_per_tile = -(-chunks // per_warp)
    splits = -(-warps_per_tile // most_warps)
    warps = -(-warps_per_tile // splits)  # even CTAs: 28 warps as 4 x 7, not 8 + 8 + 8 + 4
    per_warp = -(-chunks // (warps * splits))
    return WarpPlan(steps, per_warp * chunk, warps, splits)


def in_one_cta(k: int, steps: int, most_warps: int) -> WarpPlan:
    """K of a tile over at most ``most_warps`` warps of one CTA (no split over CTAs, so no
    partial sums through global memory and no ticket): each warp a whole number of chunks."""
    chunks = k // (32 * steps)
    per_warp = -(-chunks // min(most_warps, chunks))
    return WarpPlan(steps, per_warp * 32 * steps, -(-chunks // per_warp), 1)


def buffers(m: int, n: int, splits: int, like: torch.Tensor, out_n: int | None = None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """(output [m, out_n or n] in ``like``'s dtype, float32 partials [splits, m, n]); with
    one split the partials are the output itself (never written as such). ``out_n``: an
    output narrower than the tile columns (``store_or_reduce``'s GLU: n / 2)."""
    out = torch.empty(m, out_n or n, device=like.device, dtype=like.dtype)
    partial = out.unsqueeze(0) if splits == 1 else torch.empty(
        splits, m, n, device=like.device, dtype=torch.float32)
    return out, partial


def counters(device: torch.device, tiles: int) -> torch.Tensor:
    """A zeroed int32 buffer of at least ``tiles`` counters, kept zeroed by the kernels."""
    buf = _COUNTERS.get(device)
    if buf is None or buf.numel() < tiles:
        if buf is not None:  # CUDA graphs captured earlier may still point at it
            _RETIRED.append(buf)
        buf = torch.zeros(max(tiles, 4096), dtype=torch.int32, device=device)
        _COUNTERS[device] = buf
    return buf


@triton.jit
def _store(out_ptr, acc, offs_m, offs_n, mask, stride_om, stride_on, GLU: tl.constexpr):
    """The output tile's store. GLU: the tile's columns are pairs (2p: gate, 2p + 1: up) of
    output column p = offs_n // 2, which gets silu(gate) * up, each of them first rounded to
    the output dtype as a stored [gate | up] would be (so the same bits as the unfused
    projection followed by ``silu_and_mul``)."""
    dtype = out_ptr.dtype.element_ty
    if GLU:
        bm: tl.constexpr = acc.shape[0]
        half: tl.constexpr = acc.shape[1] // 2
        gate, up = tl.split(tl.reshape(acc.to(dtype).to(tl.float32), (bm, half, 2)))
        ptrs = out_ptr + offs_m[:, None] * stride_om + (offs_n // 2)[None, :] * stride_on
        ptrs, _ = tl.split(tl.reshape(ptrs, (bm, half, 2)))
        ok, _ = tl.split(tl.reshape(mask, (bm, half, 2)))
        tl.store(ptrs, silu_mul(gate, up).to(dtype), mask=ok)
    else:
        out = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
        tl.store(out, acc.to(dtype), mask=mask)


@triton.jit
def store_or_reduce(acc, offs_m, offs_n, mask, out_ptr, stride_om, stride_on, part_ptr,
                    stride_ps, stride_pm, stride_pn, cnt_ptr, tile, pid_k, num_splits,
                    REDUCE_UNROLL: tl.constexpr = 16, GLU: tl.constexpr = False):
    """Store ``acc`` (this program's [BLOCK_M, BLOCK_N] share) as the output when K is not
    split; otherwise as partial ``pid_k``, and if this program finishes the tile last, sum
    every partial into the output. ``tile``: this output tile's counter index. GLU: the
    output is the gated activation of the tile's column pairs (``_store``); the partials
    keep the pairs."""
    if num_splits == 1:
        _store(out_ptr, acc, offs_m, offs_n, mask, stride_om, stride_on, GLU)
    else:
        part = part_ptr + offs_m[:, None] * stride_pm + offs_n[None, :] * stride_pn
        tl.store(part + pid_k * stride_ps, acc, mask=mask)
        tl.debug_barrier()  # every thread's partial is written before the ticket is taken
        ticket = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel")
        if ticket == num_splits - 1:
            total = tl.zeros(acc.shape, dtype=tl.float32)
            for k0 in range(0, num_splits, REDUCE_UNROLL):
                # REDUCE_UNROLL independent loads in flight per round trip to L2 (the
                # partials of a 64-way split were read 4 at a time), added in split order.
                for j in tl.static_range(REDUCE_UNROLL):
                    # .cg: read from L2, where other SMs' partials are (not a stale L1 line).
                    total += tl.load(part + (k0 + j) * stride_ps,
                                     mask=mask & ((offs_n[None, :] * 0 + k0 + j)
                                                  < num_splits), other=0.0,
                                     cache_modifier=".cg")
            _store(out_ptr, total, offs_m, offs_n, mask, stride_om, stride_on, GLU)
            tl.atomic_xchg(cnt_ptr + tile, 0)


@triton.jit
def store_rows(acc0, acc1, offs_n, n_mask, M, out_ptr, stride_om, stride_on, part_ptr,
               stride_ps, stride_pm, stride_pn, cnt_ptr, tile, pid_k, num_splits,
               BLOCK_M: tl.constexpr, GLU: tl.constexpr = False):
    """The one- or two-row GEMVs' end: row 0's accumulator ``acc0`` and row 1's ``acc1``
    ([BLOCK_N, W] each, BLOCK_M = 2) summed along W into output rows 0 and 1, then
    :func:`store_or_reduce`."""
    offs_m = tl.arange(0, BLOCK_M)
    res = tl.where(offs_m[:, None] == 0, tl.sum(acc0, axis=1)[None, :], 0.0)
    if BLOCK_M > 1:
        res = tl.where(offs_m[:, None] == 1, tl.sum(acc1, axis=1)[None, :], res)
    store_or_reduce(res, offs_m, offs_n, (offs_m[:, None] < M) & n_mask[None, :], out_ptr,
                    stride_om, stride_on, part_ptr, stride_ps, stride_pm, stride_pn, cnt_ptr,
                    tile, pid_k, num_splits, GLU=GLU)
