"""Weights pulled into the GPU's L2 cache while the previous kernel runs.

At batch 1 a decode step is a chain of short kernels launched with PDL; the projections
after a layer's attention (o_proj, the MLP, the next layer's qkv_proj) read weights that no
kernel of the step writes, so they can be asked for early. One launch placed right after
attention issues Hopper's bulk L2 prefetch (``cp.async.bulk.prefetch.L2``: one instruction per
chunk, no registers or shared memory receive the data) over those weights, then waits for
attention like any PDL kernel, so the step's ordering is unchanged; the GEMVs after it then
find part of their weights in L2 (50 MB on an H200).

The launch itself is not free: its programs end only when their prefetches have landed, and
the next kernel waits for it (31.5 MB took ~29 us per layer at W4's batch 32, where the step
got slower). So the engine uses it for one-token steps only (octavo/layers/weight_prefetch.py).
The chunk table (address, bytes) is built once per list of tensors and reused by every step,
captured CUDA graphs included.
"""

from __future__ import annotations

import torch

from octavo.kernels.pdl import begin as pdl_begin
from octavo.kernels.pdl import enabled as pdl_enabled
from octavo.kernels.pdl import launch_args as pdl_args
from octavo.kernels.triton_utils import tl, triton

CHUNK_BYTES = 64 * 1024  # one prefetch instruction's range
_WARPS = 1
_PER_PROGRAM = 32 * _WARPS  # one chunk per thread


@triton.jit
def bulk_prefetch(addr, size):
    # Each thread issues the prefetch of its own chunk; a chunk of 0 bytes (the table's
    # padding) is skipped by the predicate.
    tl.inline_asm_elementwise(
        """{
        .reg .pred p;
        setp.ne.u32 p, $2, 0;
        @p cp.async.bulk.prefetch.L2.global [$1], $2;
        mov.u32 $0, 0;
        }""", "=r,l,r", [addr, size], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _l2_prefetch_kernel(table_ptr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    # table [n, 2] int64 (address, bytes), n a multiple of BLOCK; one chunk per thread.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    addr = tl.load(table_ptr + offs * 2)
    size = tl.load(table_ptr + offs * 2 + 1).to(tl.int32)
    bulk_prefetch(addr, size)
    # Nothing is read that the step writes and nothing is written: the wait only keeps the
    # chain's order (the next kernel's wait covers the one before this launch).
    pdl_begin(PDL)


def supported(device: torch.device) -> bool:
    """Bulk L2 prefetch needs sm_90+; placing it under a running kernel needs PDL."""
    return device.type == "cuda" and pdl_enabled(device)


def chunk_table(tensors: list[torch.Tensor], budget_bytes: int,
                chunk_bytes: int = CHUNK_BYTES) -> torch.Tensor:
    """[n, 2] int64 (address, bytes) chunks covering ``tensors`` in order, at most
    ``budget_bytes`` in all (the last tensor cut short), of at most ``chunk_bytes`` (a
    multiple of 16) each, padded with empty chunks to a multiple of the launch's programs.
    Ranges are widened to 16-byte alignment (the bulk prefetch's unit), which stays within
    the tensors' pages."""
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


def l2_prefetch(table: torch.Tensor) -> None:
    """Launch the prefetch of ``table``'s chunks (from :func:`chunk_table`) in the PDL
    chain."""
    n = table.shape[0]
    if n == 0:
        return
    assert n % _PER_PROGRAM == 0 and table.is_contiguous(), table.shape
    _l2_prefetch_kernel[(n // _PER_PROGRAM,)](
        table, BLOCK=_PER_PROGRAM, num_warps=_WARPS, **pdl_args(table.device))
