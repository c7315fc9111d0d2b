"""The sum of a K-split GEMM's float32 partials as a launch of its own, over every SM.

``split_k``'s kernels sum their partials in the CTA that finishes a tile last: no second
launch, which is what decode-sized GEMMs need (a launch costs about what they do). Past 128
rows the tiles are large and few: one SM then reads the tile's whole [splits, 128, 256] float32
partials alone (512 KB at four splits) while the others idle. Here the sum is spread over the
whole grid in 16-byte loads instead; the order is the same (split 0 first, from zero), so the
output is the same bits as the in-kernel sum.
"""

from __future__ import annotations

import torch

from octavo.kernels.triton_utils import tl, triton

BLOCK = 1024


@triton.jit
def _sum_splits_kernel(part_ptr, out_ptr, total, SPLITS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < total
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    # Unrolled (SPLITS is a constant): every split's loads in flight at once, then the adds in
    # split order, as the in-kernel sum. (A loop over a runtime count waited a load's latency
    # per split: 8-10 us for two to four splits of Llama-8B's qkv / o / down at 128-256 rows,
    # H100, session 57.)
    for z in tl.static_range(SPLITS):
        acc += tl.load(part_ptr + z * total + offs, mask=mask, other=0.0, cache_modifier=".cg")
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def sum_splits(partial: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out`` [M, N] (contiguous) = the float32 ``partial`` [splits, M, N] summed over its
    first dim in order (0 + p0 + p1 + ...), rounded once to ``out``'s dtype."""
    splits, m, n = partial.shape
    assert partial.dtype == torch.float32 and partial.is_contiguous(), (partial.dtype,)
    assert out.shape == (m, n) and out.is_contiguous(), (out.shape, m, n)
    total = m * n
    assert splits * total < 2 ** 31, (splits, m, n)  # the kernel's int32 offsets
    if total:
        _sum_splits_kernel[(triton.cdiv(total, BLOCK),)](partial, out, total, SPLITS=splits,
                                                          BLOCK=BLOCK)
    return out
