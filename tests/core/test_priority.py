"""Priority scheduling: lower value first, FCFS within a priority, and a higher-priority
arrival preempts lower-priority running requests when the batch or the pool is full."""

from __future__ import annotations

from octavo.config import CacheConfig, SchedulerConfig
from octavo.core.request import Request
from octavo.core.scheduler import Scheduler
from octavo.sampling_params import SamplingParams
from tests.core.helpers import step


def make(num_blocks=64, max_num_seqs=4, policy="priority"):
    return Scheduler(SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=64,
                                     max_model_len=64, policy=policy),
                     CacheConfig(block_size=4, enable_prefix_caching=False), num_blocks)


_t = iter(range(10**6))


def req(rid, prio, n_prompt=4, max_tokens=8):
    return Request(rid, [rid_hash(rid) + i for i in range(n_prompt)],
                   SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                   arrival_time=float(next(_t)), priority=prio)


def rid_hash(rid: str) -> int:
    return 10 + 50 * (sum(map(ord, rid)) % 20)


def test_waiting_order_is_priority_then_arrival():
    sched = make(max_num_seqs=1)
    for rid, prio in (("a", 5), ("b", 1), ("c", 5), ("d", 1)):
        sched.add_request(req(rid, prio))
    assert [r.request_id for r in sched.waiting] == ["b", "d", "a", "c"]


def test_high_priority_arrival_preempts_into_a_full_batch():
    sched = make(max_num_seqs=2)
    sched.add_request(req("low1", 10, max_tokens=30))
    sched.add_request(req("low2", 10, max_tokens=30))
    step(sched)
    step(sched)
    sched.add_request(req("vip", 0, max_tokens=3))
    out, _ = step(sched)
    assert "vip" in out.num_scheduled_tokens
    assert out.preempted_req_ids == {"low2"}  # the latest low-priority arrival
    finished_order = []
    while sched.has_unfinished_requests():
        _, fin = step(sched)
        finished_order += [r.request_id for r in fin]
    assert finished_order[0] == "vip"  # first token and completion before the low ones
    assert sched.kv.pool.num_free_blocks == sched.kv.pool.num_blocks


def test_high_priority_arrival_preempts_when_the_pool_is_dry():
    sched = make(num_blocks=6, max_num_seqs=8)
    sched.add_request(req("low", 5, n_prompt=16, max_tokens=8))  # 4 blocks, growing
    step(sched)
    sched.add_request(req("vip", 0, n_prompt=12, max_tokens=2))  # needs 3 blocks
    out, _ = step(sched)
    assert "vip" in out.num_scheduled_tokens and "low" in out.preempted_req_ids
    while sched.has_unfinished_requests():
        step(sched)
    assert sched.kv.pool.num_free_blocks == 6


def test_equal_priority_does_not_preempt():
    sched = make(max_num_seqs=1)
    sched.add_request(req("first", 3, max_tokens=4))
    step(sched)
    sched.add_request(req("second", 3, max_tokens=4))
    out, _ = step(sched)
    assert list(out.num_scheduled_tokens) == ["first"] and not out.preempted_req_ids


def test_fcfs_ignores_priorities():
    sched = make(max_num_seqs=1, policy="fcfs")
    sched.add_request(req("a", 9))
    sched.add_request(req("b", 0))
    assert [r.request_id for r in sched.waiting] == ["a", "b"]
