"""Quantization scheme names -> QuantizationConfig classes.

A scheme is one file with one config class; built-in ones are listed here as import paths
(imported only when asked for), others register themselves with
``register_quantization_config``.
"""

from __future__ import annotations

from octavo.lazy_registry import LazyRegistry
from octavo.quantization.base import QuantizationConfig

_BUILTIN = {
    "unquantized": "octavo.quantization.unquantized:UnquantizedConfig",
    "gguf": "octavo.quantization.gguf:GGUFConfig",
    "gptq": "octavo.quantization.gptq:GPTQConfig",
    "awq": "octavo.quantization.awq:AWQConfig",
    "bitsandbytes": "octavo.quantization.bitsandbytes:BitsAndBytesConfig",
    "bitsandbytes-nf4": "octavo.quantization.bitsandbytes:BitsAndBytesNF4Config",
    "bitsandbytes-fp4": "octavo.quantization.bitsandbytes:BitsAndBytesFP4Config",
    "fp8": "octavo.quantization.fp8:Fp8Config",
    "fp8-per-channel": "octavo.quantization.fp8:Fp8PerChannelConfig",
    "compressed-tensors": "octavo.quantization.compressed_tensors:CompressedTensorsConfig",
}
_REGISTRY = LazyRegistry("quantization", _BUILTIN)
_CLASSES: dict[str, type[QuantizationConfig]] = _REGISTRY.classes


def register_quantization_config(name: str):
    """Class decorator: make ``quantization=name`` (and checkpoints declaring it) use ``cls``."""
    def deco(cls: type[QuantizationConfig]) -> type[QuantizationConfig]:
        cls.name = name
        return _REGISTRY.register(name, cls)
    return deco


def known_methods() -> list[str]:
    return _REGISTRY.names()


def get_quantization_config_class(name: str) -> type[QuantizationConfig]:
    """The config class registered as ``name``; ValueError naming the known ones otherwise."""
    return _REGISTRY.get(name)
