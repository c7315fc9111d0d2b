"""Linear layers that own their tensor-parallel sharding and a quantization strategy.

Each parameter carries ``weight_loader(param, loaded, shard_id=None)`` so the model loader is one
generic loop over checkpoint tensors.
"""

from __future__ import annotations

import torch
from torch import nn

from octavo.distributed.parallel_state import get_tp_group
from octavo.quantization.base import LinearMethod, UnquantizedLinearMethod


def _default_loader(param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
    assert param.shape == loaded.shape, (param.shape, loaded.shape)
    param.data.copy_(loaded)


class LinearBase(nn.Module):
    """y = x W^T + b with W of shape [output_size_per_partition, input_size_per_partition]."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False,
                 linear_method: LinearMethod | None = None) -> None:
        super().__init__()
        self.tp = get_tp_group()
        self.input_size = input_size
        self.output_size = output_size
        self.linear_method = linear_method or UnquantizedLinearMethod()
        dtype = torch.get_default_dtype()
        self.linear_method.create_weights(self, self.input_size_per_partition,
                                          self.output_size_per_partition, dtype)
        if bias:
            self.bias = nn.Parameter(torch.empty(self.output_size_per_partition, dtype=dtype),
                                     requires_grad=False)
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)

    @property
    def input_size_per_partition(self) -> int:
        return self.input_size

    @property
    def output_size_per_partition(self) -> int:
        return self.output_size

    def weight_loader(self, param, loaded, shard_id=None) -> None:
        _default_loader(param, loaded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_method.apply(self, x, self.bias)


class ReplicatedLinear(LinearBase):
    pass


class ColumnParallelLinear(LinearBase):
    """Output features split across ranks; no communication in forward."""

    @property
    def output_size_per_partition(self) -> int:
        return self.output_size // self.tp.size

    def _narrow_output(self, loaded: torch.Tensor, start: int, size: int) -> torch.Tensor:
        return loaded.narrow(0, start, size)

    def weight_loader(self, param, loaded, shard_id=None) -> None:
        size = param.shape[0]
        _default_loader(param, self._narrow_output(loaded, self.tp.rank * size, size))


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections stacked in one weight (gate and up projections)."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False,
                 linear_method: LinearMethod | None = None) -> None:
        self.output_sizes = output_sizes
        super().__init__(input_size, sum(output_sizes), bias, linear_method)

    def weight_loader(self, param, loaded, shard_id=None) -> None:
        if shard_id is None:
            return super().weight_loader(param, loaded)
        tp = self.tp.size
        offset = sum(self.output_sizes[:shard_id]) // tp
        size = self.output_sizes[shard_id] // tp
        shard = loaded.narrow(0, self.tp.rank * size, size)
        _default_loader(param.data.narrow(0, offset, size), shard)


class QKVParallelLinear(ColumnParallelLinear):
    """Fused q/k/v projection; heads split across ranks (KV heads replicated when fewer)."""

    def __init__(self, hidden_size: int, head_dim: int, total_num_heads: int,
                 total_num_kv_heads: int, bias: bool = False,
                 linear_method: LinearMethod | None = None) -> None:
        tp = get_tp_group().size
        self.head_dim = head_dim
        self.num_heads = total_num_heads // tp
        self.num_kv_heads = max(1, total_num_kv_heads // tp)
        self.kv_replicas = max(1, tp // total_num_kv_heads)
        self._out = (self.num_heads + 2 * self.num_kv_heads) * head_dim * tp
        super().__init__(hidden_size, self._out, bias, linear_method)

    @property
    def output_size_per_partition(self) -> int:
        return (self.num_heads + 2 * self.num_kv_heads) * self.head_dim

    def weight_loader(self, param, loaded, shard_id=None) -> None:
        if shard_id is None:
            return super().weight_loader(param, loaded)
        d = self.head_dim
        q, kv = self.num_heads * d, self.num_kv_heads * d
        offset, size = {"q": (0, q), "k": (q, kv), "v": (q + kv, kv)}[shard_id]
        rank = self.tp.rank if shard_id == "q" else self.tp.rank // self.kv_replicas
        shard = loaded.narrow(0, rank * size, size)
        _default_loader(param.data.narrow(0, offset, size), shard)


class RowParallelLinear(LinearBase):
    """Input features split across ranks; partial outputs summed with an all-reduce."""

    @property
    def input_size_per_partition(self) -> int:
        return self.input_size // get_tp_group().size

    def weight_loader(self, param, loaded, shard_id=None) -> None:
        if param.dim() == 1:  # bias: added once, after the reduction
            return _default_loader(param, loaded)
        size = param.shape[1]
        _default_loader(param, loaded.narrow(1, self.tp.rank * size, size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear_method.apply(self, x, None)
        y = self.tp.all_reduce(y)
        if self.bias is not None:
            y = y + self.bias
        return y
