"""Token embedding and LM head (vocab-parallel aware; one rank holds everything for now)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from octavo.layers import cpu_gemm
from octavo.quantization.base import QuantizationConfig


class VocabEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size), requires_grad=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weight)


class LMHead(VocabEmbedding):
    """Projects hidden states of the sampled positions onto the vocabulary."""

    _packed_weight: torch.Tensor | None = None

    def __init__(self, vocab_size: int, hidden_size: int,
                 quant_config: QuantizationConfig | None = None, prefix: str = "lm_head"
                 ) -> None:
        super().__init__(vocab_size, hidden_size)
        # Schemes keep the LM head in full precision unless their checkpoint quantized it,
        # which no scheme here loads yet: say so rather than load it wrongly.
        if quant_config is not None and quant_config.get_quant_method(self, prefix) is not None:
            raise ValueError(f"{prefix}: a quantized LM head ({quant_config.name}) is not "
                             "supported yet")

    def tie(self, embedding: VocabEmbedding) -> None:
        self.weight = embedding.weight

    def process_weights_after_loading(self) -> None:
        self._packed_weight = cpu_gemm.pack_weight(self.weight)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return cpu_gemm.linear(hidden, self.weight, self._packed_weight)
