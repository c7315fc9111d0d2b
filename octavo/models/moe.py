"""What the mixture-of-experts families share: which layers are sparse, the stacked experts'
checkpoint names, and when a decode step may be captured in a CUDA graph."""

from __future__ import annotations

from octavo import envs
from octavo.layers.fused_moe import map_expert_name


def is_sparse_layer(config, layer_idx: int) -> bool:
    """Qwen-MoE's rule: every ``decoder_sparse_step``-th layer that ``mlp_only_layers`` does
    not list has experts (none without ``num_experts``)."""
    step = getattr(config, "decoder_sparse_step", 1) or 1
    dense = layer_idx in (getattr(config, "mlp_only_layers", None) or [])
    return bool(getattr(config, "num_experts", 0)) and not dense and (layer_idx + 1) % step == 0


class MoEModel:
    """Mixed into a causal LM whose MLPs are (some of them) ``FusedMoE`` layers."""

    @property
    def cuda_graph_safe(self) -> bool:
        """Only with the fused kernel: the expert loop reads counts on the host."""
        return envs.fused_moe()

    @staticmethod
    def map_checkpoint_name(name: str):
        return map_expert_name(name)
