"""RMSNorm and fused residual-add + RMSNorm.

Numerics follow the Hugging Face Llama/Qwen modules: the residual sum is rounded to the input
dtype (that is what the next layer sees), the variance and normalisation are computed in fp32,
the normalised value is rounded to the input dtype and then multiplied by the weight.
"""

from __future__ import annotations

import torch

from octavo.kernels.pdl import begin as pdl_begin
from octavo.kernels.pdl import launch_args as pdl_args
from octavo.kernels.triton_utils import next_power_of_2, require_triton, tl, triton


@triton.jit
def _rms_norm_kernel(
    out_ptr,
    res_out_ptr,
    x_ptr,
    res_ptr,
    w_ptr,
    hidden,
    eps,
    stride_x,
    stride_r,
    stride_o,
    stride_ro,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    # One program per row; the whole row fits in registers (BLOCK >= hidden).
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < hidden
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)  # a weight: before the wait
    pdl_begin(PDL)
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_r + offs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * stride_ro + offs, x, mask=mask)
    xf = x.to(tl.float32)
    var = tl.sum(xf * xf, 0) / hidden
    rstd = 1.0 / tl.sqrt(var + eps)
    y = (xf * rstd).to(x_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * stride_o + offs, (y * w).to(out_ptr.dtype.element_ty), mask=mask)


def _as_rows(t: torch.Tensor) -> torch.Tensor:
    rows = t.reshape(-1, t.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def _launch(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float):
    hidden = x.shape[-1]
    assert weight.shape == (hidden,), (weight.shape, hidden)
    x2 = _as_rows(x)
    out = torch.empty_like(x2)
    res2 = res_out = x2  # placeholders when there is no residual
    if residual is not None:
        assert residual.shape == x.shape, (residual.shape, x.shape)
        res2 = _as_rows(residual)
        res_out = torch.empty_like(x2)
    rows = x2.shape[0]
    if rows > 0:
        block = next_power_of_2(hidden)
        num_warps = min(16, max(1, block // 512))
        _rms_norm_kernel[(rows,)](
            out, res_out, x2, res2, weight, hidden, float(eps),
            x2.stride(0), res2.stride(0), out.stride(0), res_out.stride(0),
            HAS_RESIDUAL=residual is not None, BLOCK=block, num_warps=num_warps,
            **pdl_args(x2.device),
        )  # fmt: skip
    return out.view(x.shape), res_out.view(x.shape)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last dim; returns ``x.dtype``."""
    require_triton("rms_norm")
    return _launch(x, None, weight, eps)[0]


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``(rms_norm(x + residual), x + residual)``; the inputs are not modified."""
    require_triton("fused_add_rms_norm")
    return _launch(x, residual, weight, eps)


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Pure-torch reference of :func:`rms_norm`."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y.to(x.dtype).float() * weight.float()).to(x.dtype)


def fused_add_rms_norm_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pure-torch reference of :func:`fused_add_rms_norm`."""
    new_residual = (x.float() + residual.float()).to(x.dtype)
    return rms_norm_ref(new_residual, weight, eps), new_residual
