"""Gated activations for MLPs whose gate and up projections are fused into one matmul."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from octavo.kernels.pdl import begin as pdl_begin
from octavo.kernels.pdl import launch_args as pdl_args
from octavo.kernels.triton_utils import require_triton, tl, triton

_BLOCK = 1024


@triton.jit
def silu_mul(gate, up):
    """``silu(gate) * up`` in float32 (both float32): the one formula every kernel that
    applies the gated activation uses, so a fused consumer gives the same bits as this
    module's kernel."""
    return gate / (1.0 + tl.exp(-gate)) * up


@triton.jit
def _silu_and_mul_kernel(
    out_ptr,
    x_ptr,
    inter,
    stride_x,
    stride_o,
    BLOCK: tl.constexpr,
    GATE_BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    # Grid: (rows, column blocks); computes in fp32, rounds once on store. GATE_BLOCK: output
    # column j's gate sits at (j // GATE_BLOCK) 2 GATE_BLOCK + j % GATE_BLOCK, its up
    # GATE_BLOCK further; 0: the [gate | up] halves.
    pdl_begin(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < inter
    if GATE_BLOCK:
        at = (offs // GATE_BLOCK) * (2 * GATE_BLOCK) + offs % GATE_BLOCK
        up_at = at + GATE_BLOCK
    else:
        at = offs
        up_at = inter + offs
    gate = tl.load(x_ptr + row * stride_x + at, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + up_at, mask=mask, other=0.0).to(tl.float32)
    y = silu_mul(gate, up)
    tl.store(out_ptr + row * stride_o + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor, block: int | None = None) -> torch.Tensor:
    """``x`` ``[..., 2*I]`` -> ``silu(x[..., :I]) * x[..., I:]`` of shape ``[..., I]``.
    ``block``: x's columns are gate and up in turn, ``block`` of each
    (``w4a16_swapab.glu_blocked``); None: the two halves."""
    require_triton("silu_and_mul")
    assert x.shape[-1] % 2 == 0, x.shape
    inter = x.shape[-1] // 2
    assert not block or inter % block == 0, (inter, block)
    rows = x.reshape(-1, x.shape[-1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty((rows.shape[0], inter), dtype=x.dtype, device=x.device)
    if rows.shape[0] > 0 and inter > 0:
        grid = (rows.shape[0], triton.cdiv(inter, _BLOCK))
        _silu_and_mul_kernel[grid](
            out, rows, inter, rows.stride(0), out.stride(0), BLOCK=_BLOCK,
            GATE_BLOCK=0 if block in (None, inter) else block, num_warps=4,
            **pdl_args(x.device),
        )
    return out.view(*x.shape[:-1], inter)


def silu_and_mul_ref(x: torch.Tensor, block: int | None = None) -> torch.Tensor:
    """Pure-torch reference of :func:`silu_and_mul` (fp32 math, one rounding)."""
    inter = x.shape[-1] // 2
    xf = x.float()
    if block:  # gate and up in turn: back to the two halves
        xf = xf.unflatten(-1, (inter // block, 2, block)).transpose(-3, -2).flatten(-3)
    return (F.silu(xf[..., :inter]) * xf[..., inter:]).to(x.dtype)
