"""Continuous batching over a paged KV cache. Pure Python, deterministic.

Every step each request's computed tokens catch up with its tokens under a token budget:
prefill, chunked prefill, decode and resumption after preemption are one code path.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Iterable

from octavo.config import CacheConfig, SchedulerConfig
from octavo.core.kv_cache_manager import KVCacheManager
from octavo.core.request import Request, RequestStatus
from octavo.core.scheduler_output import (
    CachedRequestData,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
)
from octavo.core.swap_space import SwapSpace


class Scheduler:
    def __init__(
        self, scheduler_config: SchedulerConfig, cache_config: CacheConfig, num_blocks: int,
        num_cpu_blocks: int = 0,
    ) -> None:
        self.config = scheduler_config
        self.kv = KVCacheManager(num_blocks, cache_config.block_size,
                                 cache_config.enable_prefix_caching)
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        # Requests the worker must drop at the next step.
        self._finished_ids: set[str] = set()
        # Requests whose full state the worker needs (new, or resumed after preemption).
        self._needs_full_state: set[str] = set()
        # Requests preempted during the current schedule() call (reported in its output).
        self._preempted_ids: set[str] = set()
        self.num_preemptions = 0
        # Preemption by swap (octavo/core/swap_space.py): CPU blocks for victims' KV.
        self.swap = SwapSpace(self.kv, num_cpu_blocks,
                              scheduler_config.preemption_mode == "swap")
        self.preemptions_by_mode = {"recompute": 0, "swap": 0}

    # ----------------------------------------------------------------- requests in and out
    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already in use")
        if request.num_prompt_tokens >= self.config.max_model_len + 1:
            raise ValueError(
                f"prompt of request {request.request_id!r} has {request.num_prompt_tokens} "
                f"tokens, more than max_model_len={self.config.max_model_len}")
        self.requests[request.request_id] = request
        self._enqueue(request)
        self._needs_full_state.add(request.request_id)

    def finish_requests(self, request_ids: Iterable[str], status: RequestStatus) -> None:
        """Finish (stop string, abort ...) requests from outside; frees their blocks now."""
        assert status.is_finished
        for rid in request_ids:
            req = self.requests.get(rid)
            if req is None or req.is_finished:
                continue
            if req.status == RequestStatus.RUNNING:
                self.running.remove(req)
            else:
                self.waiting.remove(req)
            req.status = status
            self._free(req)

    def _free(self, req: Request) -> None:
        self.kv.free(req)
        self.swap.free(req)
        del self.requests[req.request_id]
        self._finished_ids.add(req.request_id)
        self._needs_full_state.discard(req.request_id)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    # ----------------------------------------------------------------- the step
    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix; False (nothing changes) while requests hold blocks."""
        return self.kv.reset_prefix_cache()

    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        out = SchedulerOutput()
        new_blocks: dict[str, list[int]] = {}
        preempted_now = False

        # Prefix blocks this step will fill: a waiting request whose next uncached block is
        # among them waits one step and then reads it from the cache instead of recomputing.
        pending: set[int] = set()
        caching = self.kv.enable_prefix_caching

        # 1. Running requests first, in arrival order; preempt from the back when out of blocks.
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens + req.num_pending - req.num_computed_tokens, budget)
            if n <= 0 or (req.num_pending and not self._may_extend(req)):
                i += 1
                continue
            blocks = self.kv.allocate_slots(req, n)
            while blocks is None:
                victim = self._victim(self.running[i:])
                self._preempt(victim)
                preempted_now = True
                if victim is req:
                    break
                blocks = self.kv.allocate_slots(req, n)
            if blocks is None:  # the request preempted itself
                break
            new_blocks[req.request_id] = blocks
            out.num_scheduled_tokens[req.request_id] = n
            budget -= n
            if caching:
                self._note_pending(req, n, pending)
            i += 1

        # 2. Waiting requests, unless this step already had to preempt. Under the priority
        # policy a waiting request may preempt a running one of lower priority instead.
        priority = self.config.policy == "priority"
        share = self.config.group_share
        groups = Counter(r.group_id for r in self.running) if self.waiting else Counter()
        while self.waiting and budget > 0:
            if groups[self.waiting[0].group_id] >= share:
                self._promote_other_groups(groups, share)
            req = self.waiting[0]
            if req.num_pending:
                break  # preempted with a token in flight: resume once it has arrived
            full = len(self.running) >= self.config.max_num_seqs
            if full or (preempted_now and not priority):
                if ((priority and self._preempt_for(req, out, new_blocks))
                        or (full and self._preempt_over_share(req, groups, share, out,
                                                              new_blocks))):
                    budget = self.config.max_num_batched_tokens - sum(
                        out.num_scheduled_tokens.values())
                    groups = Counter(r.group_id for r in self.running)
                    continue
                break
            forked = False
            if req.fork_of is not None and req.num_computed_tokens == 0:
                forked = self._try_fork(req, out)
                if forked is None:
                    break  # the leader has not computed the prompt yet: keep FCFS order
            hits = []
            if not forked and req.num_computed_tokens == 0:
                hits = self.kv.get_computed_blocks(req)
                if caching and pending:
                    hashes = self.kv.block_hashes(req)
                    if len(hits) < len(hashes) and hashes[len(hits)] in pending:
                        break  # its prefix is being computed right now: reuse it next step
                if hits:
                    self.kv.take_computed_blocks(req, hits)
                    req.num_computed_tokens = len(hits) * self.kv.block_size
            n = req.num_tokens - req.num_computed_tokens
            if n > budget:
                if not self.config.enable_chunked_prefill:
                    break
                n = budget
            blocks = (self.kv.allocate_slots(req, n) if self.swap.try_swap_in(req, n)
                      else None)  # a swapped request first gets its blocks back
            if blocks is None:
                if hits or forked:  # give shared blocks back (cached ones stay cached)
                    self.kv.free(req)
                    req.num_computed_tokens = 0
                if priority and self._preempt_for(req, out, new_blocks):
                    budget = self.config.max_num_batched_tokens - sum(
                        out.num_scheduled_tokens.values())
                    continue
                break
            if self.kv.enable_prefix_caching and not forked:
                self.kv.prefix_queries += req.num_tokens
                self.kv.prefix_hits += len(hits) * self.kv.block_size
            if req.num_preemptions == 0:
                req.num_cached_tokens = len(hits) * self.kv.block_size
            self.waiting.popleft()
            if req.first_scheduled_time is None:
                req.first_scheduled_time = time.monotonic()
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            groups[req.group_id] += 1
            new_blocks[req.request_id] = blocks
            out.num_scheduled_tokens[req.request_id] = n
            budget -= n
            if caching:
                self._note_pending(req, n, pending)

        # 3. Describe the batch: full state for new / resumed requests, diffs for the rest;
        # then count the scheduled tokens as computed, and the tokens they will sample.
        for rid, n in out.num_scheduled_tokens.items():
            req = self.requests[rid]
            self._describe(req, out, new_blocks)
            req.num_computed_tokens += n
            if req.num_computed_tokens == req.num_tokens + req.num_pending:
                req.num_pending += 1
        out.total_num_scheduled_tokens = self.config.max_num_batched_tokens - budget
        out.finished_req_ids = self._finished_ids
        self._finished_ids = set()
        out.preempted_req_ids = self._preempted_ids
        self._preempted_ids = set()
        out.blocks_to_swap_out, out.blocks_to_swap_in = self.swap.take_step_copies()
        return out

    def _may_extend(self, req: Request) -> bool:
        """Whether a request with tokens in flight may compute one more (those tokens have
        not been stop-checked yet; length limits are known in advance)."""
        after = req.num_output_tokens + req.num_pending
        if req.max_tokens is not None and after >= req.max_tokens:
            return False
        return req.num_tokens + req.num_pending < self.config.max_model_len

    def _describe(self, req: Request, out: SchedulerOutput,
                  new_blocks: dict[str, list[int]]) -> None:
        rid = req.request_id
        if rid in self._needs_full_state:
            self._needs_full_state.discard(rid)
            out.new_reqs.append(NewRequestData(
                req_id=rid,
                token_ids=list(req.all_token_ids),
                num_prompt_tokens=req.num_prompt_tokens,
                sampling_params=req.sampling_params,
                block_ids=self.kv.block_ids(rid),
                num_computed_tokens=req.num_computed_tokens,
                bad_words_token_ids=req.bad_words_token_ids,
            ))
        else:
            out.cached_reqs.append(CachedRequestData(
                req_id=rid,
                new_block_ids=new_blocks[rid],
                num_computed_tokens=req.num_computed_tokens,
            ))

    def _note_pending(self, req: Request, n: int, pending: set[int]) -> None:
        """Record the hashes of the full blocks ``req`` computes in this step."""
        bs = self.kv.block_size
        first, last = req.num_computed_tokens // bs, (req.num_computed_tokens + n) // bs
        if last > first:
            pending.update(self.kv.block_hashes(req)[first:last])

    def _try_fork(self, req: Request, out: SchedulerOutput) -> bool | None:
        """Share the leader's prompt KV with a parallel sample. True: forked; False: the
        request computes its prompt itself; None: wait (the leader is mid-prefill)."""
        leader = req.fork_of
        shared = req.num_prompt_tokens - 1  # the last prompt token is recomputed for logits
        if (shared < 1 or leader.status != RequestStatus.RUNNING
                or leader.request_id not in self.kv.req_to_blocks):
            req.fork_of = None  # nothing to share: compute the prompt like any request
            return False
        if leader.num_computed_tokens < shared or self.kv.num_free_blocks < 1:
            return None
        copy = self.kv.fork(req, leader, shared)
        if copy is not None:
            out.block_copies.append(copy)
        req.num_computed_tokens = shared
        return True

    @staticmethod
    def _key(req: Request) -> tuple:
        """Scheduling order: lower priority value first, then earlier arrival."""
        return (req.priority, req.arrival_time)

    def _enqueue(self, req: Request, front: bool = False) -> None:
        if self.config.policy == "priority":
            key = self._key(req)
            idx = next((j for j, w in enumerate(self.waiting) if self._key(w) > key),
                       len(self.waiting))
            self.waiting.insert(idx, req)
        elif front:
            self.waiting.appendleft(req)
        else:
            self.waiting.append(req)

    def _victim(self, candidates: list[Request]) -> Request:
        """Whom to preempt: the latest arrival (FCFS), or the lowest priority, latest
        arrival among them (priority)."""
        if self.config.policy == "priority":
            return max(candidates, key=self._key)
        return candidates[-1]

    def _preempt_for(self, req: Request, out: SchedulerOutput,
                     new_blocks: dict[str, list[int]]) -> bool:
        """Priority policy: preempt the worst running request if ``req`` outranks it, taking
        it out of this step's batch. Returns whether one was preempted."""
        if not self.running:
            return False
        victim = self._victim(self.running)
        if self._key(victim) <= self._key(req):
            return False
        out.num_scheduled_tokens.pop(victim.request_id, None)
        new_blocks.pop(victim.request_id, None)
        self._preempt(victim)
        return True

    def _promote_other_groups(self, groups: Counter, share: int) -> None:
        """The head of the queue belongs to a request whose samples already hold their share
        of the batch (a huge n / best_of): move waiting requests of other groups ahead of
        it, keeping each group's order. Under the priority policy only within the head's
        priority level, so the queue stays sorted by priority."""
        head = self.waiting[0]
        same_level = (lambda r: r.priority == head.priority) if (
            self.config.policy == "priority") else (lambda r: True)
        level = [r for r in self.waiting if same_level(r)] if (
            self.config.policy == "priority") else list(self.waiting)
        ahead = [r for r in level if groups[r.group_id] < share]
        if not ahead:
            return
        behind = [r for r in level if groups[r.group_id] >= share]
        rest = list(self.waiting)[len(level):]
        self.waiting = deque(ahead + behind + rest)

    def _preempt_over_share(self, req: Request, groups: Counter, share: int,
                            out: SchedulerOutput, new_blocks: dict[str, list[int]]) -> bool:
        """The batch is full and ``req`` waits while another request's samples hold more
        than their share: preempt that request's latest sample to make room."""
        if groups[req.group_id] >= share:
            return False
        for victim in reversed(self.running):
            if groups[victim.group_id] > share:
                break
        else:
            return False
        out.num_scheduled_tokens.pop(victim.request_id, None)
        new_blocks.pop(victim.request_id, None)
        self._preempt(victim)
        # It went to the head of the queue; the request it made room for goes first.
        self.waiting.remove(req)
        self.waiting.appendleft(req)
        return True

    def _preempt(self, req: Request) -> None:
        """Preempt by swap (preemption_mode="swap" and room in the CPU pool: its KV waits
        there, its computed tokens stay) or else by recompute (its KV is dropped); either
        way its GPU blocks are freed and it goes back to the head of the queue."""
        self.running.remove(req)
        swapped = self.swap.swap_out(req)
        self.kv.free(req)
        req.status = RequestStatus.PREEMPTED
        if not swapped:
            req.num_computed_tokens = 0
        req.num_cached_blocks = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.preemptions_by_mode["swap" if swapped else "recompute"] += 1
        self._enqueue(req, front=True)
        self._preempted_ids.add(req.request_id)
        self._finished_ids.add(req.request_id)  # the worker forgets it ...
        self._needs_full_state.add(req.request_id)  # ... and gets it whole when it resumes

    def update_from_output(
        self, sched: SchedulerOutput, runner_out: ModelRunnerOutput
    ) -> tuple[list[tuple[Request, int]], list[Request]]:
        """Append sampled tokens, finish what stops, register newly full blocks in the
        prefix cache. ``sched`` may be older than the latest schedule() (asynchronous
        scheduling): requests finished or preempted since are handled.

        Returns (request, new token) pairs and the requests that finished this step.
        """
        for rid in sched.num_scheduled_tokens:  # before finishing: freed blocks stay cached
            req = self.requests.get(rid)
            if req is not None:
                self.kv.cache_full_blocks(req)
        new_tokens: list[tuple[Request, int]] = []
        finished: list[Request] = []
        for rid, token in zip(runner_out.req_ids, runner_out.sampled_token_ids):
            req = self.requests.get(rid)
            if req is None or req.is_finished:
                continue  # finished (stop, abort) while this step was in flight
            assert req.num_pending > 0, req
            req.num_pending -= 1
            if req.first_token_time is None:
                req.first_token_time = time.monotonic()
            req.append_output_token(token)
            new_tokens.append((req, token))
            status = self._check_stop(req, token)
            if status is not None:
                if req.status == RequestStatus.RUNNING:
                    self.running.remove(req)
                else:  # preempted while its token was in flight
                    self.waiting.remove(req)
                req.status = status
                self._free(req)
                finished.append(req)
        return new_tokens, finished

    def _check_stop(self, req: Request, token: int) -> RequestStatus | None:
        params = req.sampling_params
        if req.num_output_tokens >= params.min_tokens:
            if not params.ignore_eos and token in req.eos_token_ids:
                return RequestStatus.FINISHED_STOPPED
            if token in req.stop_token_ids:
                req.stop_reason = token
                return RequestStatus.FINISHED_STOPPED
        if req.max_tokens is not None and req.num_output_tokens >= req.max_tokens:
            return RequestStatus.FINISHED_LENGTH_CAPPED
        if req.num_tokens >= self.config.max_model_len:
            return RequestStatus.FINISHED_LENGTH_CAPPED
        return None
