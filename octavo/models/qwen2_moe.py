"""Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen2's attention (q/k/v biases) with a mixture of
experts plus a shared expert, gated per token by sigmoid(shared_expert_gate(x)), on every
``decoder_sparse_step``-th layer that ``mlp_only_layers`` does not list."""

from __future__ import annotations

from torch import nn

from octavo.layers.fused_moe import FusedMoE
from octavo.models.llama import LlamaMLP, dense_mlp
from octavo.models.moe import MoEModel, is_sparse_layer
from octavo.models.qwen2 import Qwen2ForCausalLM
from octavo.quantization.base import QuantizationConfig


class Qwen2MoeForCausalLM(MoEModel, Qwen2ForCausalLM):
    @staticmethod
    def make_mlp(config, layer_idx: int, quant_config: QuantizationConfig | None,
                 prefix: str) -> nn.Module:
        if not is_sparse_layer(config, layer_idx):
            return dense_mlp(config, layer_idx, quant_config, prefix)
        moe = FusedMoE(config.num_experts, config.num_experts_per_tok, config.hidden_size,
                       config.moe_intermediate_size, bool(config.norm_topk_prob),
                       quant_config, prefix=prefix)
        shared = getattr(config, "shared_expert_intermediate_size", 0) or 0
        if shared:
            moe.add_shared_expert(LlamaMLP(config.hidden_size, shared, quant_config,
                                           prefix=f"{prefix}.shared_expert"),
                                  config.hidden_size)
        return moe
