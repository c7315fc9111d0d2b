"""Automatic prefix caching in the block pool, KV manager and scheduler (torch-free)."""

from __future__ import annotations

import random

import pytest

from octavo.config import CacheConfig, SchedulerConfig
from octavo.core.block_pool import BlockPool
from octavo.core.prefix_hash import ROOT_HASH, hash_block, hash_full_blocks
from octavo.core.request import Request
from octavo.core.scheduler import Scheduler
from octavo.core.scheduler_output import ModelRunnerOutput
from octavo.sampling_params import SamplingParams
from tests.core.helpers import step

BS = 4


def make_sched(num_blocks=64, caching=True, max_num_batched_tokens=64, max_model_len=64):
    return Scheduler(SchedulerConfig(max_num_seqs=16,
                                     max_num_batched_tokens=max_num_batched_tokens,
                                     max_model_len=max_model_len),
                     CacheConfig(block_size=BS, enable_prefix_caching=caching), num_blocks)


def req(rid, prompt, max_tokens=4):
    return Request(rid, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))


def run(sched):
    while sched.has_unfinished_requests():
        step(sched)


def check_refcounts(sched):
    pool = sched.kv.pool
    holders: dict[int, int] = {}
    for blocks in sched.kv.req_to_blocks.values():
        for b in blocks:
            holders[b.block_id] = holders.get(b.block_id, 0) + 1
    for b in pool.blocks:
        assert b.ref_cnt == holders.get(b.block_id, 0), b
    assert pool.num_free_blocks == sum(1 for b in pool.blocks if b.ref_cnt == 0)


def test_chained_hash_depends_on_the_whole_prefix():
    a = hash_full_blocks([1, 2, 3, 4, 5, 6, 7, 8], 4)
    b = hash_full_blocks([9, 2, 3, 4, 5, 6, 7, 8], 4)
    assert len(a) == 2 and a[0] != b[0] and a[1] != b[1]
    assert a[0] == hash_block(ROOT_HASH, [1, 2, 3, 4])
    assert hash_full_blocks([1, 2, 3], 4) == []


def test_second_request_reuses_the_cached_prefix():
    sched = make_sched()
    prompt = list(range(100, 140))  # 40 tokens = 10 blocks
    sched.add_request(req("a", prompt))
    run(sched)
    sched.add_request(req("b", prompt + [1, 2]))
    out = sched.schedule()
    b = sched.requests["b"]
    # 42 tokens: the 10 full prompt blocks are cached; 2 tokens are left to compute.
    assert b.num_cached_tokens == 40 and out.num_scheduled_tokens["b"] == 2
    assert out.new_reqs[0].num_computed_tokens == 40
    assert sched.kv.prefix_hits == 40 and sched.kv.prefix_queries == 40 + 42
    sched.update_from_output(out, ModelRunnerOutput(["b"], [7]))
    run(sched)
    check_refcounts(sched)
    assert sched.kv.pool.num_free_blocks == sched.kv.pool.num_blocks


def test_last_token_is_always_computed():
    sched = make_sched()
    prompt = list(range(16))  # exactly 4 blocks
    sched.add_request(req("a", prompt))
    run(sched)
    sched.add_request(req("b", prompt))
    out = sched.schedule()
    assert out.num_scheduled_tokens["b"] == 4  # 3 blocks hit, the last block recomputed
    sched.update_from_output(out, ModelRunnerOutput(["b"], [7]))
    run(sched)


def test_running_requests_share_blocks_by_reference():
    sched = make_sched()
    prompt = list(range(200, 224))
    sched.add_request(req("a", prompt, max_tokens=20))
    step(sched)  # a's prompt computed and cached
    sched.add_request(req("b", prompt + [5], max_tokens=20))
    step(sched)
    shared = sched.kv.req_to_blocks["a"][:6]
    assert sched.kv.req_to_blocks["b"][:6] == shared
    assert all(blk.ref_cnt == 2 for blk in shared)
    check_refcounts(sched)
    run(sched)
    check_refcounts(sched)


def test_caching_off_gives_no_hits():
    sched = make_sched(caching=False)
    prompt = list(range(40))
    for rid in ("a", "b"):
        sched.add_request(req(rid, prompt))
        run(sched)
    assert sched.kv.prefix_hits == 0 and sched.requests == {}


def test_lru_eviction_of_free_cached_blocks():
    pool = BlockPool(4)
    blocks = pool.allocate(4)
    for i, blk in enumerate(blocks):
        pool.cache_block(blk, 1000 + i)
    pool.free([blocks[2], blocks[0], blocks[1], blocks[3]])  # freed order = LRU order
    assert pool.lookup(1000) is blocks[0]
    taken = pool.allocate(2)
    assert taken == [blocks[2], blocks[0]]
    assert pool.lookup(1002) is None and pool.lookup(1000) is None
    assert pool.lookup(1001) is blocks[1] and pool.num_evictions == 2
    pool.incref([blocks[1]])  # a hit on a free cached block takes it out of the free queue
    assert pool.num_free_blocks == 1


def test_preempted_request_resumes_from_its_cached_blocks():
    sched = make_sched(num_blocks=12, max_model_len=40)
    sched.add_request(req("a", list(range(300, 320)), max_tokens=16))
    sched.add_request(req("b", list(range(400, 420)), max_tokens=16))
    preempted = False
    while sched.has_unfinished_requests():
        step(sched)
        check_refcounts(sched)
        preempted |= sched.num_preemptions > 0
    assert preempted
    assert sched.kv.prefix_hits > 0  # the resumed request found its own blocks
    assert sched.kv.pool.num_free_blocks == 12


@pytest.mark.parametrize("seed", range(3))
def test_random_stress_with_shared_prefixes(seed):
    rng = random.Random(seed)
    sched = make_sched(num_blocks=40, max_model_len=48, max_num_batched_tokens=32)
    prefixes = [[rng.randrange(1000) for _ in range(rng.randrange(4, 20))] for _ in range(3)]
    for i in range(30):
        prompt = rng.choice(prefixes) + [rng.randrange(1000) for _ in range(rng.randrange(1, 8))]
        sched.add_request(req(f"r{i}", prompt, max_tokens=rng.randrange(1, 12)))
    steps = 0
    while sched.has_unfinished_requests():
        out, _ = step(sched)
        assert out.total_num_scheduled_tokens <= 32
        check_refcounts(sched)
        if rng.random() < 0.05 and sched.running:
            sched.finish_requests([rng.choice(sched.running).request_id],
                                  type(sched.running[0].status).FINISHED_ABORTED)
        steps += 1
        assert steps < 10_000
    assert sched.kv.prefix_hits > 0
    assert sched.kv.pool.num_free_blocks == 40


def test_simultaneous_arrivals_wait_for_the_shared_prefix():
    """Requests arriving together with one prefix: the first computes it, the rest wait one
    step and read it from the cache instead of computing it again in parallel."""
    sched = make_sched()
    prefix = list(range(500, 532))  # 8 blocks
    for i in range(3):
        sched.add_request(req(f"r{i}", prefix + [i, i + 1]))
    first, _ = step(sched)
    assert list(first.num_scheduled_tokens) == ["r0"]
    second, _ = step(sched)
    assert second.num_scheduled_tokens == {"r0": 1, "r1": 2, "r2": 2}
    assert sched.requests["r1"].num_cached_tokens == 32
    run(sched)
    assert sched.kv.pool.num_free_blocks == sched.kv.pool.num_blocks


def test_reset_prefix_cache_forgets_every_prefix_only_when_idle():
    """reset_prefix_cache (vLLM's name): refused while a request holds blocks (nothing
    changes), then every cached prefix is forgotten and the same prompt computes again."""
    sched = make_sched()
    prompt = list(range(100, 140))  # 10 full blocks
    sched.add_request(req("a", prompt))
    step(sched)  # "a" holds blocks now
    assert sched.kv.pool.cached
    assert sched.reset_prefix_cache() is False and sched.kv.pool.cached
    run(sched)
    assert sched.reset_prefix_cache() is True
    pool = sched.kv.pool
    assert not pool.cached and all(b.block_hash is None for b in pool.blocks)
    sched.add_request(req("b", prompt))
    out = sched.schedule()
    assert sched.requests["b"].num_cached_tokens == 0 and out.num_scheduled_tokens["b"] == 40
    sched.update_from_output(out, ModelRunnerOutput(["b"], [7]))
    run(sched)
    check_refcounts(sched)
    # "b" filled the cache again: the next request with the prompt hits it.
    sched.add_request(req("c", prompt))
    sched.schedule()
    assert sched.requests["c"].num_cached_tokens == 36  # the last block computes its logits
