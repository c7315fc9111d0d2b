"""RMSNorm, with an optional fused residual add."""

from __future__ import annotations

import torch
from torch import nn

from octavo.kernels import cpu as cpu_kernels


def _fused_ok() -> bool:
    """Fused Triton kernels on CUDA: a torch RMSNorm is eight small kernels, and at decode
    batch sizes their fixed cost dominates the step."""
    from octavo.kernels.triton_utils import HAS_TRITON

    return HAS_TRITON


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.eps = eps

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Without ``residual``: norm(x). With it: (norm(x + residual), x + residual); on the
        CPU the C++ kernel computes these in place, into ``x`` and ``residual``."""
        if x.is_cuda and _fused_ok():
            from octavo.kernels.rms_norm import fused_add_rms_norm, rms_norm

            if residual is None:
                return rms_norm(x, self.weight, self.eps)
            return fused_add_rms_norm(x, residual, self.weight, self.eps)
        ops = cpu_kernels.ops_for(x)
        if ops is not None and self.weight.dtype == x.dtype:
            if residual is None:
                if x.stride(-1) == 1:
                    return ops.rms_norm(x, self.weight, self.eps)
            elif (residual.dtype == x.dtype and x.is_contiguous()
                  and residual.is_contiguous()):
                ops.fused_add_rms_norm(x, residual, self.weight, self.eps)
                return x, residual
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x
