"""The tiled variant of ``pack_swapab``'s layout for the CUDA kernel (``swapab_mma(...,
tiled=True)``, cuda/swapab_mma.cu's TILED): the same int16 words, reordered so that what one
warp reads for one chunk of K is one contiguous block, in the order its lanes read it.

In ``pack_swapab``'s row layout (int16 [N / per, K], K contiguous) a warp takes a tile of 16
int16 rows over K in chunks of ``CHUNK = 32 * steps`` K values; in step ``i`` of a chunk, lane
(g = lane / 4, t = lane % 4) loads 16 bytes (8 int16 = one uint4) of row g (half h = 0) and of
row g + 8 (h = 1) at K offset 32 i + 8 t. So a warp's chunk is 16 separate pieces of
2 * CHUNK bytes, one per row. Here block (tile, chunk) holds, for step i, half h and lane
0..31, that lane's uint4: 16 * CHUNK int16 (4 KB for steps 4) contiguous, each warp-wide
16-byte-per-lane load 512 contiguous bytes, and the blocks in tile-major order (a warp walking
K reads consecutive blocks). The uint4 of (tile, chunk c, i, h, lane) is uint4 number
``(tile * (K / CHUNK) + c) * 2 * 32 * steps + (i * 2 + h) * 32 + lane`` of the tensor.

Same dtype and shape as ``pack_swapab`` (int16 [N / per, K]): only the order differs.
"""

from __future__ import annotations

import torch

from octavo.kernels.w4a16_swapab import pack_swapab, unpack_swapab

TILE_ROWS = 16  # int16 rows per warp tile (two halves of 8: rows g and g + 8)
LANE_INT16 = 8  # int16 per lane per load: one uint4


def chunk(steps: int) -> int:
    """K values per chunk of ``steps`` 32-wide steps."""
    return 32 * steps


def _check(rows: int, k: int, steps: int) -> None:
    if steps < 1 or k % chunk(steps):
        raise ValueError(f"K={k} is not a multiple of the chunk {chunk(steps)} ({steps} steps)")
    if rows % TILE_ROWS:
        raise ValueError(f"{rows} int16 rows are not whole tiles of {TILE_ROWS}")


def tile_swapab(packed: torch.Tensor, steps: int) -> torch.Tensor:
    """``pack_swapab``'s int16 [N / per, K] (row layout) -> the tiled layout, same shape."""
    rows, k = packed.shape
    _check(rows, k, steps)
    # [tile, h, g, chunk, i, t, e]: row tile * 16 + 8 h + g, K chunk * CHUNK + 32 i + 8 t + e
    v = packed.reshape(rows // TILE_ROWS, 2, 8, k // chunk(steps), steps, 4, LANE_INT16)
    # -> [tile, chunk, i, h, g, t, e]: lane = 4 g + t
    return v.permute(0, 3, 4, 1, 2, 5, 6).contiguous().reshape(rows, k)


def untile_swapab(tiled: torch.Tensor, steps: int) -> torch.Tensor:
    """``tile_swapab``'s inverse: the tiled layout -> ``pack_swapab``'s row layout."""
    rows, k = tiled.shape
    _check(rows, k, steps)
    v = tiled.reshape(rows // TILE_ROWS, k // chunk(steps), steps, 2, 8, 4, LANE_INT16)
    return v.permute(0, 3, 4, 1, 2, 5, 6).contiguous().reshape(rows, k)


def pack_swapab_tiled(q: torch.Tensor, bits: int, steps: int) -> torch.Tensor:
    """Integer values [K, N] (0 <= q < 2**bits) -> the tiled layout of ``pack_swapab(q,
    bits)`` for chunks of ``steps`` steps (K a multiple of 32 * steps)."""
    return tile_swapab(pack_swapab(q, bits), steps)


def unpack_swapab_tiled(tiled: torch.Tensor, bits: int, steps: int) -> torch.Tensor:
    """``pack_swapab_tiled``'s inverse: integer values [K, N] (int32)."""
    return unpack_swapab(untile_swapab(tiled, steps), bits)
