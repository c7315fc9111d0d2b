"""KVCacheManager: append-only block tables over a BlockPool. Pure Python, no torch."""

from __future__ import annotations

import pytest

from octavo.core.kv_cache_manager import KVCacheManager, cdiv
from octavo.core.request import Request
from octavo.sampling_params import SamplingParams


def make_req(rid: str = "r", num_prompt: int = 10) -> Request:
    return Request(rid, list(range(num_prompt)), SamplingParams(max_tokens=8))


@pytest.mark.parametrize(("a", "b", "want"), [(0, 4, 0), (1, 4, 1), (4, 4, 1), (5, 4, 2),
                                              (8, 4, 2), (9, 4, 3), (7, 1, 7)])
def test_cdiv(a, b, want):
    assert cdiv(a, b) == want


def test_block_size_must_be_positive():
    with pytest.raises(ValueError, match="block_size must be >= 1, got 0"):
        KVCacheManager(4, 0)


def test_allocate_slots_grows_by_ceil_minus_held():
    kv = KVCacheManager(num_blocks=10, block_size=4)
    req = make_req()
    assert kv.num_blocks_needed(req, 5) == 2
    assert kv.allocate_slots(req, 5) == [0, 1]
    req.num_computed_tokens = 5
    # 5 + 3 = 8 tokens fit in the 2 blocks held.
    assert kv.num_blocks_needed(req, 3) == 0
    assert kv.allocate_slots(req, 3) == []
    assert kv.block_ids("r") == [0, 1]
    req.num_computed_tokens = 8
    # 8 + 1 = 9 tokens: one more block.
    assert kv.allocate_slots(req, 1) == [2]
    req.num_computed_tokens = 9
    # 9 + 11 = 20 tokens: 5 blocks, 3 held.
    assert kv.num_blocks_needed(req, 11) == 2
    assert kv.allocate_slots(req, 11) == [3, 4]
    assert kv.block_ids("r") == [0, 1, 2, 3, 4]
    assert kv.num_free_blocks == 5
    assert kv.usage == 0.5
    assert kv.num_held_tokens_capacity() == 20


@pytest.mark.parametrize("computed,new", [(0, 1), (0, 16), (3, 13), (15, 1), (16, 1), (17, 40)])
def test_allocate_slots_holds_exactly_ceil(computed, new):
    kv = KVCacheManager(num_blocks=64, block_size=4)
    req = make_req()
    if computed:
        assert kv.allocate_slots(req, computed) is not None
        req.num_computed_tokens = computed
    assert kv.allocate_slots(req, new) is not None
    assert len(kv.block_ids("r")) == cdiv(computed + new, 4)
    assert kv.pool.num_used_blocks == cdiv(computed + new, 4)


def test_allocate_slots_returns_none_and_changes_nothing_when_short():
    kv = KVCacheManager(num_blocks=3, block_size=4)
    a, b = make_req("a"), make_req("b")
    assert kv.allocate_slots(a, 4) == [0]
    queue_before = list(kv.pool._free)
    assert kv.allocate_slots(b, 9) is None  # needs 3, 2 free
    assert kv.num_free_blocks == 2
    assert list(kv.pool._free) == queue_before
    assert "b" not in kv.req_to_blocks
    assert kv.block_ids("b") == []
    # A request that already holds blocks keeps exactly those.
    a.num_computed_tokens = 4
    assert kv.allocate_slots(a, 9) is None  # 13 tokens: 4 blocks, 1 held, 3 needed, 2 free
    assert kv.block_ids("a") == [0]
    assert kv.num_free_blocks == 2
    # Exactly what is free succeeds and empties the pool.
    assert kv.allocate_slots(a, 8) == [1, 2]
    assert kv.num_free_blocks == 0
    assert kv.allocate_slots(a, 0) == []
    assert kv.allocate_slots(b, 1) is None


def test_free_returns_all_blocks_tail_first():
    kv = KVCacheManager(num_blocks=4, block_size=2)
    a, b = make_req("a"), make_req("b")
    assert kv.allocate_slots(a, 5) == [0, 1, 2]
    assert kv.allocate_slots(b, 1) == [3]
    kv.free(a)
    assert kv.num_free_blocks == 3
    assert "a" not in kv.req_to_blocks
    assert kv.block_ids("a") == []
    assert kv.block_ids("b") == [3]
    # The tail block went back first, so it is the first to be reused (evicted).
    assert list(kv.pool._free) == [2, 1, 0]
    assert all(kv.pool.blocks[i].ref_cnt == 0 for i in (0, 1, 2))
    kv.free(a)  # freeing again is a no-op
    kv.free(make_req("never-seen"))
    assert kv.num_free_blocks == 3
    kv.free(b)
    assert kv.num_free_blocks == 4
    assert kv.req_to_blocks == {}
    c = make_req("c")
    assert kv.allocate_slots(c, 8) == [2, 1, 0, 3]
    assert kv.block_ids("c") == [2, 1, 0, 3]


def test_block_ids_are_append_only_in_allocation_order():
    kv = KVCacheManager(num_blocks=8, block_size=1)
    a, b = make_req("a"), make_req("b")
    kv.allocate_slots(a, 2)
    kv.allocate_slots(b, 1)
    a.num_computed_tokens = 2
    kv.allocate_slots(a, 1)
    b.num_computed_tokens = 1
    kv.allocate_slots(b, 2)
    assert kv.block_ids("a") == [0, 1, 3]
    assert kv.block_ids("b") == [2, 4, 5]
    assert set(kv.block_ids("a")).isdisjoint(kv.block_ids("b"))
    assert sum(len(v) for v in kv.req_to_blocks.values()) == kv.pool.num_used_blocks
