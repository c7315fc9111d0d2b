"""AWQ checkpoints in AutoAWQ's GEMM layout (``version: "gemm"``), 4-bit.

Per linear layer (``in`` input features, ``out`` output features):

- ``qweight`` int32 [in, out / 8]: packed along the output. AutoAWQ's ``WQLinear_GEMM`` packs
  the 8 output columns ``8c .. 8c+7`` of entry ``c`` in the order 0, 2, 4, 6, 1, 3, 5, 7:
  bits ``4i .. 4i+3`` hold column ``8c + AWQ_ORDER[i]`` (an interleave its CUDA kernel wants).
- ``qzeros`` int32 [groups, out / 8]: the same packing; zeros stored as they are.
- ``scales`` float16 [groups, out].
- ``W[o, i] = (q[i, o] - zero[i // group_size, o]) * scales[i // group_size, o]``.

Like vLLM, the checkpoint's qzeros are always read (``zero_point`` only says how the quantizer
chose them).
"""

from __future__ import annotations

import torch
from torch import nn

from octavo.quantization.base import QuantizationConfig, ignored_modules
from octavo.quantization.gptq import scales_dtype
from octavo.quantization.int_weight import IntWeightLinearMethod, check_divisible, unpack_int32
from octavo.quantization.param_layout import set_param_layout

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # value i of an int32 is output column AWQ_ORDER[i]
AWQ_PACK = 8


class AWQLinearMethod(IntWeightLinearMethod):
    def __init__(self, group_size: int) -> None:
        super().__init__(4, group_size)

    def checkpoint_params(self):
        return ("qweight", "qzeros", "scales")

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes,
                       params_dtype):
        self.params_dtype = params_dtype
        prefix = layer.prefix
        k, n = input_size_per_partition, sum(output_partition_sizes)
        for size in output_partition_sizes:
            check_divisible(prefix, "output features", size, AWQ_PACK,
                            "AWQ's 8 values per int32")
        if self.group_size == -1:
            groups, in_dim = 1, None
        else:
            check_divisible(prefix, "input features", k, self.group_size, "group_size")
            groups, in_dim = k // self.group_size, 0

        def param(shape, dtype, **layout):
            p = nn.Parameter(torch.zeros(shape, dtype=dtype), requires_grad=False)
            return set_param_layout(p, **layout)

        packed = dict(output_dim=1, packed_dim=1, pack_factor=AWQ_PACK)
        layer.register_parameter("qweight", param((k, n // AWQ_PACK), torch.int32,
                                                  input_dim=0, **packed))
        layer.register_parameter("qzeros", param((groups, n // AWQ_PACK), torch.int32,
                                                 input_dim=in_dim, **packed))
        layer.register_parameter("scales", param((groups, n), scales_dtype(params_dtype),
                                                 input_dim=in_dim, output_dim=1))

    def unpack(self, layer):
        q = unpack_int32(layer.qweight.data, 4, dim=1, order=AWQ_ORDER)
        zeros = unpack_int32(layer.qzeros.data, 4, dim=1, order=AWQ_ORDER)
        return q, zeros, layer.scales.data, None


class AWQConfig(QuantizationConfig):
    """``quantization_config``: quant_method "awq", version "gemm", bits (or w_bit) 4,
    group_size (or q_group_size), zero_point, modules_to_not_convert."""

    name = "awq"

    def __init__(self, group_size: int = 128, zero_point: bool = True, ignore=()) -> None:
        super().__init__(ignore)
        if not isinstance(group_size, int) or (group_size != -1 and group_size <= 0):
            raise ValueError(f"AWQ group_size={group_size!r} must be -1 or positive")
        self.group_size = group_size
        self.zero_point = zero_point

    @classmethod
    def from_config(cls, config):
        if not config:
            raise ValueError("quantization='awq' needs an AWQ checkpoint (group_size and "
                             "version in config.json's quantization_config); this checkpoint "
                             "declares none")
        bits = int(config.get("bits", config.get("w_bit", 4)))
        if bits != 4:
            raise ValueError(f"AWQ bits={bits} is not supported (AutoAWQ's GEMM layout is "
                             "4-bit)")
        version = str(config.get("version", "gemm")).lower()
        if version != "gemm":
            raise ValueError(f"AWQ version={version!r} is not supported (supported: 'gemm'; "
                             "'gemv' and 'gemv_fast' pack weights differently)")
        group_size = int(config.get("group_size", config.get("q_group_size", 128)))
        return cls(group_size, bool(config.get("zero_point", True)), ignored_modules(config))

    def get_linear_method(self, layer, prefix):
        return AWQLinearMethod(self.group_size)
