"""BlockPool: ref counts, sharing, LRU free queue, errors. Pure Python, no torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from octavo.core.block_pool import BlockPool


def free_queue_ids(pool: BlockPool) -> list[int]:
    return list(pool._free)


def test_core_modules_do_not_import_torch():
    code = (
        "import octavo.core.scheduler, octavo.core.kv_cache_manager, octavo.core.block_pool, "
        "octavo.core.request, octavo.core.scheduler_output, sys; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_new_pool_is_all_free():
    pool = BlockPool(5)
    assert pool.num_blocks == 5
    assert pool.num_free_blocks == 5
    assert pool.num_used_blocks == 0
    assert pool.usage == 0.0
    assert [b.block_id for b in pool.blocks] == [0, 1, 2, 3, 4]
    assert all(b.ref_cnt == 0 and b.block_hash is None for b in pool.blocks)
    assert free_queue_ids(pool) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("n", [0, -3])
def test_pool_needs_a_block(n):
    with pytest.raises(ValueError, match=f"num_blocks must be >= 1, got {n}"):
        BlockPool(n)


def test_allocate_sets_ref_counts_and_counts():
    pool = BlockPool(4)
    blocks = pool.allocate(3)
    assert [b.block_id for b in blocks] == [0, 1, 2]
    assert all(b.ref_cnt == 1 for b in blocks)
    assert pool.num_free_blocks == 1
    assert pool.num_used_blocks == 3
    assert pool.usage == 0.75
    assert pool.allocate(0) == []
    assert pool.num_free_blocks == 1


def test_allocate_all_then_free_all():
    pool = BlockPool(3)
    blocks = pool.allocate(3)
    assert pool.num_free_blocks == 0
    assert pool.usage == 1.0
    pool.free(blocks)
    assert pool.num_free_blocks == 3
    assert all(b.ref_cnt == 0 for b in pool.blocks)


def test_allocate_more_than_free_raises_and_changes_nothing():
    pool = BlockPool(5)
    pool.allocate(2)
    before = free_queue_ids(pool)
    with pytest.raises(ValueError, match="cannot allocate 4 blocks: only 3 free"):
        pool.allocate(4)
    assert pool.num_free_blocks == 3
    assert free_queue_ids(pool) == before
    assert all(pool.blocks[i].ref_cnt == 0 for i in before)


def test_allocate_resets_block_hash():
    pool = BlockPool(2)
    (b,) = pool.allocate(1)
    b.block_hash = 1234
    pool.free([b])
    assert b.block_hash == 1234  # a freed block keeps its hash (findable by a prefix cache)
    got = pool.allocate(2)
    assert all(x.block_hash is None for x in got)


def test_free_queue_is_lru():
    """Freed blocks join the tail in the order given; allocation takes from the head."""
    pool = BlockPool(6)
    blocks = pool.allocate(4)  # 0..3; free queue [4, 5]
    pool.free([blocks[2], blocks[0]])
    assert free_queue_ids(pool) == [4, 5, 2, 0]
    pool.free([blocks[3]])
    assert free_queue_ids(pool) == [4, 5, 2, 0, 3]
    assert [b.block_id for b in pool.allocate(3)] == [4, 5, 2]
    assert [b.block_id for b in pool.allocate(2)] == [0, 3]
    assert pool.num_free_blocks == 0


def test_incref_shares_a_block():
    pool = BlockPool(3)
    a, b = pool.allocate(2)
    pool.incref([a])
    assert a.ref_cnt == 2 and b.ref_cnt == 1
    assert pool.num_used_blocks == 2
    pool.free([a])
    assert a.ref_cnt == 1
    assert pool.num_free_blocks == 1  # still held by its other owner
    pool.free([a, b])
    assert a.ref_cnt == 0 and b.ref_cnt == 0
    assert free_queue_ids(pool) == [2, 0, 1]


def test_incref_revives_a_free_block():
    """A free (ref 0) block that is shared again, e.g. a prefix-cache hit, leaves the queue."""
    pool = BlockPool(4)
    blocks = pool.allocate(2)
    pool.free(blocks)  # queue [2, 3, 0, 1]
    pool.incref([blocks[0]])
    assert blocks[0].ref_cnt == 1
    assert free_queue_ids(pool) == [2, 3, 1]
    assert pool.num_free_blocks == 3
    assert [b.block_id for b in pool.allocate(3)] == [2, 3, 1]
    with pytest.raises(ValueError, match="cannot allocate 1 blocks: only 0 free"):
        pool.allocate(1)
    pool.free([blocks[0]])
    assert free_queue_ids(pool) == [0]


def test_double_free_asserts():
    pool = BlockPool(2)
    (b,) = pool.allocate(1)
    pool.free([b])
    with pytest.raises(AssertionError, match="double free"):
        pool.free([b])
    assert pool.num_free_blocks == 2


def test_double_free_within_one_call_asserts():
    pool = BlockPool(2)
    (b,) = pool.allocate(1)
    with pytest.raises(AssertionError, match="double free"):
        pool.free([b, b])


def test_free_of_never_allocated_block_asserts():
    pool = BlockPool(2)
    with pytest.raises(AssertionError, match="double free"):
        pool.free([pool.blocks[1]])
