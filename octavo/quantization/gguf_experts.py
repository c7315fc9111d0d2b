"""A mixture-of-experts layer's experts kept in a GGUF file's block formats (the CPU).

The experts are almost all of an MoE model's weights (Qwen3-30B-A3B: 29 of its 30.5 billion
parameters), so dequantizing them at load would need 4-8x the file's size in memory. Here each
expert's gate/up and down rows arrive raw (uint8, from the file's stacked ``ffn_*_exps``
tensors, split per expert by the loader), are repacked after loading into the layout of
``gguf_blocks`` (the same kernels as GGUF linear layers), and ``expert_forward`` runs one
expert's rows through ``gguf_matmul``. Experts are kept per expert (lists, not one stacked
tensor): the repacked scales' dtype is chosen per tensor.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from octavo.quantization import gguf_blocks


class GGUFExperts(nn.Module):
    def __init__(self, num_experts: int, hidden: int, inter: int, fmt13: str, fmt2: str,
                 interleave: bool) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.hidden, self.inter = hidden, inter
        self.formats = {"w13_weight": fmt13, "w2_weight": fmt2}
        self.interleave = interleave
        for name, rows, cols in (("w13_weight", 2 * inter, hidden), ("w2_weight", hidden, inter)):
            raw = torch.empty(num_experts, rows, gguf_blocks.row_bytes(self.formats[name], cols),
                              dtype=torch.uint8)
            param = nn.Parameter(raw, requires_grad=False)
            param.weight_loader = self.weight_loader
            param.expected_shards = [(e, w) for e in range(num_experts)
                                     for w in (("w1", "w3") if name == "w13_weight" else ("w2",))]
            self.register_parameter(name, param)
        self._w13: list[tuple[torch.Tensor, ...]] = []
        self._w2: list[tuple[torch.Tensor, ...]] = []

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        expert, which = shard_id
        if not 0 <= expert < self.num_experts:
            raise ValueError(f"expert {expert} out of range (the model has {self.num_experts})")
        target = param.data[expert]
        if which in ("w1", "w3"):
            target = target.narrow(0, 0 if which == "w1" else self.inter, self.inter)
        if loaded.dtype != torch.uint8 or target.shape != loaded.shape:
            raise ValueError(f"expert {expert} {which}: GGUF rows {tuple(loaded.shape)} "
                             f"{loaded.dtype} do not fit {tuple(target.shape)} uint8")
        target.copy_(loaded)

    def process_weights_after_loading(self) -> None:
        for name, cols, out in (("w13_weight", self.hidden, self._w13),
                                ("w2_weight", self.inter, self._w2)):
            raw = getattr(self, name).data
            out[:] = [gguf_blocks.repack(raw[e], self.formats[name], cols, self.interleave)
                      for e in range(self.num_experts)]
            delattr(self, name)  # the raw rows are not needed any more

    def expert_forward(self, e: int, x: torch.Tensor) -> torch.Tensor:
        from octavo.quantization.gguf import gguf_matmul

        gate_up = gguf_matmul(x, *self._w13[e], self.hidden)
        h = F.silu(gate_up[:, :self.inter]) * gate_up[:, self.inter:]
        return gguf_matmul(h, *self._w2[e], self.inter)
