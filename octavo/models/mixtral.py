"""Mixtral: the Llama decoder with a mixture of experts (``block_sparse_moe``: top-k of the
router's softmax, renormalised; experts ``w1`` gate, ``w3`` up, ``w2`` down) as every MLP."""

from __future__ import annotations

import re

from torch import nn

from octavo.layers.fused_moe import FusedMoE
from octavo.models.llama import LlamaForCausalLM
from octavo.models.moe import MoEModel
from octavo.quantization.base import QuantizationConfig

# Mixtral's expert projections under Qwen-MoE's names (those of our layers and mappings).
_EXPERT_PROJ = re.compile(r"\.experts\.(\d+)\.(w[123])\.")
_QWEN_NAMES = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


class MixtralForCausalLM(MoEModel, LlamaForCausalLM):
    @staticmethod
    def make_mlp(config, layer_idx: int, quant_config: QuantizationConfig | None,
                 prefix: str) -> nn.Module:
        # The layer answers to the checkpoints' name (``block_sparse_moe``) where quantization
        # configs match modules: llm-compressor's ignore list names
        # "model.layers.0.block_sparse_moe.gate"; its parameters live under ``mlp``.
        moe_prefix = prefix.removesuffix(".mlp") + ".block_sparse_moe"
        return FusedMoE(config.num_local_experts, config.num_experts_per_tok,
                        config.hidden_size, config.intermediate_size, True, quant_config,
                        prefix=moe_prefix)

    def map_checkpoint_name(self, name: str):
        """``block_sparse_moe`` is the ``mlp`` here and ``experts.3.w1`` is
        ``experts.3.gate_proj``; then as Qwen-MoE's (a rename otherwise). Checkpoints name
        quantized experts ``block_sparse_moe.experts.3.w1`` (the original layout, AutoAWQ),
        ``mlp.experts.3.gate_proj`` (GPTQModel 7.7 over transformers 5) or
        ``block_sparse_moe.experts.3.gate_proj`` (llm-compressor 0.14): all land here."""
        renamed = name.replace(".block_sparse_moe.", ".mlp.")
        renamed = _EXPERT_PROJ.sub(
            lambda m: f".experts.{m.group(1)}.{_QWEN_NAMES[m.group(2)]}.", renamed)
        mapped = super().map_checkpoint_name(renamed)
        if mapped is not None:
            return mapped
        return None if renamed == name else (renamed, None)
