"""Token embedding and LM head, vocab-parallel under tensor parallelism.

With ``tp`` ranks each holds ``ceil(vocab / tp)`` consecutive rows of the table (the last
rank's tail padded with zero rows). The embedding looks up the ids in its rows, zeros the
others and all-reduces: exactly one rank contributes each row, so the sum is the row itself,
bit for bit. The LM head multiplies by its rows and all-gathers the logits in rank order, so
every rank holds the whole [tokens, vocab] logits and samples the same token (the engine's
rule: every rank samples identically, no broadcast). A tied LM head shares its embedding's
shard.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from octavo.distributed.parallel_state import get_tp_group
from octavo.layers import cpu_gemm
from octavo.quantization.base import QuantizationConfig


class VocabEmbedding(nn.Module):
    # GGUF block format kept at load (quantization="gguf"), None for a float weight.
    gguf_format: str | None = None

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.tp = get_tp_group()
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.rows_per_rank = -(-vocab_size // self.tp.size)
        self.row_start = self.tp.rank * self.rows_per_rank
        self.weight = nn.Parameter(torch.empty(self.rows_per_rank, hidden_size),
                                   requires_grad=False)
        self.weight.weight_loader = self._load_rows

    def _load_rows(self, param: torch.Tensor, loaded: torch.Tensor) -> None:
        """This rank's rows of the checkpoint's [vocab, hidden] table; padding rows zero."""
        if tuple(loaded.shape) != (self.vocab_size, self.hidden_size):
            raise ValueError(f"shape mismatch: vocabulary table {tuple(loaded.shape)}, "
                             f"expected {(self.vocab_size, self.hidden_size)}")
        rows = max(0, min(self.rows_per_rank, self.vocab_size - self.row_start))
        param.data[:rows].copy_(loaded[self.row_start: self.row_start + rows])
        param.data[rows:].zero_()

    def keep_gguf_quantized(self, fmt: str) -> None:
        """Load the GGUF file's raw rows of block format ``fmt`` instead of floats; they are
        repacked after loading and rows are dequantized on lookup."""
        from octavo.quantization import gguf_blocks

        if self.tp.size > 1:
            raise ValueError("a GGUF-quantized vocabulary table is not vocab-parallel")
        raw = torch.empty(self.vocab_size, gguf_blocks.row_bytes(fmt, self.hidden_size),
                          dtype=torch.uint8, device=self.weight.device)
        self.out_dtype = self.weight.dtype  # the model's dtype: rows are dequantized to it
        self.weight = nn.Parameter(raw, requires_grad=False)
        self.gguf_format = fmt

    def process_weights_after_loading(self) -> None:
        if self.gguf_format is None or self.weight is None:
            return
        from octavo.quantization import gguf_blocks
        from octavo.quantization.gguf import interleave_weights

        q, scales, mins = gguf_blocks.repack(self.weight.data, self.gguf_format,
                                             self.hidden_size, interleave_weights())
        self.weight = None
        self.qweight = nn.Parameter(q, requires_grad=False)
        self.gguf_scales = nn.Parameter(scales, requires_grad=False)
        self.gguf_mins = nn.Parameter(mins, requires_grad=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size > 1:
            local = input_ids - self.row_start
            mine = (local >= 0) & (local < self.rows_per_rank)
            rows = F.embedding(local.clamp(0, self.rows_per_rank - 1), self.weight)
            return self.tp.all_reduce(rows * mine.unsqueeze(-1).to(rows.dtype))
        if self.gguf_format is None:
            return F.embedding(input_ids, self.weight)
        from octavo.quantization import gguf_blocks

        ids = input_ids.reshape(-1)
        rows = gguf_blocks.dequantize_rows(self.qweight, self.gguf_scales, self.gguf_mins, ids,
                                           self.hidden_size, self.out_dtype)
        return rows.view(*input_ids.shape, self.hidden_size)


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
        # Not a submodule (no second path to its parameters): kept for a quantized embedding.
        self.__dict__["tied_to"] = embedding

    def _source(self) -> VocabEmbedding:
        return self.__dict__.get("tied_to") or self

    def process_weights_after_loading(self) -> None:
        src = self._source()
        if src.gguf_format is not None:  # the LM head multiplies by the quantized rows
            # The embedding's repack (untied: this head's own rows; calling
            # src.process_weights_after_loading() here would recurse into this method).
            VocabEmbedding.process_weights_after_loading(src)
            self.weight = None
            self._packed_weight = None
            return
        self._packed_weight = cpu_gemm.pack_weight(self.weight)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        src = self._source()
        if src.gguf_format is not None:
            from octavo.quantization.gguf import gguf_matmul

            return gguf_matmul(hidden, src.qweight, src.gguf_scales, src.gguf_mins,
                               src.hidden_size)
        logits = cpu_gemm.linear(hidden, self.weight, self._packed_weight)
        if self.tp.size == 1:
            return logits
        return self.tp.all_gather(logits, dim=-1)[..., : self.vocab_size]
