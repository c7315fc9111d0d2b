"""Quantization strategies for linear layers, and their registry."""

from __future__ import annotations

import torch
from torch import nn

from octavo.layers import cpu_gemm


class LinearMethod:
    """How a linear layer stores and applies its weight."""

    def create_weights(self, layer: nn.Module, input_size: int, output_size: int,
                       params_dtype: torch.dtype) -> None:
        raise NotImplementedError

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        pass


class UnquantizedLinearMethod(LinearMethod):
    def create_weights(self, layer, input_size, output_size, params_dtype):
        weight = nn.Parameter(torch.empty(output_size, input_size, dtype=params_dtype),
                              requires_grad=False)
        weight.weight_loader = layer.weight_loader
        layer.register_parameter("weight", weight)

    def apply(self, layer, x, bias):
        return cpu_gemm.linear(x, layer.weight, getattr(layer, "_packed_weight", None), bias)

    def process_weights_after_loading(self, layer):
        layer._packed_weight = cpu_gemm.pack_weight(layer.weight)


_REGISTRY: dict[str | None, type[LinearMethod]] = {None: UnquantizedLinearMethod}


def register_quantization(name: str):
    def deco(cls: type[LinearMethod]) -> type[LinearMethod]:
        _REGISTRY[name] = cls
        return cls
    return deco


def get_linear_method(name: str | None) -> LinearMethod:
    if name not in _REGISTRY:
        known = sorted(k for k in _REGISTRY if k)
        raise ValueError(f"quantization={name!r} is not supported (known: {known or 'none yet'})")
    return _REGISTRY[name]()
