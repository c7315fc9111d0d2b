"""The scheduler tests' fake model runner and builders: ``FakeWorker`` mirrors what the real
model runner keeps per request (token ids, block ids, computed tokens) purely from the
SchedulerOutputs it receives, checks that mirror against the scheduler every step, and samples
a token (TOKEN unless told otherwise) for each request whose computed tokens reach its end
this step, as the real runner does. Pure Python, no torch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from octavo.config import CacheConfig, SchedulerConfig
from octavo.core.kv_cache_manager import cdiv
from octavo.core.request import Request
from octavo.core.scheduler import Scheduler
from octavo.core.scheduler_output import ModelRunnerOutput, SchedulerOutput
from octavo.sampling_params import SamplingParams

EOS = 2
TOKEN = 7


def make_sched(num_blocks: int = 64, block_size: int = 4, max_num_seqs: int = 16,
               max_num_batched_tokens: int = 64, max_model_len: int = 64,
               enable_chunked_prefill: bool = True,
               enable_prefix_caching: bool = False) -> Scheduler:
    return Scheduler(
        SchedulerConfig(max_num_seqs=max_num_seqs,
                        max_num_batched_tokens=max_num_batched_tokens,
                        max_model_len=max_model_len,
                        enable_chunked_prefill=enable_chunked_prefill),
        CacheConfig(block_size=block_size, enable_prefix_caching=enable_prefix_caching),
        num_blocks,
    )


_arrival = iter(range(10**9))


def make_req(rid: str, num_prompt: int, max_tokens: int | None = 4, *,
             eos: frozenset[int] = frozenset({EOS}), **params) -> Request:
    prompt = [100 + (i % 50) for i in range(num_prompt)]
    sp = SamplingParams(max_tokens=max_tokens, **params)
    return Request(rid, prompt, sp, eos_token_ids=eos, arrival_time=float(next(_arrival)))


@dataclass
class _WorkerState:
    token_ids: list[int]
    block_ids: list[int]
    num_computed: int


class FakeWorker:
    def __init__(self, sched: Scheduler,
                 token_fn: Callable[[Request], int] | None = None) -> None:
        self.sched = sched
        self.token_fn = token_fn or (lambda req: TOKEN)
        self.states: dict[str, _WorkerState] = {}

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        sched = self.sched
        for rid in out.finished_req_ids:
            self.states.pop(rid, None)
        for new in out.new_reqs:
            assert new.req_id not in self.states, f"{new.req_id} sent in full twice"
            req = sched.requests[new.req_id]
            assert new.num_prompt_tokens == req.num_prompt_tokens
            assert new.sampling_params is req.sampling_params
            self.states[new.req_id] = _WorkerState(
                list(new.token_ids), list(new.block_ids), new.num_computed_tokens)
        for c in out.cached_reqs:
            st = self.states[c.req_id]
            st.block_ids.extend(c.new_block_ids)
            assert st.num_computed == c.num_computed_tokens
        ids = [*(r.req_id for r in out.new_reqs), *(r.req_id for r in out.cached_reqs)]
        assert len(ids) == len(set(ids)) and set(ids) == set(out.num_scheduled_tokens)
        assert out.total_num_scheduled_tokens == sum(out.num_scheduled_tokens.values())

        bs = sched.kv.block_size
        sampled_ids, tokens = [], []
        for rid, n in out.num_scheduled_tokens.items():
            req = sched.requests[rid]
            st = self.states[rid]
            assert n > 0
            assert st.num_computed + n == req.num_computed_tokens  # advanced by schedule()
            assert st.token_ids == req.all_token_ids
            assert st.block_ids == sched.kv.block_ids(rid)
            assert len(st.block_ids) == cdiv(st.num_computed + n, bs)
            st.num_computed += n
            assert st.num_computed <= len(st.token_ids)
            if st.num_computed == len(st.token_ids):  # reached its end: sample
                tok = self.token_fn(req)
                st.token_ids.append(tok)
                sampled_ids.append(rid)
                tokens.append(tok)
        return ModelRunnerOutput(sampled_ids, tokens)


def step(sched: Scheduler, worker: FakeWorker):
    out = sched.schedule()
    runner_out = worker.execute(out)
    new_tokens, finished = sched.update_from_output(out, runner_out)
    return out, runner_out, new_tokens, finished


def run_all(sched: Scheduler, worker: FakeWorker | None = None, max_steps: int = 10_000,
            check: Callable[[SchedulerOutput], None] | None = None) -> list[SchedulerOutput]:
    worker = worker or FakeWorker(sched)
    outs = []
    while sched.has_unfinished_requests():
        assert len(outs) < max_steps, "scheduler made no progress"
        out, *_ = step(sched, worker)
        assert not out.is_empty, "unfinished requests but nothing scheduled"
        if check:
            check(out)
        outs.append(out)
    assert_all_free(sched)
    return outs


def assert_all_free(sched: Scheduler) -> None:
    pool = sched.kv.pool
    assert pool.num_free_blocks == pool.num_blocks
    assert all(b.ref_cnt == 0 for b in pool.blocks)
    assert sched.kv.req_to_blocks == {}
    assert not sched.requests and not sched.running and not sched.waiting
