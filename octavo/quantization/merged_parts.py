"""Where one checkpoint part (q, k or v; gate or up; or a whole layer) lands in a linear layer
on this rank, for methods that take each part whole and decode or quantize it themselves
(bitsandbytes, fp8) instead of copying it through the layout-driven loader.

Layers are only read through attributes (``prefix``, ``tp``, ``shard_placement``,
``output_size_per_partition``, ``input_size_per_partition``): quantization never imports
``octavo.layers``.
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn


def rank_box(layer: nn.Module, shard_id, full_rows: int,
             full_cols: int) -> tuple[int, int, int, int]:
    """(first row, rows, first column, columns) of this rank's slice of a part whose whole
    checkpoint tensor is ``full_rows x full_cols``; a part already the rank's size is whole."""
    if shard_id is None:
        rows, rank = layer.output_size_per_partition, layer.tp.rank
    else:
        placement = layer.shard_placement(shard_id)
        rows, rank = placement.size, placement.rank
    cols = layer.input_size_per_partition
    r0 = 0 if full_rows == rows else rank * rows
    c0 = 0 if full_cols == cols else layer.tp.rank * cols
    if full_rows < r0 + rows or full_cols < c0 + cols:
        raise ValueError(f"layer {layer.prefix!r}: part {shard_id!r} is {full_rows}x{full_cols}; "
                         f"this rank needs rows {r0}..{r0 + rows}, columns {c0}..{c0 + cols}")
    return r0, rows, c0, cols


def part_order(layer: nn.Module, shard_ids: Iterable) -> list:
    """The parts' ids in output order (None, a layer's only part, first)."""
    return sorted(shard_ids, key=lambda s: -1 if s is None else layer.shard_placement(s).offset)


def part_rows(layer: nn.Module, shard_id) -> tuple[int, int]:
    """(first output row, rows) of a part in this rank's fused output."""
    if shard_id is None:
        return 0, layer.output_size_per_partition
    placement = layer.shard_placement(shard_id)
    return placement.offset, placement.size
