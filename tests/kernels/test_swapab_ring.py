"""swapab_mma's ring and tiled variants (cuda/swapab_mma.cu's STAGES and TILED; swapab_tiled's
layout): the tiled packer and the kernel's tiled addressing on the CPU, the argument checks,
and on the GPU every variant against the float64 reference and against the register-prefetch
kernel (the same sums in the same order: the same bits)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from octavo.kernels.swapab_tiled import (
    pack_swapab_tiled,
    tile_swapab,
    unpack_swapab_tiled,
    untile_swapab,
)
from octavo.kernels.w4a16_swapab import pack_swapab

VARIANTS = ("tiled", "cp2", "cp3", "cp2_tiled", "cp3_tiled")
RING_NAMES = [f"swapab_mma_{t}_{t}_w4_m8_s4_{v}" for t in ("bf16", "f16") for v in VARIANTS]


def _variant(v: str) -> dict:
    return {"stages": int(v[2]) if v.startswith("cp") else 0, "tiled": v.endswith("tiled")}


# --- the tiled layout ---------------------------------------------------------------------

@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("k,n,steps", [(128, 256, 4), (256, 512, 4), (384, 256, 1),
                                       (256, 1024, 2), (512, 256, 4)])
def test_the_tiled_layout_round_trips_and_keeps_the_shape(bits, k, n, steps):
    q = torch.randint(0, 2**bits, (k, n), generator=torch.Generator().manual_seed(k + n))
    tiled = pack_swapab_tiled(q, bits, steps)
    rows = pack_swapab(q, bits)
    assert tiled.dtype == rows.dtype == torch.int16 and tiled.shape == rows.shape
    assert torch.equal(unpack_swapab_tiled(tiled, bits, steps), q)
    assert torch.equal(untile_swapab(tiled, steps), rows)
    assert torch.equal(tile_swapab(rows, steps), tiled)
    assert not torch.equal(tiled, rows)  # reordered (random data)


def _uint4s(t: torch.Tensor) -> np.ndarray:
    """An int16 tensor's 16-byte pieces, in memory order: [numel / 8, 8] int16."""
    return t.contiguous().numpy().reshape(-1, 8)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("k,n,steps", [(256, 512, 4), (384, 256, 1), (256, 1024, 2)])
def test_each_block_holds_each_lane_s_uint4_in_the_order_the_lanes_load(bits, k, n, steps):
    """Block (tile, chunk c) element (i, h, lane) is the uint4 lane (g, t) loads in the row
    layout for step i, half h: row tile * 16 + 8 h + g, K c * CHUNK + 32 i + 8 t (the
    kernel's ``wa + (k / 32 + i) * 4``), at the kernel's tiled address
    ``(tile * (K / CHUNK) + c) * 64 * steps + (i * 2 + h) * 32 + lane`` (uint4)."""
    q = torch.randint(0, 2**bits, (k, n), generator=torch.Generator().manual_seed(7))
    rows = pack_swapab(q, bits)
    row_u4 = _uint4s(rows)
    tiled_u4 = _uint4s(pack_swapab_tiled(q, bits, steps))
    blocks = tiled_u4.reshape(rows.shape[0] // 16, k // (32 * steps), steps, 2, 32, 8)
    chunk = 32 * steps
    lane = np.arange(32)
    g, t = lane // 4, lane % 4
    for tile in range(rows.shape[0] // 16):
        for c in range(k // chunk):
            for i in range(steps):
                for h in range(2):
                    row = tile * 16 + g + 8 * h
                    # the row layout's uint4 index: (row * K + 8 t) / 8 + (k / 32 + i) * 4
                    kk = c * chunk
                    want = row_u4[(row * k + 8 * t) // 8 + (kk // 32 + i) * 4]
                    np.testing.assert_array_equal(blocks[tile, c, i, h], want)
                    addr = (tile * (k // chunk) + c) * 64 * steps + (i * 2 + h) * 32 + lane
                    np.testing.assert_array_equal(tiled_u4[addr], want)
                    # the same 8 int16: row `row`, K kk + 32 i + 8 t + 0..7
                    r = rows.numpy()
                    np.testing.assert_array_equal(
                        want, r[row[:, None], (kk + 32 * i + 8 * t)[:, None] + np.arange(8)])


def test_the_tiled_packer_rejects_a_k_that_is_not_whole_chunks():
    q = torch.randint(0, 16, (192, 256))
    with pytest.raises(ValueError, match="chunk 128"):
        pack_swapab_tiled(q, 4, 4)
    assert pack_swapab_tiled(q, 4, 2).shape == (64, 192)
