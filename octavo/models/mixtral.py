"""Mixtral: the Llama decoder with a mixture of experts (``block_sparse_moe``: top-k of the
router's softmax, renormalised; experts ``w1`` gate, ``w3`` up, ``w2`` down) as every MLP."""

from __future__ import annotations

from torch import nn

from octavo.layers.fused_moe import FusedMoE, map_expert_name
from octavo.models.llama import LlamaForCausalLM
from octavo.models.moe import MoEModel
from octavo.quantization.base import QuantizationConfig

_PROJECTIONS = {"w1": "w1", "w3": "w3", "w2": "w2"}


class MixtralForCausalLM(MoEModel, LlamaForCausalLM):
    @staticmethod
    def make_mlp(config, layer_idx: int, quant_config: QuantizationConfig | None,
                 prefix: str) -> nn.Module:
        return FusedMoE(config.num_local_experts, config.num_experts_per_tok,
                        config.hidden_size, config.intermediate_size, True, quant_config,
                        prefix=prefix)

    @staticmethod
    def map_checkpoint_name(name: str):
        """``block_sparse_moe`` is the ``mlp`` here; its experts as Qwen-MoE's."""
        name = name.replace(".block_sparse_moe.", ".mlp.")
        mapped = map_expert_name(name, _PROJECTIONS)
        return mapped if mapped is not None else (name, None) if ".mlp." in name else None
