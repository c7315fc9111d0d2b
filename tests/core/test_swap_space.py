"""Preemption by swap in the scheduler: CPU swap space accounting, swap-out / swap-in copies,
fallback to recompute, aborts, counters by kind. Pure Python, no torch.

``KVWorker`` stands in for the model runner and its KV tensors: it keeps the token held by
every slot of every GPU and CPU block, makes each step's copies in the real worker's order
(swap-outs, swap-ins, copy-on-write copies, then the step's KV writes), and checks before
computing that each scheduled request's computed positions hold its own tokens -- what a
wrong swap pair, a reused block or a wrong order would break.
"""

from __future__ import annotations

import random
import subprocess
import sys
from dataclasses import dataclass

import pytest

from octavo.config import CacheConfig, SchedulerConfig
from octavo.core.kv_cache_manager import KVCacheManager
from octavo.core.request import Request, RequestStatus
from octavo.core.scheduler import Scheduler
from octavo.core.scheduler_output import ModelRunnerOutput, SchedulerOutput
from octavo.core.swap_space import SwapSpace
from octavo.sampling_params import SamplingParams

EOS = 2


def make_sched(num_blocks: int = 16, num_cpu_blocks: int = 64, mode: str = "swap",
               block_size: int = 4, max_num_seqs: int = 8, max_num_batched_tokens: int = 64,
               max_model_len: int = 64, chunked: bool = True, caching: bool = False,
               policy: str = "fcfs") -> Scheduler:
    return Scheduler(
        SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                        max_model_len=max_model_len, enable_chunked_prefill=chunked,
                        policy=policy, preemption_mode=mode),
        CacheConfig(block_size=block_size, enable_prefix_caching=caching),
        num_blocks, num_cpu_blocks)


_arrival = iter(range(10**9))


def make_req(rid: str, prompt: list[int] | int, max_tokens: int = 4, priority: int = 0,
             ignore_eos: bool = True) -> Request:
    if isinstance(prompt, int):
        prompt = [100 + (7 * i + len(rid)) % 50 for i in range(prompt)]
    return Request(rid, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos),
                   eos_token_ids=frozenset({EOS}), arrival_time=float(next(_arrival)),
                   priority=priority)


def next_token(seen: list[int]) -> int:
    """A deterministic 'model': the next token from the tokens read back from the KV."""
    h = (sum(t * (i + 1) for i, t in enumerate(seen)) * 7 + len(seen)) % 97
    return EOS if h % 13 == 0 else 3 + h % 50


@dataclass
class _State:
    token_ids: list[int]
    block_ids: list[int]
    num_computed: int


class KVWorker:
    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched
        self.bs = sched.kv.block_size
        self.gpu = [[None] * self.bs for _ in range(sched.kv.pool.num_blocks)]
        self.cpu = [[None] * self.bs for _ in range(sched.swap.num_blocks)]
        self.states: dict[str, _State] = {}
        self.num_swapped_out = self.num_swapped_in = 0

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        for rid in out.finished_req_ids:
            self.states.pop(rid, None)
        for g, c in out.blocks_to_swap_out:
            self.cpu[c] = list(self.gpu[g])
        for c, g in out.blocks_to_swap_in:
            self.gpu[g] = list(self.cpu[c])
        for s, d in out.block_copies:
            self.gpu[d] = list(self.gpu[s])
        self.num_swapped_out += len(out.blocks_to_swap_out)
        self.num_swapped_in += len(out.blocks_to_swap_in)
        for new in out.new_reqs:
            assert new.req_id not in self.states, f"{new.req_id} sent in full twice"
            self.states[new.req_id] = _State(list(new.token_ids), list(new.block_ids),
                                             new.num_computed_tokens)
        for c in out.cached_reqs:
            st = self.states[c.req_id]
            st.block_ids.extend(c.new_block_ids)
            assert st.num_computed == c.num_computed_tokens
        ids, tokens = [], []
        for rid, n in out.num_scheduled_tokens.items():
            st = self.states[rid]
            assert len(st.block_ids) * self.bs >= st.num_computed + n
            seen = [self.gpu[st.block_ids[p // self.bs]][p % self.bs]
                    for p in range(st.num_computed)]
            assert seen == st.token_ids[: st.num_computed], f"{rid}: its KV was lost"
            for p in range(st.num_computed, st.num_computed + n):
                self.gpu[st.block_ids[p // self.bs]][p % self.bs] = st.token_ids[p]
            st.num_computed += n
            if st.num_computed == len(st.token_ids):
                tok = next_token(seen + st.token_ids[len(seen):])
                st.token_ids.append(tok)
                ids.append(rid)
                tokens.append(tok)
        return ModelRunnerOutput(ids, tokens)


def check_accounting(sched: Scheduler) -> None:
    """CPU blocks in use are exactly those of swapped requests; a swapped request is
    preempted, waiting, and holds no GPU block."""
    swap = sched.swap
    held = [b for blocks in swap.req_to_cpu_blocks.values() for b in blocks]
    assert swap.num_used_blocks == len(held) == len({b.block_id for b in held})
    assert all(b.ref_cnt == 1 for b in held)
    for rid in swap.req_to_cpu_blocks:
        req = sched.requests[rid]
        assert req.status == RequestStatus.PREEMPTED and req in sched.waiting
        assert rid not in sched.kv.req_to_blocks and req.num_computed_tokens > 0


def run(sched: Scheduler, worker: KVWorker | None = None, max_steps: int = 5000,
        overlap: bool = False) -> list[SchedulerOutput]:
    """Step to the end. ``overlap``: as asynchronous scheduling does, schedule and run step
    N+1 before step N's tokens reach the scheduler (the worker has them already)."""
    worker = worker or KVWorker(sched)
    outs = []
    inflight = None
    while sched.has_unfinished_requests() or inflight is not None:
        assert len(outs) < max_steps, "no progress"
        out = sched.schedule()
        check_accounting(sched)
        launched = (out, worker.execute(out))
        if overlap and inflight is None:
            inflight = launched
        else:
            if overlap:
                inflight, launched = launched, inflight
            sched.update_from_output(*launched)
            check_accounting(sched)
        if overlap and inflight is not None and not sched.has_unfinished_requests():
            sched.update_from_output(*inflight)
            inflight = None
        outs.append(out)
    assert sched.kv.pool.num_free_blocks == sched.kv.pool.num_blocks
    assert sched.swap.num_free_blocks == sched.swap.num_blocks
    assert sched.swap.req_to_cpu_blocks == {} and sched.kv.req_to_blocks == {}
    return outs


# --------------------------------------------------------------------------- basics


def test_swap_space_does_not_import_torch():
    code = ("import octavo.core.swap_space, octavo.core.scheduler, sys; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_preemption_mode_is_validated():
    with pytest.raises(ValueError, match="preemption_mode must be 'recompute' or 'swap', "
                                         "got 'discard'"):
        SchedulerConfig(preemption_mode="discard")
    with pytest.raises(ValueError, match="swap_space must be >= 0, got -1"):
        CacheConfig(swap_space=-1)
    assert CacheConfig().swap_space == 4.0 and SchedulerConfig().preemption_mode == "recompute"


def test_recompute_mode_has_no_swap_space():
    sched = make_sched(mode="recompute", num_cpu_blocks=64)
    assert sched.swap.num_blocks == 0
    assert make_sched(num_cpu_blocks=0).swap.num_blocks == 0


# --------------------------------------------------------------------------- swap out / in


def _three_and_one(sched: Scheduler):
    """3 requests of one block each in a 4-block pool: the 2nd step preempts c."""
    a, b, c = (make_req(x, 4, max_tokens=3) for x in "abc")
    d = make_req("d", 4, max_tokens=1)
    for r in (a, b, c, d):
        sched.add_request(r)
    return a, b, c, d


def test_swap_out_keeps_computed_tokens_and_swap_in_restores_them():
    sched = make_sched(num_blocks=4, num_cpu_blocks=8, max_num_seqs=3)
    a, b, c, d = _three_and_one(sched)
    worker = KVWorker(sched)

    def step():
        out = sched.schedule()
        check_accounting(sched)
        sched.update_from_output(out, worker.execute(out))
        check_accounting(sched)
        return out

    step()
    (c_block,) = sched.kv.block_ids("c")
    out = step()
    # a takes the free block; b needs one: c, the latest arrival, is swapped out.
    assert out.num_scheduled_tokens == {"a": 1, "b": 1}
    assert out.blocks_to_swap_out == [(c_block, 0)] and out.blocks_to_swap_in == []
    assert out.preempted_req_ids == {"c"} and out.finished_req_ids == {"c"}
    assert c.status == RequestStatus.PREEMPTED and sched.swap.is_swapped(c)
    assert c.num_computed_tokens == 4 and c.num_tokens == 5  # prompt kept, 1 token out
    assert "c" not in sched.kv.req_to_blocks and sched.swap.num_used_blocks == 1
    assert list(sched.waiting) == [c, d]
    assert sched.num_preemptions == 1 and c.num_preemptions == 1
    assert sched.preemptions_by_mode == {"recompute": 0, "swap": 1}

    out = step()  # a and b finish; the pool is still full while they run
    assert sched.swap.is_swapped(c) and out.blocks_to_swap_in == []
    out = step()
    # c comes back with its 4 computed tokens: only its sampled token is left to compute.
    (new_c,) = [n for n in out.new_reqs if n.req_id == "c"]
    assert new_c.num_computed_tokens == 4 and out.num_scheduled_tokens["c"] == 1
    assert out.blocks_to_swap_in == [(0, new_c.block_ids[0])]
    assert len(new_c.block_ids) == 2  # the swapped-in block and one for token 5
    assert not sched.swap.is_swapped(c) and sched.swap.num_used_blocks == 0
    run(sched, worker)
    assert c.num_output_tokens == 3 and worker.num_swapped_in == worker.num_swapped_out == 1


def test_swap_in_waits_for_room_without_taking_blocks():
    sched = make_sched(num_blocks=4, num_cpu_blocks=8, max_num_seqs=3)
    a, b, c, d = _three_and_one(sched)
    worker = KVWorker(sched)
    for _ in range(3):  # step 2 swaps c out; in step 3 a and b still fill the pool
        out = sched.schedule()
        free_before = sched.kv.num_free_blocks
        sched.update_from_output(out, worker.execute(out))
    assert sched.swap.is_swapped(c) and free_before == 0
    assert sched.swap.num_used_blocks == 1
    run(sched, worker)


def test_fallback_to_recompute_when_the_cpu_pool_is_too_small():
    # c holds 2 blocks (a 5-token prompt) but the CPU pool has 1.
    sched = make_sched(num_blocks=6, num_cpu_blocks=1, max_num_seqs=3)
    reqs = [make_req(x, 5, max_tokens=6) for x in "abc"]
    for r in reqs:
        sched.add_request(r)
    outs = run(sched)
    assert sched.preemptions_by_mode["recompute"] > 0
    assert sched.preemptions_by_mode["swap"] == 0
    assert all(o.blocks_to_swap_out == [] and o.blocks_to_swap_in == [] for o in outs)
    assert sched.num_preemptions == sched.preemptions_by_mode["recompute"]
    assert all(r.num_output_tokens == 6 for r in reqs)


def test_swap_and_recompute_mix_when_the_cpu_pool_fills():
    results = {}
    for cpu_blocks in (0, 3, 1000):
        sched = make_sched(num_blocks=17, num_cpu_blocks=cpu_blocks, max_num_seqs=8)
        reqs = [make_req(f"r{i}", 5 + 3 * i, max_tokens=12) for i in range(8)]
        for r in reqs:
            sched.add_request(r)
        run(sched)
        results[cpu_blocks] = ({r.request_id: r.output_token_ids for r in reqs},
                               dict(sched.preemptions_by_mode), sched.num_preemptions)
    tokens = {k: v[0] for k, v in results.items()}
    assert tokens[0] == tokens[3] == tokens[1000]
    for _, by_mode, total in results.values():
        assert sum(by_mode.values()) == total
    assert results[0][1]["swap"] == 0 and results[0][1]["recompute"] > 0
    assert results[3][1]["swap"] > 0 and results[3][1]["recompute"] > 0
    assert results[1000][1]["swap"] > 0 and results[1000][1]["recompute"] == 0


@pytest.mark.parametrize("status", [RequestStatus.FINISHED_ABORTED,
                                    RequestStatus.FINISHED_STOPPED])
def test_finishing_a_swapped_request_frees_its_cpu_blocks(status):
    sched = make_sched(num_blocks=4, num_cpu_blocks=8, max_num_seqs=3)
    a, b, c, d = _three_and_one(sched)
    worker = KVWorker(sched)
    for _ in range(2):
        out = sched.schedule()
        sched.update_from_output(out, worker.execute(out))
    assert sched.swap.is_swapped(c) and sched.swap.num_used_blocks == 1
    sched.finish_requests(["c"], status)
    check_accounting(sched)
    assert c.status == status and not sched.swap.is_swapped(c)
    assert sched.swap.num_free_blocks == sched.swap.num_blocks
    assert c not in sched.waiting and "c" not in sched.requests
    out = sched.schedule()
    assert "c" in out.finished_req_ids and out.blocks_to_swap_in == []
    sched.update_from_output(out, worker.execute(out))
    run(sched, worker)


def test_shared_prefix_blocks_are_swapped_out_and_stay_for_their_other_owner():
    """A prefix-cache hit shares two full blocks between a and c: swapping c out copies
    them too and drops only c's reference; a keeps them on the GPU."""
    prefix = [200 + i for i in range(8)]
    sched = make_sched(num_blocks=7, num_cpu_blocks=16, caching=True, max_num_seqs=3)
    a = make_req("a", prefix + [1, 1], max_tokens=8)
    sched.add_request(a)
    worker = KVWorker(sched)
    out = sched.schedule()
    sched.update_from_output(out, worker.execute(out))
    c = make_req("c", prefix + [5, 5, 5], max_tokens=8)
    b = make_req("b", 6, max_tokens=8)
    sched.add_request(b)
    sched.add_request(c)
    out = sched.schedule()
    sched.update_from_output(out, worker.execute(out))
    shared = sched.kv.block_ids("a")[:2]
    assert sched.kv.block_ids("c")[:2] == shared and c.num_cached_tokens == 8
    assert [sched.kv.pool.blocks[i].ref_cnt for i in shared] == [2, 2]
    c_blocks = sched.kv.block_ids("c")
    while not sched.swap.is_swapped(c):
        assert c.status == RequestStatus.RUNNING
        c_blocks = sched.kv.block_ids("c")
        out = sched.schedule()
        check_accounting(sched)
        sched.update_from_output(out, worker.execute(out))
    assert [g for g, _ in out.blocks_to_swap_out] == c_blocks  # shared ones included
    assert len(sched.swap.req_to_cpu_blocks["c"]) == len(c_blocks)
    if "a" in sched.kv.req_to_blocks:  # still running: the shared blocks stay its own
        assert sched.kv.block_ids("a")[:2] == shared
        assert [sched.kv.pool.blocks[i].ref_cnt for i in shared] == [1, 1]
    run(sched, worker)
    assert sched.preemptions_by_mode["swap"] >= 1


def _computed(kv: KVCacheManager, rid: str, num_tokens: int) -> Request:
    req = make_req(rid, num_tokens)
    kv.allocate_slots(req, num_tokens)
    req.num_computed_tokens = num_tokens
    return req


def test_cpu_blocks_of_a_swap_in_are_not_reused_by_a_swap_out_of_the_same_step():
    """The worker runs a step's swap-outs before its swap-ins: a swap-out scheduled after a
    swap-in in the same step must not take the CPU blocks that swap-in still has to read.
    They return to the pool when the step's copies are taken."""
    kv = KVCacheManager(8, 4)
    swap = SwapSpace(kv, 2, enabled=True)
    x, c = _computed(kv, "x", 4), _computed(kv, "c", 8)
    assert swap.swap_out(x)
    kv.free(x)
    assert swap.take_step_copies() == ([(0, 0)], [])
    # One step: x comes back, then c (2 blocks) is preempted.
    assert swap.try_swap_in(x, 1)
    assert swap.num_free_blocks == 1 and not swap.swap_out(c)  # c is recomputed
    out, into = swap.take_step_copies()
    assert out == [] and into == [(0, kv.block_ids("x")[0])]
    assert swap.num_free_blocks == 2 and swap.req_to_cpu_blocks == {}
    assert swap.swap_out(c)  # in a later step the blocks are free to use


def test_a_request_swapped_in_this_step_is_not_swapped_out_again_in_it():
    """Its GPU blocks are filled by a swap-in that runs after the step's swap-outs."""
    kv = KVCacheManager(8, 4)
    swap = SwapSpace(kv, 4, enabled=True)
    x = _computed(kv, "x", 6)
    assert swap.swap_out(x)
    kv.free(x)
    swap.take_step_copies()
    assert swap.try_swap_in(x, 1)
    assert not swap.swap_out(x)
    swap.take_step_copies()
    assert swap.swap_out(x)


def test_swap_out_refuses_what_it_cannot_or_need_not_keep():
    kv = KVCacheManager(8, 4)
    off = SwapSpace(kv, 4, enabled=False)
    x = _computed(kv, "x", 6)
    assert not off.swap_out(x) and off.num_blocks == 0
    swap = SwapSpace(kv, 1, enabled=True)
    assert not swap.swap_out(x)  # 2 blocks, 1 CPU block
    fresh = make_req("y", 4)
    kv.allocate_slots(fresh, 4)  # blocks, but nothing computed yet
    assert not SwapSpace(kv, 4, enabled=True).swap_out(fresh)
    with pytest.raises(ValueError, match="num_cpu_blocks must be >= 0, got -1"):
        SwapSpace(kv, -1, enabled=True)


# --------------------------------------------------------------------------- randomized


def _workload(seed: int, policy: str):
    rng = random.Random(seed)
    prefixes = [[rng.randrange(3, 99) for _ in range(8)] for _ in range(2)]
    specs = []
    for i in range(rng.randrange(6, 12)):
        prompt = [rng.randrange(3, 99) for _ in range(rng.randrange(1, 24))]
        if rng.random() < 0.4:
            prompt = rng.choice(prefixes) + prompt
        specs.append((f"r{i}", prompt, rng.randrange(1, 20),
                      rng.randrange(3) if policy == "priority" else 0,
                      rng.random() < 0.5, rng.random() < 0.2))
    return specs


def _run_workload(specs, overlap=False, **kw):
    sched = make_sched(**kw)
    reqs = []
    for rid, prompt, max_tokens, prio, ignore_eos, fork in specs:
        req = make_req(rid, prompt, max_tokens, prio, ignore_eos)
        if fork and reqs and reqs[-1].fork_of is None:  # a parallel sample of the last one
            req = make_req(rid, reqs[-1].prompt_token_ids, max_tokens, reqs[-1].priority,
                           ignore_eos)
            req.fork_of = reqs[-1]
        sched.add_request(req)
        reqs.append(req)
    worker = KVWorker(sched)
    run(sched, worker, overlap=overlap)
    if not overlap:  # nothing is aborted: every block swapped out is swapped back in
        assert worker.num_swapped_out == worker.num_swapped_in
    else:  # ... unless its in-flight token stopped it while it was swapped out
        assert worker.num_swapped_out >= worker.num_swapped_in
    return {r.request_id: r.output_token_ids for r in reqs}, sched


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
@pytest.mark.parametrize("policy", ["fcfs", "priority"])
@pytest.mark.parametrize("caching", [False, True])
@pytest.mark.parametrize("chunked", [True, False])
def test_randomized_swap_matches_no_preemption(policy, caching, chunked, overlap):
    budget = 24 if chunked else 64
    swaps = 0
    for seed in range(12):
        specs = _workload(seed, policy)
        common = dict(policy=policy, caching=caching, chunked=chunked,
                      max_num_batched_tokens=budget, overlap=overlap)
        expected, _ = _run_workload(specs, num_blocks=400, **common)
        for cpu_blocks in (4, 200):
            got, sched = _run_workload(specs, num_blocks=17, num_cpu_blocks=cpu_blocks,
                                       **common)
            assert got == expected, (seed, cpu_blocks)
            assert sum(sched.preemptions_by_mode.values()) == sched.num_preemptions
            swaps += sched.preemptions_by_mode["swap"]
    assert swaps > 0
