"""Build a model for a ModelConfig on a device and load its weights."""

from __future__ import annotations

import torch
from torch import nn

from octavo.config import ModelConfig
from octavo.model_loader.weights import (
    checkpoint_names,
    fill_dummy_weights,
    iter_safetensors,
    load_weights,
)
from octavo.models.registry import get_model_class
from octavo.quantization.resolve import build_quant_config

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def load_model(model_config: ModelConfig, device: torch.device, backend,
               quantization: str | None = None) -> nn.Module:
    """``quantization``: the scheme asked for (None: whatever the checkpoint declares)."""
    dtype = TORCH_DTYPES[model_config.dtype]
    cls = get_model_class(model_config.architecture)
    quant_config = build_quant_config(quantization, model_config.hf_config,
                                      None if model_config.is_gguf else model_config.model)
    quant_config.packed_modules_mapping = getattr(cls, "packed_modules_mapping", {})
    quant_config.bind_checkpoint_names(
        None if model_config.is_gguf or model_config.load_format == "dummy"
        else checkpoint_names(model_config.model))
    gguf_quantized = model_config.is_gguf and quant_config.name == "gguf"
    if gguf_quantized:  # each GGUF tensor has its own block type, read from the file
        from octavo.model_loader.gguf_file import open_gguf

        quant_config.bind(open_gguf(model_config.model).tensor_types())
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = cls(model_config.hf_config, backend, quant_config=quant_config)
    finally:
        torch.set_default_dtype(old)
    if gguf_quantized:
        quant_config.keep_embeddings_quantized(model)
    # Rotary caches are built in float32 above; keep them so.
    if model_config.load_format == "dummy":
        fill_dummy_weights(model, seed=model_config.seed)
    elif model_config.is_gguf:
        from octavo.model_loader.gguf_file import open_gguf

        raw = quant_config.kept if gguf_quantized else ()
        load_weights(model, open_gguf(model_config.model).iter_weights(dtype, raw=raw))
    else:
        load_weights(model, quant_config.checkpoint_tensors(iter_safetensors(model_config.model)))
    for module in model.modules():
        after_loading = getattr(module, "process_weights_after_loading", None)
        if after_loading is not None:
            after_loading()
    # Modules that combine their children's processed weights (a mixture-of-experts layer
    # stacking its quantized experts), once every module above has run.
    for module in model.modules():
        finish = getattr(module, "finish_loading", None)
        if finish is not None:
            finish()
    return model.eval()
