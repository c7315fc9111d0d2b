"""compressed-tensors integer weights (W4A16, W8A16) of one linear layer.

Per layer (``in`` input features, ``out`` output features, ``pack = 32 // bits``), each value
``v`` of a ``bits``-bit signed integer stored as the unsigned ``v + 2**(bits - 1)``:

- ``pack-quantized``: ``weight_packed`` int32 [out, in / pack], packed along the input: input
  ``i`` of output row ``o`` sits in ``weight_packed[o, i // pack]`` at bits
  ``(i % pack) * bits``. ``naive-quantized``: ``weight`` int8 [out, in] holding ``v`` itself.
- ``weight_scale`` float [out, groups] (``groups`` = in / group_size; 1 for "channel").
- ``weight_zero_point`` (asymmetric only; symmetric means zero 0): pack-quantized packs it along
  the *output* the same way, int32 [out / pack, groups]; naive keeps int8 [out, groups].
- ``weight_shape`` int64 [2] (pack-quantized only): the float weight's [out, in].
- ``weight_g_idx`` int32 [in] when ``actorder`` is "group": the group of each input.
- ``W[o, i] = (v[o, i] - zero[o, g]) * scale[o, g]``, ``g = i // group_size`` (or g_idx[i]).

Both stored forms are shifted by the same offset, so the unsigned values and unsigned zeros
(symmetric: the offset) feed ``int_weight`` as they are.
"""

from __future__ import annotations

import torch
from torch import nn

from octavo.quantization.compressed_tensors_scheme import IntWeightScheme
from octavo.quantization.gptq import _shared_g_idx_loader
from octavo.quantization.int_weight import IntWeightLinearMethod, check_divisible, unpack_int32
from octavo.quantization.param_layout import set_param_layout


def _weight_shape_loader(layer: nn.Module):
    """weight_shape holds [out, in] of each checkpoint module: check the input side (a layer
    whose packed words were padded would otherwise load silently wrong)."""
    def load(param, loaded, shard_id=None):
        if loaded.numel() != 2 or int(loaded[-1]) != layer.input_size:
            raise ValueError(f"layer {layer.prefix!r}: weight_shape {loaded.tolist()} does not "
                             f"have the layer's {layer.input_size} input features")
        param.data.copy_(loaded.reshape(2))
    return load


class CompressedTensorsIntMethod(IntWeightLinearMethod):
    def __init__(self, scheme: IntWeightScheme) -> None:
        super().__init__(scheme.bits, scheme.group_size)
        self.scheme = scheme

    def checkpoint_params(self):
        names = ["weight_packed", "weight_shape"] if self.scheme.packed else ["weight"]
        names.append("weight_scale")
        if not self.scheme.symmetric:
            names.append("weight_zero_point")
        if self.scheme.g_idx:
            names.append("weight_g_idx")
        return tuple(names)

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes,
                       params_dtype):
        self.params_dtype = params_dtype
        s, prefix = self.scheme, layer.prefix
        k, n = input_size_per_partition, sum(output_partition_sizes)
        pack = 32 // s.bits
        if s.group_size == -1:
            groups, group_in_dim = 1, None
        elif s.g_idx and k != layer.input_size:
            # Act order scatters a row-parallel shard's inputs over all groups: every rank
            # keeps every group's scales and zero points, and weight_g_idx says which.
            check_divisible(prefix, "input features", layer.input_size, s.group_size,
                            "group_size")
            groups, group_in_dim = layer.input_size // s.group_size, None
        else:
            check_divisible(prefix, "input features", k, s.group_size, "group_size")
            groups, group_in_dim = k // s.group_size, 1

        def param(name, shape, dtype, **layout):
            p = nn.Parameter(torch.zeros(shape, dtype=dtype), requires_grad=False)
            layer.register_parameter(name, set_param_layout(p, **layout))
            return p

        if s.packed:
            check_divisible(prefix, "input features", k, pack, f"the {s.bits}-bit pack factor")
            param("weight_packed", (n, k // pack), torch.int32, input_dim=1, output_dim=0,
                  packed_dim=1, pack_factor=pack)
        else:
            param("weight", (n, k), torch.int8, input_dim=1, output_dim=0)
        param("weight_scale", (n, groups), params_dtype, input_dim=group_in_dim, output_dim=0)
        if not s.symmetric:
            if s.packed:
                for size in output_partition_sizes:
                    check_divisible(prefix, "output features", size, pack,
                                    f"the {s.bits}-bit pack factor of weight_zero_point")
                param("weight_zero_point", (n // pack, groups), torch.int32,
                      input_dim=group_in_dim, output_dim=0, packed_dim=0, pack_factor=pack)
            else:
                param("weight_zero_point", (n, groups), torch.int8, input_dim=group_in_dim,
                      output_dim=0)
        if s.packed:  # naive-quantized stores no shape: nothing is padded
            shape = param("weight_shape", (2,), torch.int64)
            shape.weight_loader = _weight_shape_loader(layer)
        if s.g_idx:
            g_idx = param("weight_g_idx", (k,), torch.int32, input_dim=0)
            g_idx.weight_loader = _shared_g_idx_loader(layer)

    def unpack(self, layer):
        s = self.scheme
        offset = 1 << (s.bits - 1)
        if s.packed:
            q = unpack_int32(layer.weight_packed.data, s.bits, dim=1)
        else:
            q = layer.weight.data.to(torch.int32) + offset
        scales = layer.weight_scale.data.t()
        if s.symmetric:
            zeros = torch.full(scales.shape, offset, dtype=torch.int32, device=q.device)
        elif s.packed:
            zeros = unpack_int32(layer.weight_zero_point.data, s.bits, dim=0).t()
        else:
            zeros = layer.weight_zero_point.data.to(torch.int32).t() + offset
        g_idx = layer.weight_g_idx.data if s.g_idx else None
        return q.t(), zeros, scales, g_idx
