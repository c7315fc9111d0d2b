"""What the mixture-of-experts families share: which layers are sparse, the stacked experts'
checkpoint names, and when a decode step may be captured in a CUDA graph."""

from __future__ import annotations

from octavo import envs
from octavo.layers.fused_moe import FusedMoE, map_expert_name


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
        """Only with the grouped kernels, which run stacked float experts and integer experts
        stacked at load: the expert loop (other quantized experts, or the flag off) reads
        counts on the host."""
        return envs.fused_moe() and all(m.grouped_experts for m in self.modules()
                                        if isinstance(m, FusedMoE))

    def map_checkpoint_name(self, name: str):
        """A per-expert tensor's place in a layer's stacked experts (float, or GGUF's
        stand-ins); None where the layer holds no such parameter (quantized experts: each
        expert's own linear layers, reached through ``packed_modules_mapping``)."""
        mapped = map_expert_name(name)
        if mapped is None or mapped[0] not in self._stacked_expert_params():
            return None
        return mapped

    def _stacked_expert_params(self) -> set[str]:
        """The names of the stacked experts' parameters (cached: the loader asks once per
        checkpoint tensor)."""
        found = self.__dict__.get("_stacked_params")
        if found is None:
            found = {n for n, _ in self.named_parameters()
                     if n.endswith((".experts.w13_weight", ".experts.w2_weight"))}
            self.__dict__["_stacked_params"] = found
        return found
