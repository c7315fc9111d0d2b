"""Activation functions on merged projections."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from octavo.kernels import cpu as cpu_kernels


class SiluAndMul(nn.Module):
    """x = [gate | up] along the last dim -> silu(gate) * up."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            from octavo.kernels.triton_utils import HAS_TRITON

            if HAS_TRITON:
                from octavo.kernels.activation import silu_and_mul

                return silu_and_mul(x)
        ops = cpu_kernels.ops_for(x)
        if ops is not None and x.is_contiguous():
            return ops.silu_and_mul(x)
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]
