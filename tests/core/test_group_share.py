"""One request's samples (a huge n / best_of) cannot starve the others: while other
requests wait, a group holds at most half the batch; a group already over that share gives
up its latest sample when the batch is full and another request arrives."""

from __future__ import annotations

from octavo.config import CacheConfig, SchedulerConfig
from octavo.core.request import Request
from octavo.core.scheduler import Scheduler
from octavo.sampling_params import SamplingParams
from tests.core.helpers import step


def make(max_num_seqs=8, policy="fcfs", num_blocks=256):
    return Scheduler(SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=256,
                                     max_model_len=64, policy=policy),
                     CacheConfig(block_size=4, enable_prefix_caching=False), num_blocks)


_t = iter(range(10**6))


def req(rid, group=None, max_tokens=20, prio=0):
    r = Request(rid, [11, 12, 13, 14 + len(rid)], SamplingParams(max_tokens=max_tokens,
                                                               ignore_eos=True),
                arrival_time=float(next(_t)), priority=prio)
    r.group_id = group or rid
    return r


def running_groups(sched):
    groups = {}
    for r in sched.running:
        groups[r.group_id] = groups.get(r.group_id, 0) + 1
    return groups


def test_a_lone_group_fills_the_batch():
    sched = make()
    for i in range(20):
        sched.add_request(req(f"big#{i}", "big"))
    step(sched)
    assert running_groups(sched) == {"big": 8}  # nobody else waits: no share applies


def test_newcomer_is_admitted_next_step_into_a_batch_one_group_fills():
    sched = make()
    for i in range(20):
        sched.add_request(req(f"big#{i}", "big"))
    step(sched)
    sched.add_request(req("small", max_tokens=1))
    out, _ = step(sched)
    assert "small" in out.num_scheduled_tokens  # a big sample was preempted for it
    assert "small" not in sched.requests  # one token: done already
    assert running_groups(sched) == {"big": 7}


def test_group_is_trimmed_to_half_while_others_wait():
    sched = make()
    for i in range(20):
        sched.add_request(req(f"big#{i}", "big"))
    step(sched)
    for j in range(6):
        sched.add_request(req(f"s{j}", max_tokens=50))
    for _ in range(6):
        step(sched)
    groups = running_groups(sched)
    assert groups["big"] == 4  # half of max_num_seqs, no lower
    assert sum(v for k, v in groups.items() if k != "big") == 4


def test_waiting_requests_of_other_groups_go_ahead_of_an_over_share_group():
    sched = make()
    for i in range(4):
        sched.add_request(req(f"big#{i}", "big", max_tokens=2))
    step(sched)  # 4 running = the share
    for i in range(4, 10):
        sched.add_request(req(f"big#{i}", "big"))
    sched.add_request(req("late"))
    step(sched)
    assert "late" in {r.request_id for r in sched.running}
    assert running_groups(sched)["big"] <= 7


def test_priority_levels_are_kept():
    sched = make(policy="priority", max_num_seqs=4)
    for i in range(6):
        sched.add_request(req(f"big#{i}", "big", prio=0))
    sched.add_request(req("low", prio=5))
    step(sched)
    # Only the share goes to the big group; the low-priority request may take the rest but
    # is never placed ahead of same-or-better priority requests in the queue.
    order = [r.priority for r in sched.waiting]
    assert order == sorted(order)
