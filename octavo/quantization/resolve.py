"""Which quantization scheme a model runs with: the checkpoint's declaration, the user's
``quantization=``, and the errors when they disagree."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from octavo.quantization.base import QuantizationConfig
from octavo.quantization.registry import get_quantization_config_class, known_methods

UNQUANTIZED = "unquantized"


@dataclass(frozen=True)
class CheckpointQuantization:
    method: str  # the checkpoint's quant_method
    config: dict[str, Any]
    source: str  # where it was declared, for error messages


def checkpoint_quantization(hf_config: Any, model_path: str | None
                            ) -> CheckpointQuantization | None:
    """The scheme a checkpoint declares: ``quantization_config`` in config.json, else
    AutoGPTQ's quantize_config.json next to it; None for a full-precision checkpoint."""
    cfg = getattr(hf_config, "quantization_config", None)
    source = "config.json quantization_config"
    if cfg is not None and not isinstance(cfg, dict):
        cfg = cfg.to_dict()
    if not cfg and model_path and os.path.isdir(model_path):
        path = os.path.join(model_path, "quantize_config.json")
        if os.path.isfile(path):
            with open(path) as f:
                cfg = json.load(f)
            # AutoGPTQ wrote this file before quant_method existed; it only ever meant GPTQ.
            cfg.setdefault("quant_method", "gptq")
            source = path
    if not cfg:
        return None
    method = cfg.get("quant_method")
    if method is None and (cfg.get("load_in_8bit") or cfg.get("load_in_4bit")):
        method = "bitsandbytes"  # transformers' BitsAndBytesConfig before quant_method
    if not isinstance(method, str):
        raise ValueError(f"{source} declares no quant_method: {cfg}")
    return CheckpointQuantization(str(method).lower(), dict(cfg), source)


def resolve_quantization(requested: str | None, hf_config: Any,
                         model_path: str | None) -> str | None:
    """The registered scheme name to run (None: full precision), validated against the
    checkpoint; ValueError for an unknown name or one the checkpoint does not match."""
    ckpt = checkpoint_quantization(hf_config, model_path)
    if requested is None:
        if ckpt is None:
            return None
        try:
            get_quantization_config_class(ckpt.method)
        except ValueError:
            raise ValueError(f"the checkpoint declares quant_method={ckpt.method!r} "
                             f"({ckpt.source}), which is not supported (known: "
                             f"{known_methods()})") from None
        return ckpt.method
    cls = get_quantization_config_class(requested)
    if ckpt is not None and not cls.reads_checkpoint(ckpt.method):
        raise ValueError(f"quantization={requested!r} does not match the checkpoint, which "
                         f"declares quant_method={ckpt.method!r} ({ckpt.source}); leave "
                         "quantization unset to use the checkpoint's")
    return requested


def build_quant_config(requested: str | None, hf_config: Any,
                       model_path: str | None) -> QuantizationConfig:
    """The QuantizationConfig for a model (the unquantized one when there is none)."""
    name = resolve_quantization(requested, hf_config, model_path) or UNQUANTIZED
    cls = get_quantization_config_class(name)
    ckpt = checkpoint_quantization(hf_config, model_path)
    return cls.from_config(ckpt.config if ckpt is not None else {})
