"""Qwen3-MoE: Qwen3's attention (per-head q/k RMSNorm) with a mixture of experts in place of
the MLP on every ``decoder_sparse_step``-th layer that ``mlp_only_layers`` does not list."""

from __future__ import annotations

from torch import nn

from octavo import envs
from octavo.layers.fused_moe import FusedMoE, map_expert_name
from octavo.models.llama import dense_mlp
from octavo.models.qwen3 import Qwen3ForCausalLM
from octavo.quantization.base import QuantizationConfig


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    @property
    def cuda_graph_safe(self) -> bool:
        """Only with the fused kernel: the expert loop reads counts on the host."""
        return envs.fused_moe()

    @staticmethod
    def make_mlp(config, layer_idx: int, quant_config: QuantizationConfig | None,
                 prefix: str) -> nn.Module:
        step = getattr(config, "decoder_sparse_step", 1) or 1
        experts = getattr(config, "num_experts", 0) or 0
        dense = layer_idx in (getattr(config, "mlp_only_layers", None) or [])
        if experts == 0 or dense or (layer_idx + 1) % step != 0:
            return dense_mlp(config, layer_idx, quant_config, prefix)
        return FusedMoE(experts, config.num_experts_per_tok, config.hidden_size,
                        config.moe_intermediate_size, bool(config.norm_topk_prob),
                        quant_config, prefix=prefix)

    @staticmethod
    def map_checkpoint_name(name: str):
        return map_expert_name(name)
