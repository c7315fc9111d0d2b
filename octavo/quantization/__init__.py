"""Quantization schemes for linear layers: a config per scheme, a method per layer."""

from __future__ import annotations

from octavo.quantization.base import LinearMethod, QuantizationConfig
from octavo.quantization.param_layout import ParamLayout, param_layout, set_param_layout
from octavo.quantization.registry import (
    get_quantization_config_class,
    known_methods,
    register_quantization_config,
)
from octavo.quantization.resolve import build_quant_config, resolve_quantization

__all__ = [
    "LinearMethod", "ParamLayout", "QuantizationConfig", "build_quant_config",
    "get_quantization_config_class", "known_methods", "param_layout",
    "register_quantization_config", "resolve_quantization", "set_param_layout",
]
