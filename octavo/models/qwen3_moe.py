"""Qwen3-MoE: Qwen3's attention (per-head q/k RMSNorm) with a mixture of experts in place of
the MLP on every ``decoder_sparse_step``-th layer that ``mlp_only_layers`` does not list."""

from __future__ import annotations

from torch import nn

from octavo.layers.fused_moe import FusedMoE
from octavo.models.llama import dense_mlp
from octavo.models.moe import MoEModel, is_sparse_layer
from octavo.models.qwen3 import Qwen3ForCausalLM
from octavo.quantization.base import QuantizationConfig


class Qwen3MoeForCausalLM(MoEModel, Qwen3ForCausalLM):
    @staticmethod
    def make_mlp(config, layer_idx: int, quant_config: QuantizationConfig | None,
                 prefix: str) -> nn.Module:
        if not is_sparse_layer(config, layer_idx):
            return dense_mlp(config, layer_idx, quant_config, prefix)
        return FusedMoE(config.num_experts, config.num_experts_per_tok, config.hidden_size,
                        config.moe_intermediate_size, bool(config.norm_topk_prob),
                        quant_config, prefix=prefix)
