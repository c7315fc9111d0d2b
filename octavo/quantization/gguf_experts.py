"""A mixture-of-experts layer's experts kept in a GGUF file's block formats (the CPU).

The experts are almost all of an MoE model's weights (Qwen3-30B-A3B: 29 of its 30.5 billion
parameters), so dequantizing them at load would need 4-8x the file's size in memory. Here each
expert's gate/up and down rows arrive raw (uint8, from the file's stacked ``ffn_*_exps``
tensors, split per expert by the loader), are repacked as they arrive into the layout of
``gguf_blocks`` (the same kernels as GGUF linear layers), and ``expert_forward`` runs one
expert's rows through ``gguf_matmul``. Experts are kept per expert (lists, not one stacked
tensor): the repacked scales' dtype is chosen per tensor.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from octavo import envs
from octavo.quantization import gguf_blocks
from octavo.quantization.param_layout import expert_shard, set_expert_shards


class GGUFExperts(nn.Module):
    """A layer's experts in their GGUF blocks: ``expert_forward`` (one expert's rows, the
    grouped loop) and ``token_forward`` (one token's experts in one C++ call)."""

    def __init__(self, num_experts: int, hidden: int, inter: int, fmt13: str, fmt2: str,
                 interleave: bool) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.hidden, self.inter = hidden, inter
        self.fmt13, self.fmt2 = fmt13, fmt2
        self.interleave = interleave
        from octavo.quantization.gguf import ISA_CODES

        self.isa = ISA_CODES[envs.cpu_quant_isa()]  # read once: os.environ costs per call
        self._rows13 = (2 * inter, gguf_blocks.row_bytes(fmt13, hidden))
        self._rows2 = (hidden, gguf_blocks.row_bytes(fmt2, inter))
        # Empty stand-ins that the generic loader addresses (and counts expected_shards of):
        # each expert is repacked as soon as its rows arrive, so no stacked copy of the raw
        # rows ever exists (peak memory: the repacked experts plus one expert's rows).
        for name in ("w13_weight", "w2_weight"):
            param = nn.Parameter(torch.empty(0, dtype=torch.uint8), requires_grad=False)
            param.weight_loader = self.weight_loader
            self.register_parameter(name, set_expert_shards(param, name, num_experts))
        self._w13: list[tuple[torch.Tensor, ...] | None] = [None] * num_experts
        self._w2: list[tuple[torch.Tensor, ...] | None] = [None] * num_experts
        self._half: dict[tuple[int, str], torch.Tensor] = {}  # a gate or up awaiting the other

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        expert, which = expert_shard(shard_id, self.num_experts)
        rows, cols = self._rows2 if which == "w2" else self._rows13
        want = (rows if which == "w2" else rows // 2, cols)
        if loaded.dtype != torch.uint8 or tuple(loaded.shape) != want:
            raise ValueError(f"expert {expert} {which}: GGUF rows {tuple(loaded.shape)} "
                             f"{loaded.dtype} do not fit {want} uint8")
        if which == "w2":
            self._w2[expert] = gguf_blocks.repack(loaded, self.fmt2, self.inter, self.interleave)
            return
        other = self._half.pop((expert, "w3" if which == "w1" else "w1"), None)
        if other is None:
            self._half[(expert, which)] = loaded.clone()
            return
        gate, up = (loaded, other) if which == "w1" else (other, loaded)
        self._w13[expert] = gguf_blocks.repack(torch.cat([gate, up]), self.fmt13, self.hidden,
                                               self.interleave)

    def process_weights_after_loading(self) -> None:
        missing = [e for e in range(self.num_experts)
                   if self._w13[e] is None or self._w2[e] is None]
        if missing:
            raise ValueError(f"GGUF experts {missing[:5]} never received all their rows")
        for name in ("w13_weight", "w2_weight"):
            delattr(self, name)

    def expert_forward(self, e: int, x: torch.Tensor) -> torch.Tensor:
        from octavo.quantization.gguf import gguf_matmul

        gate_up = gguf_matmul(x, *self._w13[e], self.hidden, self.isa)
        h = F.silu(gate_up[:, :self.inter]) * gate_up[:, self.inter:]
        return gguf_matmul(h, *self._w2[e], self.inter, self.isa)

    def token_forward(self, x: torch.Tensor, experts: list[int],
                      weights: list[float]) -> torch.Tensor | None:
        """One token's ``experts`` weighted by ``weights`` and summed, in one C++ call where
        the CPU kernels are built (None elsewhere: the caller loops over expert_forward)."""
        from octavo.quantization.gguf import _kernels

        ops = _kernels(x)
        if ops is None or not hasattr(ops, "gguf_moe_token"):
            return None
        params = [t for e in experts for t in (*self._w13[e], *self._w2[e])]
        return ops.gguf_moe_token(x.contiguous(), params, weights, self.hidden, self.inter,
                                  self.isa)
