"""The one weight loader of the linear layers, driven by each parameter's layout.

It narrows a checkpoint tensor to this rank's slice (output features for column-parallel
layers, input features for row-parallel ones) and places merged parts (q/k/v, gate/up) at
their offset. Sizes come from the parameter itself and from its layout, so the same code holds
float weights, group scales, and packed integer weights (AWQ's qweight [in, out/8] packed along
output, GPTQ's [in/8, out] packed along input).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from octavo.quantization.param_layout import param_layout

COLUMN = "output"  # column-parallel: each rank holds a slice of the output features
ROW = "input"  # row-parallel: each rank holds a slice of the input features


@dataclass(frozen=True)
class ShardPlacement:
    """One part of a merged layer (q, k or v; gate or up), in output features."""
    offset: int  # where the part starts in this rank's fused output
    size: int  # this rank's output features of the part
    rank: int  # which size-long slice of the checkpoint tensor this rank holds


def _rank_slice(loaded: torch.Tensor, dim: int, size: int, tp_rank: int,
                tp_size: int) -> torch.Tensor:
    if loaded.shape[dim] != size * tp_size:
        raise ValueError(f"checkpoint dim {dim} has {loaded.shape[dim]} entries; expected "
                         f"{size} per rank x {tp_size} ranks")
    return loaded.narrow(dim, tp_rank * size, size)


def load_linear_param(param: torch.Tensor, loaded: torch.Tensor, *, tp_rank: int,
                      tp_size: int, split: str | None,
                      shard: ShardPlacement | None = None) -> None:
    """Copy this rank's part of checkpoint tensor ``loaded`` into ``param``.

    ``split``: COLUMN, ROW or None (replicated). ``shard``: where a merged part goes; its
    offsets are in output features and become stored entries through the layout's pack factor.
    """
    layout = param_layout(param)
    target = param.data
    if shard is not None and layout.output_dim is None:
        # A tensor without output features (GPTQ's g_idx) is one for all merged parts: each
        # part's checkpoint copy is the whole of it.
        shard = None
    if shard is not None:
        dim = layout.output_dim
        offset = layout.stored(dim, shard.offset, "output features (offset)")
        size = layout.stored(dim, shard.size, "output features")
        if loaded.shape[dim] < (shard.rank + 1) * size:
            raise ValueError(f"checkpoint dim {dim} has {loaded.shape[dim]} entries; this "
                             f"rank's part is entries {shard.rank * size}..{(shard.rank + 1) * size}")
        target = target.narrow(dim, offset, size)
        loaded = loaded.narrow(dim, shard.rank * size, size)
    elif split == COLUMN and layout.output_dim is not None:
        dim = layout.output_dim
        loaded = _rank_slice(loaded, dim, target.shape[dim], tp_rank, tp_size)
    if split == ROW and layout.input_dim is not None:
        dim = layout.input_dim
        loaded = _rank_slice(loaded, dim, target.shape[dim], tp_rank, tp_size)
    if target.shape != loaded.shape:
        raise ValueError(f"shape mismatch: parameter {tuple(target.shape)} vs checkpoint "
                         f"{tuple(loaded.shape)}")
    target.copy_(loaded)
