"""A mixture-of-experts layer's experts as one quantized SwiGLU MLP each (GPTQ, AWQ,
compressed-tensors, FP8, bitsandbytes: whatever the checkpoint's or the user's scheme is).

Quantized experts keep the tools' own per-expert layout (``experts.3.gate_proj.qweight`` ...), so
each expert is built from the ordinary linear layers: a merged gate/up column-parallel linear
and a row-parallel down linear, each asking the quantization config for its method at its own
prefix (``model.layers.0.mlp.experts.3.gate_up_proj``). Every scheme's packed layout, tensor
parallel narrowing, ignore and dynamic rules, and weight loader then apply unchanged, on every
device the scheme runs on; the checkpoint's names reach them through the model's
``packed_modules_mapping`` (gate_proj / up_proj -> gate_up_proj) like a dense MLP's.

The down projection does not all-reduce: ``FusedMoE`` sums the routed experts' partial outputs
and all-reduces once. The experts run in ``FusedMoE``'s loop (the grouped Triton kernel takes
only stacked float experts), which reads per-expert counts on the host: not for CUDA graphs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from octavo.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from octavo.quantization.base import QuantizationConfig


class _Expert(nn.Module):
    """One expert: down(silu(gate x) * up x), without the down projection's all-reduce."""

    def __init__(self, hidden: int, intermediate: int, quant_config: QuantizationConfig,
                 prefix: str) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden, [intermediate] * 2,
                                                       quant_config=quant_config,
                                                       prefix=f"{prefix}.gate_up_proj")
        self.down_proj = RowParallelLinear(intermediate, hidden, quant_config=quant_config,
                                           prefix=f"{prefix}.down_proj", reduce_results=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The methods' fused activations where they have them (as LlamaMLP), else plain.
        h = self.gate_up_proj.forward_gated(x)
        if h is not None:
            return self.down_proj(h)
        gate_up = self.gate_up_proj(x)
        y = self.down_proj.forward_glu(gate_up)
        if y is not None:
            return y
        inter = gate_up.shape[-1] // 2
        return self.down_proj(F.silu(gate_up[..., :inter]) * gate_up[..., inter:])


class QuantizedExperts(nn.ModuleList):
    """``num_experts`` experts, expert ``e`` at ``<prefix>.<e>`` (the checkpoint's
    ``experts.<e>``); ``intermediate`` is the full (unsharded) expert width."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int,
                 quant_config: QuantizationConfig, prefix: str) -> None:
        super().__init__(_Expert(hidden, intermediate, quant_config, f"{prefix}.{e}")
                         for e in range(num_experts))
        self.num_experts = num_experts

    def expert_forward(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert ``e`` on rows ``x``: this rank's partial down(silu(gate x) * up x)."""
        return self[e](x)
