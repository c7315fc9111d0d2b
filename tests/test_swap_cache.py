"""SwapCache: whole-block copies between device KV caches and CPU swap tensors, for the
layouts of both attention backends (dim 1 is the block dim)."""

from __future__ import annotations

import pytest
import torch

from octavo.attention.torch_backend import TorchAttentionBackend
from octavo.attention.triton_backend import TritonAttentionBackend
from octavo.worker.swap_cache import SwapCache, _runs, num_swap_blocks

LAYERS, BLOCKS, BS, HEADS, DIM = 3, 10, 4, 2, 8


@pytest.fixture(params=[TorchAttentionBackend, TritonAttentionBackend], ids=["torch", "triton"])
def caches(request):
    shape = request.param.kv_cache_shape(BLOCKS, BS, HEADS, DIM)
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(shape, generator=gen) for _ in range(LAYERS)]


def test_num_swap_blocks():
    assert num_swap_blocks(1, 1 << 20) == 1024
    assert num_swap_blocks(0, 2048) == 0
    assert num_swap_blocks(2048 * 3.5 / 2**30, 2048) == 3


def test_runs_merge_only_steps_of_one_on_both_sides():
    assert _runs([(4, 0), (5, 1), (6, 2), (9, 3), (3, 4), (4, 6)]) == [
        (4, 0, 3), (9, 3, 1), (3, 4, 1), (4, 6, 1)]
    assert _runs([]) == []


def test_swap_out_then_in_restores_blocks_in_every_layer(caches):
    swap = SwapCache(caches, 6)
    assert [c.shape for c in swap.cpu_caches] == [
        (c.shape[0], 6, *c.shape[2:]) for c in caches]
    before = [c.clone() for c in caches]
    out = [(7, 2), (8, 3), (1, 0), (4, 5)]  # a run of two, then scattered
    swap.swap(out, [])
    for layer, cpu in zip(before, swap.cpu_caches):
        for g, c in out:
            assert torch.equal(cpu[:, c], layer[:, g])
    for c in caches:  # the device blocks are reused by others meanwhile
        c.zero_()
    back = [(2, 0), (3, 1), (0, 9), (5, 6)]
    swap.swap([], back)
    for old, new in zip(before, caches):
        for (g_old, _), (_, g_new) in zip(out, back):
            assert torch.equal(new[:, g_new], old[:, g_old])
        untouched = [b for b in range(BLOCKS) if b not in (0, 1, 9, 6)]
        assert not new[:, untouched].any()


def test_swap_outs_run_before_swap_ins(caches):
    """A device block freed by a swap-out can be a swap-in's destination in the same step."""
    swap = SwapCache(caches, 2)
    swap.swap([(5, 1)], [])
    old5 = [c[:, 5].clone() for c in caches]
    old3 = [c[:, 3].clone() for c in caches]
    swap.swap([(3, 0)], [(1, 3)])
    for layer, cpu, b3, b5 in zip(caches, swap.cpu_caches, old3, old5):
        assert torch.equal(cpu[:, 0], b3)
        assert torch.equal(layer[:, 3], b5)


def test_needs_a_block():
    with pytest.raises(ValueError, match="num_cpu_blocks must be >= 1, got 0"):
        SwapCache([torch.zeros(2, 1, 1, 1, 1)], 0)
