"""Linear layers that own their tensor-parallel sharding and hold a quantization method.

Each layer asks the quantization config for its method with its ``prefix``
("model.layers.0.self_attn.qkv_proj"), so schemes can choose per layer. Every parameter carries
``weight_loader(param, loaded, shard_id=None)`` and its layout, so the model loader is one
generic loop over checkpoint tensors and ``weight_loader.load_linear_param`` does the narrowing.
"""

from __future__ import annotations

import torch
from torch import nn

from octavo.distributed.parallel_state import get_tp_group
from octavo.layers import cpu_gemm
from octavo.layers.weight_loader import COLUMN, ROW, ShardPlacement, load_linear_param
from octavo.quantization.base import LinearMethod, QuantizationConfig
from octavo.quantization.param_layout import set_param_layout
from octavo.quantization.unquantized import UnquantizedLinearMethod


def choose_method(quant_config: QuantizationConfig | None, layer: nn.Module,
                  prefix: str) -> LinearMethod:
    method = None if quant_config is None else quant_config.get_quant_method(layer, prefix)
    return method if method is not None else UnquantizedLinearMethod()


def finish_loading(layer: nn.Module) -> None:
    """After the checkpoint, for a module holding ``quant_method``: the method's own
    processing, then the CPU's oneDNN copy of a dense weight (``layer._packed_weight``; None
    where the method keeps no dense weight)."""
    layer.quant_method.process_weights_after_loading(layer)
    dense = layer.quant_method.dense_weight(layer)
    layer._packed_weight = None if dense is None else cpu_gemm.pack_weight(dense)


def method_matmul(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x W^T + b`` for a module holding ``quant_method``: through the CPU's packed copy
    where it serves ``x``, else the method."""
    if cpu_gemm.usable(x, layer._packed_weight):
        return cpu_gemm.packed_linear(x, layer._packed_weight, bias)
    return layer.quant_method.apply(layer, x, bias)


class LinearBase(nn.Module):
    """y = x W^T + b, W held by the quantization method as [output, input] per partition."""

    split: str | None = None  # COLUMN, ROW, or None (replicated)

    def __init__(self, input_size: int, output_size: int, bias: bool = False,
                 quant_config: QuantizationConfig | None = None, prefix: str = "") -> None:
        super().__init__()
        self.tp = get_tp_group()
        self.input_size = input_size
        self.output_size = output_size
        self.prefix = prefix
        self.quant_method = choose_method(quant_config, self, prefix)
        dtype = torch.get_default_dtype()
        self.quant_method.create_weights(self, self.input_size_per_partition,
                                         self.output_partition_sizes, dtype)
        if bias:
            b = nn.Parameter(torch.empty(self.output_size_per_partition, dtype=dtype),
                             requires_grad=False)
            self.register_parameter("bias", set_param_layout(b, output_dim=0))
        else:
            self.register_parameter("bias", None)
        for param in self.parameters(recurse=False):
            if not hasattr(param, "weight_loader"):
                param.weight_loader = self.weight_loader
        # The CPU's oneDNN copy of a dense weight (process_weights_after_loading).
        self._packed_weight: torch.Tensor | None = None

    @property
    def input_size_per_partition(self) -> int:
        return self.input_size

    @property
    def output_size_per_partition(self) -> int:
        return self.output_size

    @property
    def output_partition_sizes(self) -> list[int]:
        """This rank's output features of each merged part (one entry when not merged)."""
        return [self.output_size_per_partition]

    def shard_placement(self, shard_id) -> ShardPlacement:
        raise ValueError(f"{self.prefix or type(self).__name__} has no merged part {shard_id!r}")

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        shard = None if shard_id is None else self.shard_placement(shard_id)
        if shard is None and len(self.output_partition_sizes) > 1 and self.tp.size > 1:
            raise ValueError(f"{self.prefix}: a fused checkpoint tensor cannot be split across "
                             "ranks; its parts must come separately")
        load_linear_param(param, loaded, tp_rank=self.tp.rank, tp_size=self.tp.size,
                          split=self.split, shard=shard)

    def process_weights_after_loading(self) -> None:
        finish_loading(self)

    def _matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return method_matmul(self, x, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._matmul(x, self.bias)


class ReplicatedLinear(LinearBase):
    pass


class ColumnParallelLinear(LinearBase):
    """Output features split across ranks; no communication in forward."""

    split = COLUMN

    @property
    def output_size_per_partition(self) -> int:
        return self.output_size // self.tp.size


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections stacked in one weight (gate and up projections)."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False,
                 quant_config: QuantizationConfig | None = None, prefix: str = "") -> None:
        self.output_sizes = output_sizes
        super().__init__(input_size, sum(output_sizes), bias, quant_config, prefix)

    @property
    def output_partition_sizes(self) -> list[int]:
        return [s // self.tp.size for s in self.output_sizes]

    def forward_gated(self, x: torch.Tensor) -> torch.Tensor | None:
        """``silu(gate) * up`` of ``forward(x)`` = [gate | up], in the method's own kernel
        where it has one for this call (``LinearMethod.apply_gated``), else None: the MLP
        then runs ``forward`` and its activation."""
        if cpu_gemm.usable(x, self._packed_weight):
            return None
        return self.quant_method.apply_gated(self, x, self.bias)

    def shard_placement(self, shard_id) -> ShardPlacement:
        sizes = self.output_partition_sizes
        if not isinstance(shard_id, int) or not 0 <= shard_id < len(sizes):
            return super().shard_placement(shard_id)
        return ShardPlacement(sum(sizes[:shard_id]), sizes[shard_id], self.tp.rank)


class QKVParallelLinear(ColumnParallelLinear):
    """Fused q/k/v projection; heads split across ranks (KV heads replicated when fewer)."""

    def __init__(self, hidden_size: int, head_dim: int, total_num_heads: int,
                 total_num_kv_heads: int, bias: bool = False,
                 quant_config: QuantizationConfig | None = None, prefix: str = "") -> None:
        tp = get_tp_group().size
        self.head_dim = head_dim
        self.num_heads = total_num_heads // tp
        self.num_kv_heads = max(1, total_num_kv_heads // tp)
        self.kv_replicas = max(1, tp // total_num_kv_heads)
        out = (self.num_heads + 2 * self.num_kv_heads) * head_dim * tp
        super().__init__(hidden_size, out, bias, quant_config, prefix)

    @property
    def output_size_per_partition(self) -> int:
        return (self.num_heads + 2 * self.num_kv_heads) * self.head_dim

    @property
    def output_partition_sizes(self) -> list[int]:
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return [q, kv, kv]

    def forward_rope(self, x: torch.Tensor, positions: torch.Tensor,
                     cos_sin_cache: torch.Tensor, kv_store) -> torch.Tensor | None:
        """q of ``forward(x)`` = [q | k | v] with the NeoX rotary embedding applied, the
        rotated k and the v written into the paged cache (``kv_store``), in the method's own
        kernel where it has one for this call (``LinearMethod.apply_qkv_rope``); else None,
        with nothing done: the attention then runs ``forward`` and the rotary."""
        if cpu_gemm.usable(x, self._packed_weight):
            return None
        return self.quant_method.apply_qkv_rope(self, x, self.bias, positions, cos_sin_cache,
                                                kv_store)

    def shard_placement(self, shard_id) -> ShardPlacement:
        if shard_id not in ("q", "k", "v"):
            return super().shard_placement(shard_id)
        q, kv, _ = self.output_partition_sizes
        if shard_id == "q":
            return ShardPlacement(0, q, self.tp.rank)
        offset = q if shard_id == "k" else q + kv
        return ShardPlacement(offset, kv, self.tp.rank // self.kv_replicas)


class RowParallelLinear(LinearBase):
    """Input features split across ranks; partial outputs summed with an all-reduce.
    ``reduce_results=False`` returns this rank's partial sum instead, for a caller that adds
    several such layers up before one all-reduce of its own (a mixture of experts)."""

    split = ROW

    def __init__(self, input_size: int, output_size: int, bias: bool = False,
                 quant_config: QuantizationConfig | None = None, prefix: str = "",
                 reduce_results: bool = True) -> None:
        if bias and not reduce_results:  # each rank would add it, the caller's sum n times
            raise ValueError(f"{prefix}: a bias needs reduce_results=True")
        self.reduce_results = reduce_results
        super().__init__(input_size, output_size, bias, quant_config, prefix)

    @property
    def input_size_per_partition(self) -> int:
        return self.input_size // self.tp.size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._reduce(self._matmul(x, None))

    def forward_glu(self, x: torch.Tensor) -> torch.Tensor | None:
        """``forward(silu(x[..., :I]) * x[..., I:])`` in the method's own kernel where it has
        one for this call (``LinearMethod.apply_glu``), else None: the MLP then runs its
        activation and ``forward``."""
        if cpu_gemm.usable(x, self._packed_weight):
            return None
        y = self.quant_method.apply_glu(self, x, None)
        return None if y is None else self._reduce(y)

    def _reduce(self, y: torch.Tensor) -> torch.Tensor:
        if not self.reduce_results:
            return y
        y = self.tp.all_reduce(y)
        if self.bias is not None:  # added once, after the reduction
            y = y + self.bias
        return y
