"""Weights pulled into the GPU's L2 cache while a bandwidth-light kernel runs.

A decode step at small batch is latency-bound: attention over a short context or at batch 32
(W4) uses well under half of HBM's bandwidth, and the projections after it, each a few
megabytes read by a short launch, spend much of their time ramping up to full bandwidth.
Weights are written by no kernel of the step, so they can be read early: one launch placed
right after attention (under PDL its programs start while attention still runs) issues Hopper's
bulk L2 prefetch (``cp.async.bulk.prefetch.L2``: one instruction moves a whole chunk, no
registers or shared memory wait for it) for the weights of the projections that follow, then
waits for attention like any PDL kernel, so ordering is unchanged. The projections then find
their weights in L2 (50 MB on an H200) instead of HBM.

Only on NVIDIA sm_90+ with PDL; the chunk table (address, bytes) is built once per list of
tensors and reused by every step (captured CUDA graphs included).
"""

from __future__ import annotations

import torch

from octavo.kernels.pdl import begin as pdl_begin
from octavo.kernels.pdl import enabled as pdl_enabled
from octavo.kernels.pdl import launch_args as pdl_args
from octavo.kernels.triton_utils import tl, triton

CHUNK_BYTES = 16 * 1024  # one prefetch instruction's range
_WARPS = 1
_PER_PROGRAM = 32 * _WARPS  # one chunk per thread


@triton.jit
def _bulk_prefetch(addr, size, EVICT_LAST: tl.constexpr):
    # Each thread issues the prefetch of its own chunk; a chunk of 0 bytes (the table's
    # padding) is skipped by the predicate.
    if EVICT_LAST:
        tl.inline_asm_elementwise(
            """{
            .reg .pred p;
            .reg .b64 pol;
            setp.ne.u32 p, $2, 0;
            createpolicy.fractional.L2::evict_last.b64 pol, 1.0;
            @p cp.async.bulk.prefetch.L2.global.L2::cache_hint [$1], $2, pol;
            mov.u32 $0, 0;
            }""", "=r,l,r", [addr, size], dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.inline_asm_elementwise(
            """{
            .reg .pred p;
            setp.ne.u32 p, $2, 0;
            @p cp.async.bulk.prefetch.L2.global [$1], $2;
            mov.u32 $0, 0;
            }""", "=r,l,r", [addr, size], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _l2_prefetch_kernel(table_ptr, BLOCK: tl.constexpr, EVICT_LAST: tl.constexpr,
                        PDL: tl.constexpr):
    # table [n, 2] int64 (address, bytes), n a multiple of BLOCK; one chunk per thread.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    addr = tl.load(table_ptr + offs * 2)
    size = tl.load(table_ptr + offs * 2 + 1).to(tl.int32)
    _bulk_prefetch(addr, size, EVICT_LAST)
    # Nothing is read that the step writes and nothing is written: the wait only keeps the
    # chain's order (the next kernel's wait covers the one before this launch).
    pdl_begin(PDL)


@triton.jit
def _line_prefetch(addr, ok, EVICT_LAST: tl.constexpr):
    # One 128-byte line per element, where ok != 0.
    if EVICT_LAST:
        tl.inline_asm_elementwise(
            """{
            .reg .pred p;
            setp.ne.u32 p, $2, 0;
            @p prefetch.global.L2::evict_last [$1];
            mov.u32 $0, 0;
            }""", "=r,l,r", [addr, ok], dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.inline_asm_elementwise(
            """{
            .reg .pred p;
            setp.ne.u32 p, $2, 0;
            @p prefetch.global.L2 [$1];
            mov.u32 $0, 0;
            }""", "=r,l,r", [addr, ok], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _l2_prefetch_lines_kernel(table_ptr, CHUNKS: tl.constexpr, LINES: tl.constexpr,
                              EVICT_LAST: tl.constexpr, PDL: tl.constexpr):
    # Program p prefetches chunks [p * CHUNKS, (p + 1) * CHUNKS), all table entries loaded
    # in one round, one line-sized prefetch per (chunk, line); no completion is waited for:
    # the lines arrive while the next kernels run.
    c = tl.program_id(0) * CHUNKS + tl.arange(0, CHUNKS)
    addr = tl.load(table_ptr + c * 2)
    size = tl.load(table_ptr + c * 2 + 1)
    off = tl.arange(0, LINES).to(tl.int64) * 128
    ok = (off[None, :] < size[:, None]).to(tl.int32)
    _line_prefetch(addr[:, None] + off[None, :], ok, EVICT_LAST)
    pdl_begin(PDL)


def supported(device: torch.device) -> bool:
    """Bulk L2 prefetch needs sm_90+; placing it under a running kernel needs PDL."""
    return device.type == "cuda" and pdl_enabled(device)


def chunk_table(tensors: list[torch.Tensor], budget_bytes: int,
                chunk_bytes: int = CHUNK_BYTES) -> torch.Tensor:
    """[n, 2] int64 (address, bytes) chunks covering ``tensors`` in order, at most
    ``budget_bytes`` in all (the last tensor cut short), of at most ``chunk_bytes`` (a
    multiple of 16) each, padded with empty chunks to a
    multiple of the launch's programs. Ranges are widened to 16-byte alignment (the bulk
    prefetch's unit), which stays within the tensors' pages."""
    rows: list[tuple[int, int]] = []
    left = budget_bytes
    for t in tensors:
        if left <= 0:
            break
        start = t.data_ptr()
        end = start + min(t.numel() * t.element_size(), left)
        left -= end - start
        start -= start % 16
        end += -end % 16
        for a in range(start, end, chunk_bytes):
            rows.append((a, min(chunk_bytes, end - a)))
    rows += [(0, 0)] * (-len(rows) % _PER_PROGRAM)
    device = tensors[0].device if tensors else torch.device("cpu")
    return torch.tensor(rows, dtype=torch.int64, device=device).reshape(-1, 2)


def l2_prefetch(table: torch.Tensor, evict_last: bool = False, pdl: bool = True,
                lines: int = 0) -> None:
    """Launch the prefetch of ``table``'s chunks (from :func:`chunk_table`); ``pdl=False``:
    a plain launch (on a side stream, outside the decode chain); ``lines``: the table's
    chunk bytes, prefetched as per-thread 128-byte lines (nothing waits for them) instead of
    the bulk prefetch (0)."""
    n = table.shape[0]
    if n == 0:
        return
    assert n % _PER_PROGRAM == 0 and table.is_contiguous(), table.shape
    if lines:
        line_count = triton.next_power_of_2(triton.cdiv(lines, 128))
        chunks = max(1, min(_PER_PROGRAM, 1024 // line_count))  # ~1,024 lines a program
        _l2_prefetch_lines_kernel[(n // chunks,)](
            table, CHUNKS=chunks, LINES=line_count, EVICT_LAST=evict_last, num_warps=4,
            **(pdl_args(table.device) if pdl else {"PDL": False}))
        return
    _l2_prefetch_kernel[(n // _PER_PROGRAM,)](
        table, BLOCK=_PER_PROGRAM, EVICT_LAST=evict_last, num_warps=_WARPS,
        **(pdl_args(table.device) if pdl else {"PDL": False}))
