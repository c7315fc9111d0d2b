"""Scheduler: continuous batching over a fake block pool with a fake model runner
(``tests/core/fake_worker.py``: it checks its mirror of every request against the scheduler
each step). Pure Python, no torch."""

from __future__ import annotations

import random

import pytest

from octavo.core.kv_cache_manager import cdiv
from octavo.core.request import Request, RequestStatus
from octavo.core.scheduler import Scheduler
from octavo.core.scheduler_output import ModelRunnerOutput
from tests.core.fake_worker import (
    EOS,
    TOKEN,
    FakeWorker,
    assert_all_free,
    make_req,
    make_sched,
    run_all,
    step,
)

# --------------------------------------------------------------------------- add_request


def test_duplicate_request_id_raises():
    sched = make_sched()
    sched.add_request(make_req("a", 4))
    with pytest.raises(ValueError, match="request_id 'a' is already in use"):
        sched.add_request(make_req("a", 4))
    assert len(sched.waiting) == 1
    sched.finish_requests(["a"], RequestStatus.FINISHED_ABORTED)
    assert_all_free(sched)


def test_prompt_longer_than_max_model_len_raises():
    sched = make_sched(max_model_len=32)
    with pytest.raises(ValueError, match="has 33 tokens, more than max_model_len=32"):
        sched.add_request(make_req("a", 33))
    assert not sched.has_unfinished_requests()
    assert sched.requests == {}


def test_prompt_of_exactly_max_model_len_gets_one_token():
    sched = make_sched(max_model_len=32)
    req = make_req("a", 32, max_tokens=10)
    sched.add_request(req)
    run_all(sched)
    assert req.output_token_ids == [TOKEN]
    assert req.status == RequestStatus.FINISHED_LENGTH_CAPPED


def test_empty_schedule():
    sched = make_sched()
    out = sched.schedule()
    assert out.is_empty
    assert out.num_scheduled_tokens == {} and out.new_reqs == [] and out.cached_reqs == []
    new_tokens, finished = sched.update_from_output(out, ModelRunnerOutput([], []))
    assert new_tokens == [] and finished == []


# --------------------------------------------------------------------------- budgets


def test_token_budget_respected_every_step():
    budget = 16
    sched = make_sched(max_num_batched_tokens=budget)
    reqs = [make_req(f"r{i}", 10, max_tokens=5) for i in range(5)]
    for r in reqs:
        sched.add_request(r)
    outs = run_all(sched, check=lambda o: None)
    assert all(o.total_num_scheduled_tokens <= budget for o in outs)
    # Step 1: r0 whole (10), r1 a chunk of 6; step 2: r0 decode, r1 rest (4), r2 chunk (11).
    assert outs[0].num_scheduled_tokens == {"r0": 10, "r1": 6}
    assert outs[1].num_scheduled_tokens == {"r0": 1, "r1": 4, "r2": 10, "r3": 1}
    assert sum(o.total_num_scheduled_tokens for o in outs) == 5 * 10 + 5 * 4
    assert all(r.output_token_ids == [TOKEN] * 5 for r in reqs)


def test_max_num_seqs_respected():
    sched = make_sched(max_num_seqs=2)
    reqs = [make_req(f"r{i}", 3, max_tokens=3) for i in range(5)]
    for r in reqs:
        sched.add_request(r)
    outs = run_all(sched, check=lambda o: None)
    for o in outs:
        assert len(o.num_scheduled_tokens) <= 2
    assert list(outs[0].num_scheduled_tokens) == ["r0", "r1"]
    # r0 and r1 finish at step 3; r2 and r3 start at step 4.
    assert list(outs[3].num_scheduled_tokens) == ["r2", "r3"]
    assert [n.req_id for n in outs[3].new_reqs] == ["r2", "r3"]
    assert outs[3].finished_req_ids == {"r0", "r1"}
    assert len(outs) == 9
    assert all(r.num_output_tokens == 3 for r in reqs)


def test_chunked_prefill_samples_only_at_the_last_chunk():
    sched = make_sched(max_num_batched_tokens=16, block_size=4, max_model_len=128)
    req = make_req("a", 50, max_tokens=3)
    sched.add_request(req)
    worker = FakeWorker(sched)
    expected = [(16, 16), (16, 32), (16, 48), (2, 50)]
    for i, (n, computed) in enumerate(expected):
        out, runner_out, new_tokens, finished = step(sched, worker)
        assert out.num_scheduled_tokens == {"a": n}
        assert req.num_computed_tokens == computed
        if i == 0:
            assert [r.req_id for r in out.new_reqs] == ["a"]
            assert out.new_reqs[0].block_ids == [0, 1, 2, 3]
            assert out.new_reqs[0].num_computed_tokens == 0
        else:
            assert out.new_reqs == []
            assert out.cached_reqs[0].num_computed_tokens == computed - n
            assert len(out.cached_reqs[0].new_block_ids) == cdiv(computed, 4) - cdiv(computed - n, 4)
        if i < 3:
            assert runner_out.req_ids == [] and new_tokens == []
            assert req.num_output_tokens == 0
        else:
            assert runner_out.req_ids == ["a"]
            assert new_tokens == [(req, TOKEN)]
    # Decode: one token a step.
    out, *_ = step(sched, worker)
    assert out.num_scheduled_tokens == {"a": 1}
    out, _, _, finished = step(sched, worker)
    assert finished == [req]
    assert req.output_token_ids == [TOKEN] * 3
    assert_all_free(sched)


def test_without_chunked_prefill_a_prompt_waits_for_a_whole_budget():
    sched = make_sched(max_num_batched_tokens=32, max_model_len=32,
                       enable_chunked_prefill=False)
    a, b = make_req("a", 20, max_tokens=2), make_req("b", 20, max_tokens=2)
    sched.add_request(a)
    sched.add_request(b)
    outs = run_all(sched)
    assert outs[0].num_scheduled_tokens == {"a": 20}
    assert outs[1].num_scheduled_tokens == {"a": 1, "b": 20}
    assert outs[2].num_scheduled_tokens == {"b": 1}
    assert len(outs) == 3


def test_fcfs_order_and_no_skipping():
    sched = make_sched(max_num_batched_tokens=8, max_model_len=64)
    reqs = [make_req("big", 20, max_tokens=1), make_req("small", 2, max_tokens=1),
            make_req("tiny", 1, max_tokens=1)]
    for r in reqs:
        sched.add_request(r)
    outs = run_all(sched)
    # The small ones never overtake the head of the queue.
    assert outs[0].num_scheduled_tokens == {"big": 8}
    assert outs[1].num_scheduled_tokens == {"big": 8}
    assert outs[2].num_scheduled_tokens == {"big": 4, "small": 2, "tiny": 1}
    assert list(outs[2].num_scheduled_tokens) == ["big", "small", "tiny"]


def test_running_requests_are_scheduled_before_waiting_ones():
    sched = make_sched(max_num_batched_tokens=10)
    sched.add_request(make_req("a", 9, max_tokens=5))
    worker = FakeWorker(sched)
    step(sched, worker)
    sched.add_request(make_req("b", 30, max_tokens=1))
    out, *_ = step(sched, worker)
    assert list(out.num_scheduled_tokens.items()) == [("a", 1), ("b", 9)]


def test_decode_schedules_one_token_per_running_request():
    sched = make_sched(block_size=4)
    reqs = [make_req(f"r{i}", 3 + i, max_tokens=8) for i in range(3)]
    for r in reqs:
        sched.add_request(r)
    worker = FakeWorker(sched)
    out, *_ = step(sched, worker)
    assert out.num_scheduled_tokens == {"r0": 3, "r1": 4, "r2": 5}
    for _ in range(7):
        before = {r.request_id: len(sched.kv.block_ids(r.request_id)) for r in reqs}
        computed = {r.request_id: r.num_computed_tokens for r in reqs}
        out, runner_out, new_tokens, _ = step(sched, worker)
        assert out.num_scheduled_tokens == {"r0": 1, "r1": 1, "r2": 1}
        assert out.new_reqs == []
        assert runner_out.req_ids == ["r0", "r1", "r2"]
        for c in out.cached_reqs:
            # A new block exactly when the token starts a block.
            crosses = computed[c.req_id] % 4 == 0
            assert len(c.new_block_ids) == (1 if crosses else 0)
            if c.req_id in sched.requests:  # finished ones gave their blocks back
                assert len(sched.kv.block_ids(c.req_id)) == before[c.req_id] + crosses
    assert not sched.has_unfinished_requests()
    assert_all_free(sched)


# --------------------------------------------------------------------------- preemption


def test_preemption_by_recompute():
    # 3 requests of one block each, 4 blocks: the 2nd step needs 3 more blocks.
    sched = make_sched(num_blocks=4, block_size=4, max_num_seqs=3)
    a, b, c = (make_req(x, 4, max_tokens=3, ignore_eos=True) for x in "abc")
    d = make_req("d", 4, max_tokens=1)
    for r in (a, b, c, d):
        sched.add_request(r)
    worker = FakeWorker(sched)
    out, *_ = step(sched, worker)
    assert out.num_scheduled_tokens == {"a": 4, "b": 4, "c": 4}
    assert sched.kv.num_free_blocks == 1
    c_blocks = sched.kv.block_ids("c")

    out, runner_out, _, _ = step(sched, worker)
    # a takes the free block; b needs one: c (the latest arrival) is preempted.
    assert out.num_scheduled_tokens == {"a": 1, "b": 1}
    assert out.finished_req_ids == {"c"}
    assert out.preempted_req_ids == {"c"}
    assert sched.kv.block_ids("b")[-1] == c_blocks[0]
    assert c.status == RequestStatus.PREEMPTED
    assert c.num_computed_tokens == 0
    assert c.num_preemptions == 1 and sched.num_preemptions == 1
    assert "c" not in sched.kv.req_to_blocks
    assert list(sched.waiting) == [c, d]  # head of the queue, ahead of later arrivals
    assert [r.request_id for r in sched.running] == ["a", "b"]
    assert c.output_token_ids == [TOKEN]  # kept across the preemption
    assert sched.kv.num_free_blocks == 0

    out, *_ = step(sched, worker)  # a and b finish (3 tokens each)
    assert out.num_scheduled_tokens == {"a": 1, "b": 1}
    assert out.preempted_req_ids == set()
    assert a.is_finished and b.is_finished

    out, *_ = step(sched, worker)
    # c comes back as a new request carrying its generated token, then d.
    assert out.finished_req_ids == {"a", "b"}
    assert [n.req_id for n in out.new_reqs] == ["c", "d"]
    new_c = out.new_reqs[0]
    assert new_c.token_ids == c.prompt_token_ids + [TOKEN]
    assert new_c.num_prompt_tokens == 4
    assert new_c.num_computed_tokens == 0
    assert len(new_c.block_ids) == 2
    assert out.num_scheduled_tokens == {"c": 5, "d": 4}
    assert c.output_token_ids == [TOKEN, TOKEN]
    run_all(sched, worker)
    assert c.output_token_ids == [TOKEN] * 3
    assert c.status == RequestStatus.FINISHED_LENGTH_CAPPED


def test_a_request_preempts_itself_when_it_is_the_latest():
    sched = make_sched(num_blocks=3, block_size=4)
    a = make_req("a", 4, max_tokens=3, ignore_eos=True)
    b = make_req("b", 4, max_tokens=3, ignore_eos=True)
    sched.add_request(a)
    sched.add_request(b)
    worker = FakeWorker(sched)
    step(sched, worker)
    out, *_ = step(sched, worker)
    assert out.num_scheduled_tokens == {"a": 1}
    assert out.finished_req_ids == {"b"}
    assert b.status == RequestStatus.PREEMPTED
    assert list(sched.waiting) == [b]
    outs = run_all(sched, worker)
    resumed = [n for o in outs for n in o.new_reqs if n.req_id == "b"]
    assert len(resumed) == 1 and resumed[0].token_ids == b.prompt_token_ids + [TOKEN]
    assert a.output_token_ids == b.output_token_ids == [TOKEN] * 3


def test_no_waiting_request_is_admitted_in_a_step_that_preempted():
    sched = make_sched(num_blocks=4, block_size=2, max_num_seqs=8)
    a = make_req("a", 2, max_tokens=6, ignore_eos=True)
    b = make_req("b", 2, max_tokens=6, ignore_eos=True)
    sched.add_request(a)
    sched.add_request(b)
    worker = FakeWorker(sched)
    step(sched, worker)  # 2 blocks used
    step(sched, worker)  # each grows to 2 blocks (3 tokens): pool full
    step(sched, worker)  # 4 tokens each, still 2 blocks
    assert sched.kv.num_free_blocks == 0
    sched.add_request(make_req("tiny", 1, max_tokens=1))
    out, *_ = step(sched, worker)  # a: 5 tokens -> 3 blocks: preempts b
    assert out.preempted_req_ids == {"b"}
    assert out.num_scheduled_tokens == {"a": 1}
    assert sched.kv.num_free_blocks == 1  # room for tiny, yet it waits a step
    assert [r.request_id for r in sched.waiting] == ["b", "tiny"]
    run_all(sched, worker)


# --------------------------------------------------------------------------- stopping


def _run_one(req: Request, token_fn=None, **sched_kwargs) -> Request:
    sched = make_sched(**sched_kwargs)
    sched.add_request(req)
    run_all(sched, FakeWorker(sched, token_fn))
    return req


def test_stop_on_eos():
    req = _run_one(make_req("a", 5, max_tokens=10, eos=frozenset({TOKEN})))
    assert req.output_token_ids == [TOKEN]
    assert req.status == RequestStatus.FINISHED_STOPPED
    assert req.status.finish_reason == "stop"
    assert req.stop_reason is None


def test_eos_later_in_the_output():
    seq = iter([5, 6, EOS, 9])
    req = _run_one(make_req("a", 5, max_tokens=10), token_fn=lambda r: next(seq))
    assert req.output_token_ids == [5, 6, EOS]
    assert req.status == RequestStatus.FINISHED_STOPPED


def test_ignore_eos():
    req = _run_one(make_req("a", 5, max_tokens=6, eos=frozenset({TOKEN}), ignore_eos=True))
    assert req.output_token_ids == [TOKEN] * 6
    assert req.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert req.status.finish_reason == "length"


def test_stop_token_ids():
    req = _run_one(make_req("a", 5, max_tokens=10, stop_token_ids=[3, TOKEN]))
    assert req.output_token_ids == [TOKEN]
    assert req.status == RequestStatus.FINISHED_STOPPED
    assert req.stop_reason == TOKEN


def test_stop_token_ids_apply_even_with_ignore_eos():
    req = _run_one(make_req("a", 5, max_tokens=10, stop_token_ids=[TOKEN], ignore_eos=True))
    assert req.output_token_ids == [TOKEN]
    assert req.status == RequestStatus.FINISHED_STOPPED
    assert req.stop_reason == TOKEN


def test_max_tokens():
    req = _run_one(make_req("a", 5, max_tokens=3))
    assert req.output_token_ids == [TOKEN] * 3
    assert req.status == RequestStatus.FINISHED_LENGTH_CAPPED


def test_max_tokens_none_runs_to_max_model_len():
    req = _run_one(make_req("a", 5, max_tokens=None), max_model_len=12)
    assert req.num_output_tokens == 7
    assert req.num_tokens == 12
    assert req.status == RequestStatus.FINISHED_LENGTH_CAPPED


def test_max_model_len():
    req = _run_one(make_req("a", 12, max_tokens=100), max_model_len=16)
    assert req.output_token_ids == [TOKEN] * 4
    assert req.num_tokens == 16
    assert req.status == RequestStatus.FINISHED_LENGTH_CAPPED


def test_min_tokens_delays_eos():
    req = _run_one(make_req("a", 5, max_tokens=10, min_tokens=3, eos=frozenset({TOKEN})))
    assert req.output_token_ids == [TOKEN] * 3
    assert req.status == RequestStatus.FINISHED_STOPPED


def test_min_tokens_delays_stop_token_ids():
    req = _run_one(make_req("a", 5, max_tokens=10, min_tokens=4, stop_token_ids=[TOKEN]))
    assert req.output_token_ids == [TOKEN] * 4
    assert req.status == RequestStatus.FINISHED_STOPPED
    assert req.stop_reason == TOKEN


def test_min_tokens_equal_to_max_tokens():
    req = _run_one(make_req("a", 5, max_tokens=3, min_tokens=3, eos=frozenset({TOKEN})))
    assert req.num_output_tokens == 3


def test_finished_requests_are_reported_to_the_worker_next_step():
    sched = make_sched()
    sched.add_request(make_req("a", 4, max_tokens=1))
    sched.add_request(make_req("b", 4, max_tokens=3))
    worker = FakeWorker(sched)
    _, _, new_tokens, finished = step(sched, worker)
    assert [r.request_id for r in finished] == ["a"]
    assert [(r.request_id, t) for r, t in new_tokens] == [("a", TOKEN), ("b", TOKEN)]
    assert "a" not in sched.requests
    assert sched.kv.block_ids("a") == []
    out, *_ = step(sched, worker)
    assert out.finished_req_ids == {"a"}
    assert "a" not in worker.states
    run_all(sched, worker)


# --------------------------------------------------------------------------- aborts


def test_abort_waiting_and_running_frees_blocks_now():
    sched = make_sched(max_num_seqs=2, max_num_batched_tokens=8)
    a, b, c = make_req("a", 4, max_tokens=5), make_req("b", 12, max_tokens=5), \
        make_req("c", 4, max_tokens=5)
    for r in (a, b, c):
        sched.add_request(r)
    worker = FakeWorker(sched)
    step(sched, worker)  # a whole, b's first chunk of 4; c waits (max_num_seqs)
    assert sched.kv.block_ids("b") == [1]
    used = sched.kv.pool.num_used_blocks
    sched.finish_requests(["b", "c"], RequestStatus.FINISHED_ABORTED)
    assert sched.kv.pool.num_used_blocks == used - 1
    assert b.status == c.status == RequestStatus.FINISHED_ABORTED
    assert b.status.finish_reason == "abort"
    assert [r.request_id for r in sched.running] == ["a"]
    assert not sched.waiting
    assert "b" not in sched.requests and "c" not in sched.requests
    sched.finish_requests(["b", "nope"], RequestStatus.FINISHED_ABORTED)  # no-ops
    out, *_ = step(sched, worker)
    assert out.finished_req_ids == {"b", "c"}
    assert list(out.num_scheduled_tokens) == ["a"]
    sched.finish_requests(["a"], RequestStatus.FINISHED_ABORTED)
    assert_all_free(sched)
    assert a.num_output_tokens == 2


def test_abort_a_preempted_request():
    sched = make_sched(num_blocks=3, block_size=4)
    a = make_req("a", 4, max_tokens=3, ignore_eos=True)
    b = make_req("b", 4, max_tokens=3, ignore_eos=True)
    sched.add_request(a)
    sched.add_request(b)
    worker = FakeWorker(sched)
    step(sched, worker)
    step(sched, worker)
    assert b.status == RequestStatus.PREEMPTED
    sched.finish_requests(["b"], RequestStatus.FINISHED_ABORTED)
    assert b.status == RequestStatus.FINISHED_ABORTED
    run_all(sched, worker)
    assert a.num_output_tokens == 3


def test_abort_between_schedule_and_update():
    sched = make_sched()
    a, b = make_req("a", 4, max_tokens=3), make_req("b", 4, max_tokens=3)
    sched.add_request(a)
    sched.add_request(b)
    worker = FakeWorker(sched)
    out = sched.schedule()
    runner_out = worker.execute(out)
    sched.finish_requests(["a"], RequestStatus.FINISHED_ABORTED)
    new_tokens, finished = sched.update_from_output(out, runner_out)
    assert [r.request_id for r, _ in new_tokens] == ["b"]
    assert finished == []
    assert a.output_token_ids == []
    run_all(sched, worker)
    assert b.num_output_tokens == 3


# --------------------------------------------------------------------------- stress


def _check_invariants(sched: Scheduler, budget: int, max_num_seqs: int) -> None:
    kv, pool, bs = sched.kv, sched.kv.pool, sched.kv.block_size
    held = [b for blocks in kv.req_to_blocks.values() for b in blocks]
    assert len(held) == pool.num_used_blocks
    assert len({b.block_id for b in held}) == len(held)
    assert all(b.ref_cnt == 1 for b in held)
    assert len(sched.running) <= max_num_seqs
    running_ids = {r.request_id for r in sched.running}
    assert set(kv.req_to_blocks) <= running_ids
    for r in sched.running:
        assert r.status == RequestStatus.RUNNING
        assert len(kv.block_ids(r.request_id)) == cdiv(r.num_computed_tokens, bs)
        assert r.num_computed_tokens < r.num_tokens  # a prefill chunk or one decode left
    for r in sched.waiting:
        assert r.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
        assert r.num_computed_tokens == 0
    everyone = [*sched.running, *sched.waiting]
    assert {r.request_id for r in everyone} == set(sched.requests)
    # Strict FCFS: running then waiting is in arrival order.
    times = [r.arrival_time for r in everyone]
    assert times == sorted(times)


@pytest.mark.parametrize("seed", range(4))
def test_random_stress(seed):
    rng = random.Random(seed)
    block_size, max_model_len = 4, 64
    budget, max_num_seqs = rng.choice([8, 16, 32]), rng.choice([3, 8, 64])
    num_blocks = max_model_len // block_size + rng.randint(0, 8)
    sched = make_sched(num_blocks=num_blocks, block_size=block_size, max_num_seqs=max_num_seqs,
                       max_num_batched_tokens=budget, max_model_len=max_model_len)
    eos_rate = rng.choice([0.0, 0.05])
    worker = FakeWorker(sched, lambda r: EOS if rng.random() < eos_rate else TOKEN)

    pending = []
    for i in range(50):
        max_tokens = rng.randint(1, 40)
        pending.append(make_req(f"r{i}", rng.randint(1, max_model_len), max_tokens,
                                min_tokens=min(max_tokens, rng.choice([0, 0, 2]))))
    all_reqs = list(pending)
    by_id = {r.request_id: r for r in all_reqs}
    aborted: set[str] = set()
    resumed: dict[str, int] = {}
    preempted_outputs: dict[str, list[int]] = {}
    steps = 0
    while pending or sched.has_unfinished_requests():
        steps += 1
        assert steps < 20_000, "no progress"
        for _ in range(rng.randint(0, 3)):
            if pending:
                sched.add_request(pending.pop(0))
        if rng.random() < 0.1 and sched.requests:
            victim = rng.choice(sorted(sched.requests))
            aborted.add(victim)
            sched.finish_requests([victim], RequestStatus.FINISHED_ABORTED)
        if not sched.has_unfinished_requests():
            continue
        out, _, _, _ = step(sched, worker)
        assert not out.is_empty
        assert out.total_num_scheduled_tokens <= budget
        assert len(out.num_scheduled_tokens) <= max_num_seqs
        assert not (out.finished_req_ids & set(out.num_scheduled_tokens))
        assert out.preempted_req_ids <= out.finished_req_ids
        for rid in out.preempted_req_ids:
            preempted_outputs[rid] = list(by_id[rid].output_token_ids)
        for new in out.new_reqs:
            if new.req_id in preempted_outputs:
                resumed[new.req_id] = resumed.get(new.req_id, 0) + 1
                req = by_id[new.req_id]
                assert new.token_ids == req.prompt_token_ids + preempted_outputs.pop(new.req_id)
        _check_invariants(sched, budget, max_num_seqs)

    assert_all_free(sched)
    for req in all_reqs:
        assert req.is_finished
        if req.request_id in aborted:
            assert req.status == RequestStatus.FINISHED_ABORTED
            continue
        out = req.output_token_ids
        assert 1 <= len(out) <= req.max_tokens
        assert req.num_tokens <= max(max_model_len, req.num_prompt_tokens + 1)
        if req.status == RequestStatus.FINISHED_STOPPED:
            assert out[-1] == EOS and len(out) >= req.sampling_params.min_tokens
        else:
            assert req.status == RequestStatus.FINISHED_LENGTH_CAPPED
            assert len(out) == req.max_tokens or req.num_tokens >= max_model_len
        stops = [i for i, t in enumerate(out[:-1]) if t == EOS]
        assert all(i + 1 < req.sampling_params.min_tokens for i in stops)
    assert not preempted_outputs or all(r in aborted for r in preempted_outputs)
    if seed == 0:
        assert sched.num_preemptions > 0 and resumed
