"""Test-only quantization methods that prove the structure without a real format.

``FakeInt8``: per-output-channel absmax int8, weight-only: an int8 ``qweight`` [out, in] and a
float ``scales`` [out]. ``PackedLayout``: parameters shaped like AWQ's and GPTQ's packed int32
weights, for the loader's narrowing (no apply).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from octavo.quantization import LinearMethod, QuantizationConfig, set_param_layout


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 [out, in], float scales [out]) with w ~= q * scales[:, None]."""
    scales = w.abs().amax(dim=1).clamp(min=1e-8) / 127
    q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scales


def dequantize_int8(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return q.to(scales.dtype) * scales[:, None]


class FakeInt8Method(LinearMethod):
    def create_weights(self, layer, input_size_per_partition, output_partition_sizes,
                       params_dtype):
        out = sum(output_partition_sizes)
        qweight = nn.Parameter(torch.empty(out, input_size_per_partition, dtype=torch.int8),
                               requires_grad=False)
        scales = nn.Parameter(torch.empty(out, dtype=params_dtype), requires_grad=False)
        layer.register_parameter("qweight", set_param_layout(qweight, input_dim=1, output_dim=0))
        layer.register_parameter("scales", set_param_layout(scales, output_dim=0))

    def apply(self, layer, x, bias):
        return F.linear(x, dequantize_int8(layer.qweight, layer.scales).to(x.dtype), bias)


class FakeInt8Config(QuantizationConfig):
    name = "fake_int8"

    def get_linear_method(self, layer, prefix):
        return FakeInt8Method()


class PackedLayoutMethod(LinearMethod):
    """AWQ-like qweight [in, out/8] packed along output, or GPTQ-like [in/8, out] packed along
    input, with group scales [in/group, out]."""

    def __init__(self, packed_along: str, group: int = 8) -> None:
        self.packed_along = packed_along
        self.group = group

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes,
                       params_dtype):
        n_in, n_out = input_size_per_partition, sum(output_partition_sizes)
        if self.packed_along == "output":
            shape, packed_dim = (n_in, n_out // 8), 1
        else:
            shape, packed_dim = (n_in // 8, n_out), 0
        qweight = nn.Parameter(torch.zeros(shape, dtype=torch.int32), requires_grad=False)
        scales = nn.Parameter(torch.zeros(n_in // self.group, n_out), requires_grad=False)
        layer.register_parameter("qweight", set_param_layout(
            qweight, input_dim=0, output_dim=1, packed_dim=packed_dim, pack_factor=8))
        layer.register_parameter("scales", set_param_layout(scales, input_dim=0, output_dim=1))


class PackedLayoutConfig(QuantizationConfig):
    name = "fake_packed"

    def __init__(self, packed_along: str = "output") -> None:
        super().__init__()
        self.packed_along = packed_along

    def get_linear_method(self, layer, prefix):
        return PackedLayoutMethod(self.packed_along)
