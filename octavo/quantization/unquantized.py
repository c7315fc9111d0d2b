"""Full precision: the default method, and the one every scheme leaves its skipped layers to."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from octavo.quantization.base import LinearMethod, QuantizationConfig
from octavo.quantization.param_layout import set_param_layout


class UnquantizedLinearMethod(LinearMethod):
    """A float weight [out, in] in the model's dtype."""

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes,
                       params_dtype):
        weight = nn.Parameter(torch.empty(sum(output_partition_sizes), input_size_per_partition,
                                          dtype=params_dtype), requires_grad=False)
        layer.register_parameter("weight", set_param_layout(weight, input_dim=1, output_dim=0))

    def apply(self, layer, x, bias):
        if x.is_cuda:
            from octavo.kernels.float_linear import linear

            return linear(x, layer.weight, bias)
        return F.linear(x, layer.weight, bias)

    def apply_glu(self, layer, x, bias):
        if not x.is_cuda:
            return None
        from octavo.kernels.float_linear import linear_glu

        return linear_glu(x, layer.weight, bias)

    def dense_weight(self, layer):
        return layer.weight


class UnquantizedConfig(QuantizationConfig):
    name = "unquantized"

    def get_linear_method(self, layer, prefix):
        return UnquantizedLinearMethod()
