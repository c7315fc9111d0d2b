"""The residual add + RMSNorm after a projection, run by the projection's last program.

A decoder layer's o_proj is followed by ``fused_add_rms_norm(o, residual)``: one more launch
per layer, whose fixed cost dominates at batch 1. A GEMV launch can do it itself: every
program takes a ticket after its output tile is stored (after its split-K reduction, where K
is split), and the program that takes the last one sees the whole output row and norms it,
then resets the counter (the ticket pattern of octavo/kernels/split_k.py). The arithmetic is
``rms_norm.normed_row``, the RMSNorm kernel's own, so at that kernel's BLOCK and warps
(``rms_norm.norm_warps``) the bits are its bits.
"""

from __future__ import annotations

from octavo.kernels.rms_norm import normed_row
from octavo.kernels.triton_utils import tl, triton


@triton.jit
def add_rms_norm_last(out_ptr, stride_om, res_ptr, res_out_ptr, nx_ptr, nw_ptr, N, eps,
                      cnt_ptr, BLOCK_M: tl.constexpr, BLOCK: tl.constexpr):
    """After this program's share of ``out`` [BLOCK_M, N] is stored: if it is the launch's
    last program, ``res_out = out + res`` (rounded to out's dtype) and ``nx =
    rms_norm(res_out) * nw`` for each of the BLOCK_M rows (``res``, ``res_out``, ``nx``
    contiguous [BLOCK_M, N]); ``cnt_ptr``: a zeroed counter no other program of the launch
    uses."""
    tl.debug_barrier()  # every thread's output is stored before the ticket is taken
    ticket = tl.atomic_add(cnt_ptr, 1, sem="acq_rel")
    if ticket == tl.num_programs(0) * tl.num_programs(1) - 1:
        dtype = out_ptr.dtype.element_ty
        offs = tl.arange(0, BLOCK)
        mask = offs < N
        w = tl.load(nw_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        for m in tl.static_range(BLOCK_M):
            # .cg: the other programs' outputs are in L2 (an L1 line could be stale).
            x = tl.load(out_ptr + m * stride_om + offs, mask=mask, other=0.0,
                        cache_modifier=".cg")
            r = tl.load(res_ptr + m * N + offs, mask=mask, other=0.0)
            s = (x.to(tl.float32) + r.to(tl.float32)).to(dtype)
            tl.store(res_out_ptr + m * N + offs, s, mask=mask)
            y = normed_row(s.to(tl.float32), w, N, eps, dtype)
            tl.store(nx_ptr + m * N + offs, y.to(nx_ptr.dtype.element_ty), mask=mask)
        tl.atomic_xchg(cnt_ptr, 0)
