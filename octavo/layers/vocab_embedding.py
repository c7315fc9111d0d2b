"""Token embedding and LM head, vocab-parallel under tensor parallelism.

With ``tp`` ranks each holds ``ceil(vocab / tp)`` consecutive rows of the table (the last
rank's tail padded with zero rows). The embedding looks up the ids in its rows, zeros the
others and all-reduces: exactly one rank contributes each row, so the sum is the row itself,
bit for bit. The LM head multiplies by its rows and all-gathers the logits in rank order, so
every rank holds the whole [tokens, vocab] logits and samples the same token (the engine's
rule: every rank samples identically, no broadcast). A tied LM head shares its embedding's
shard.

A checkpoint may quantize the LM head (GPTQModel's ``lm_head=True``): the head then holds its
quantization method as any linear layer does, with the method's parameters named as the
checkpoint names them (``lm_head.qweight``...), its vocab rows split over the ranks the same
way (the checkpoint's rows padded with zeros to ``tp * rows_per_rank``), and the same kernels.
Such a head is never tied: it has weights of its own, and the embedding stays in full
precision.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from octavo.distributed.parallel_state import get_tp_group
from octavo.layers import cpu_gemm
from octavo.layers.linear import finish_loading, method_matmul
from octavo.layers.weight_loader import COLUMN, load_linear_param
from octavo.quantization.base import LinearMethod, QuantizationConfig
from octavo.quantization.param_layout import param_layout


class VocabEmbedding(nn.Module):
    # GGUF block format kept at load (quantization="gguf"), None for a float weight.
    gguf_format: str | None = None

    def __init__(self, vocab_size: int, hidden_size: int, table: bool = True) -> None:
        """``table``: allocate the float table (an LM head whose weight is quantized has
        none)."""
        super().__init__()
        self.tp = get_tp_group()
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.rows_per_rank = -(-vocab_size // self.tp.size)
        self.row_start = self.tp.rank * self.rows_per_rank
        self.register_parameter("weight", None)
        if table:
            self._make_table()

    def _make_table(self) -> None:
        self.weight = nn.Parameter(torch.empty(self.rows_per_rank, self.hidden_size),
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
        ops = _cpu_ops(self.qweight)
        if ops is not None:  # the rows in one call (the torch one: ~0.3 ms a decode step)
            rows = ops.gguf_dequantize_rows(self.qweight, self.gguf_scales, self.gguf_mins,
                                            ids.long(), self.hidden_size).to(self.out_dtype)
        else:
            rows = gguf_blocks.dequantize_rows(self.qweight, self.gguf_scales, self.gguf_mins,
                                               ids, self.hidden_size, self.out_dtype)
        return rows.view(*input_ids.shape, self.hidden_size)


def _cpu_ops(qweight: torch.Tensor):
    """Octavo's CPU kernels for a GGUF table on the CPU, or None (another device, or the
    extension did not build)."""
    if qweight.device.type != "cpu":
        return None
    from octavo.kernels import cpu as cpu_kernels

    ops = cpu_kernels.load()
    return ops if ops is not None and hasattr(ops, "gguf_dequantize_rows") else None


class LMHead(VocabEmbedding):
    """Projects hidden states of the sampled positions onto the vocabulary."""

    _packed_weight: torch.Tensor | None = None
    # ``quant_method`` (a LinearMethod) is set only when the checkpoint quantizes the head:
    # like the linear layers, a module has one exactly when a method computes it.

    def __init__(self, vocab_size: int, hidden_size: int,
                 quant_config: QuantizationConfig | None = None, prefix: str = "lm_head"
                 ) -> None:
        super().__init__(vocab_size, hidden_size, table=False)
        self.prefix = prefix
        method = None if quant_config is None else quant_config.get_quant_method(self, prefix)
        if method is None:
            self._make_table()
            return
        # What the methods read of a linear layer: its full input and (padded) output sizes.
        self.input_size = hidden_size
        self.output_size = self.rows_per_rank * self.tp.size
        self.quant_method: LinearMethod = method
        try:
            method.create_weights(self, hidden_size, [self.rows_per_rank],
                                  torch.get_default_dtype())
        except ValueError as e:
            raise ValueError(f"{prefix}: the quantized LM head ({quant_config.name}) cannot "
                             f"hold vocab_size={vocab_size} as {self.rows_per_rank} rows on "
                             f"each of {self.tp.size} tensor-parallel rank(s): {e}") from e
        for param in self.parameters(recurse=False):
            if not hasattr(param, "weight_loader"):
                param.weight_loader = self.weight_loader

    @property
    def quantized(self) -> bool:
        return "quant_method" in self.__dict__

    @property
    def is_tied(self) -> bool:
        return "tied_to" in self.__dict__

    def tie(self, embedding: VocabEmbedding) -> None:
        """Share ``embedding``'s table; a quantized head keeps its own weights (the
        checkpoint stores them: tying would multiply by the float embedding instead)."""
        if self.quantized:
            return
        self.weight = embedding.weight
        # Not a submodule (no second path to its parameters): kept for a quantized embedding.
        self.__dict__["tied_to"] = embedding

    def _source(self) -> VocabEmbedding:
        return self.__dict__.get("tied_to") or self

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        """A quantized head's parameter: the checkpoint's vocab rows (output features) padded
        with zeros to ``tp * rows_per_rank``, then narrowed to this rank's as a
        column-parallel layer's are."""
        layout = param_layout(param)
        dim = layout.output_dim
        if dim is not None:
            have = loaded.shape[dim]
            want = layout.stored(dim, self.vocab_size, "vocab rows")
            if have != want:
                raise ValueError(f"{self.prefix}: checkpoint dim {dim} has {have} entries, "
                                 f"expected {want} for vocab_size={self.vocab_size}")
            padded = layout.stored(dim, self.output_size, "vocab rows")
            if padded > have:
                pad = list(loaded.shape)
                pad[dim] = padded - have
                loaded = torch.cat([loaded, loaded.new_zeros(pad)], dim=dim)
        load_linear_param(param, loaded, tp_rank=self.tp.rank, tp_size=self.tp.size,
                          split=COLUMN)

    def process_weights_after_loading(self) -> None:
        if self.quantized:
            finish_loading(self)
            return
        src = self._source()
        if src.gguf_format is not None:  # the LM head multiplies by the quantized rows
            # The embedding's repack (untied: this head's own rows; calling
            # src.process_weights_after_loading() here would recurse into this method).
            VocabEmbedding.process_weights_after_loading(src)
            self.weight = None
            self._packed_weight = None
            return
        self._packed_weight = cpu_gemm.pack_weight(self.weight)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """This rank's [tokens, rows_per_rank] logits."""
        if not self.quantized:
            return cpu_gemm.linear(hidden, self.weight, self._packed_weight)
        return method_matmul(self, hidden, None)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        src = self._source()
        if src.gguf_format is not None:
            from octavo.quantization.gguf import gguf_matmul

            return gguf_matmul(hidden, src.qweight, src.gguf_scales, src.gguf_mins,
                               src.hidden_size)
        logits = self._logits(hidden)
        if self.tp.size == 1:
            return logits
        return self.tp.all_gather(logits, dim=-1)[..., : self.vocab_size]
