"""oneDNN-packed weights for CPU linear layers.

At decode batch sizes (M ~ 32) torch's default CPU GEMM reaches 75-140 GFLOP/s on the
2-core CI machine; the same product on weights reordered once into oneDNN's blocked layout
reaches 170-215. Packing happens after loading; the plain weight stays for everything else.
Set OCTAVO_CPU_PACKED_GEMM=0 to turn it off.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from octavo import envs


def packing_enabled() -> bool:
    return (envs.cpu_packed_gemm()
            and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def pack_weight(weight: torch.Tensor, batch_hint: int = 32) -> torch.Tensor | None:
    """The weight [out, in] in oneDNN's layout, or None where packing does not apply."""
    if weight.device.type != "cpu" or weight.dtype not in (torch.float32, torch.bfloat16):
        return None
    if not packing_enabled():
        return None
    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), batch_hint)
    except RuntimeError:
        return None


def usable(x: torch.Tensor, packed: torch.Tensor | None) -> bool:
    """Whether ``packed`` can multiply ``x`` (a CPU tensor of the packed dtype)."""
    return packed is not None and x.device.type == "cpu" and x.dtype == packed.dtype


def packed_linear(x: torch.Tensor, packed: torch.Tensor,
                  bias: torch.Tensor | None) -> torch.Tensor:
    shape = x.shape
    y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, shape[-1]), packed, bias, "none",
                                           [], "")
    return y.view(*shape[:-1], y.shape[-1])


def linear(x: torch.Tensor, weight: torch.Tensor, packed: torch.Tensor | None,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """x W^T + b, on the packed weight when there is one for this device and dtype."""
    if usable(x, packed):
        return packed_linear(x, packed, bias)
    if x.is_cuda:
        from octavo.kernels.float_linear import linear as cuda_linear

        return cuda_linear(x, weight, bias)
    return F.linear(x, weight, bias)
