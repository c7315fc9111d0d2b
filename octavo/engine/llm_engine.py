"""The synchronous engine: processor -> scheduler -> executor -> output processor, per step."""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass

from octavo.config import EngineConfig
from octavo.core.request import RequestStatus
from octavo.core.scheduler import Scheduler
from octavo.engine.arg_utils import EngineArgs
from octavo.engine.output_processor import RequestState, StepDelta
from octavo.engine.parallel_sampling import ParentRequest, child_params, num_samples
from octavo.engine.processor import Processor, PromptType
from octavo.engine.tokenizer import load_tokenizer
from octavo.errors import RequestFailedError
from octavo.executor.base import check_picklable
from octavo.executor.registry import get_executor_class
from octavo.metrics.step_timings import StepTimings, StepTrace
from octavo.outputs import CompletionOutput, RequestOutput
from octavo.sampling_params import RequestOutputKind, SamplingParams
from octavo.structured_output.request_state import conflict as grammar_conflict

logger = logging.getLogger(__name__)


class EngineStepError(RuntimeError):
    """A step failed for a reason no single request explains. The engine has dropped every
    request (their KV blocks are back in the pool) and can serve again; see
    ``LLMEngine.check_health`` for whether the device still works."""


@dataclass
class StepStats:
    num_running: int
    num_waiting: int
    num_scheduled_tokens: int
    num_prompt_tokens: int
    num_generation_tokens: int
    kv_cache_usage: float
    num_free_blocks: int
    step_seconds: float


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.tokenizer = load_tokenizer(config.model_config)
        self.processor = Processor(
            config.model_config, self.tokenizer, max_n=config.scheduler_config.sample_cap,
            structured_outputs_backend=config.structured_outputs_config.backend)
        self.executor = get_executor_class(config.parallel_config.executor_backend)(config)
        self.num_blocks = self.executor.num_blocks
        capacity = self.num_blocks * config.cache_config.block_size
        if capacity < config.model_config.max_model_len:
            raise ValueError(
                f"max_model_len={config.model_config.max_model_len} is larger than the KV "
                f"cache holds ({self.num_blocks} blocks = {capacity} tokens): lower "
                "max_model_len or give the cache more memory")
        self.scheduler = self._new_scheduler()
        self.states: dict[str, RequestState] = {}
        self.parents: dict[str, ParentRequest] = {}  # n or best_of > 1, by user request id
        self._child_parent: dict[str, tuple[ParentRequest, int]] = {}
        self._ids = itertools.count()
        self.last_stats: StepStats | None = None
        # Asynchronous scheduling: the launched step whose outputs are not processed yet.
        self._inflight: tuple | None = None
        self._wait_s = 0.0
        self.timings = StepTimings()
        # Requests still in the engine whose sampling waits for the step before to be
        # processed: structured outputs, bad words, logits processors, min_tokens
        # (output_processor.samples_after_history; pruned as they finish).
        self._guided: set[str] = set()

    def _new_scheduler(self) -> Scheduler:
        c = self.config
        return Scheduler(c.scheduler_config, c.cache_config, self.num_blocks,
                         self.executor.num_cpu_blocks)

    @classmethod
    def from_engine_args(cls, args: EngineArgs) -> LLMEngine:
        return cls(args.create_engine_config())

    # ------------------------------------------------------------------ requests
    def next_request_id(self) -> str:
        return str(next(self._ids))

    def add_request(self, request_id: str, prompt: PromptType,
                    params: SamplingParams | None = None, priority: int = 0,
                    arrival_time: float | None = None, group_id: str | None = None,
                    plain_deltas: bool = False) -> None:
        """Queue a request. ``group_id``: the user request it belongs to when one user request
        fans out into several engine requests (a server's list of prompts): the scheduler
        bounds a group's share of the batch while others wait. Default: its own id.

        ``plain_deltas`` (a DELTA request without logprobs; ignored otherwise): after its
        first output, each unfinished output that ``step`` returns for it is a ``StepDelta``
        tuple (request id, completion index, new text, new token ids) instead of a
        RequestOutput: the same values, for a consumer that forwards deltas as they are
        (an engine process's sink) and need not pay for the objects every step."""
        if request_id in self.states or request_id in self.parents:
            raise ValueError(f"request_id {request_id!r} is already in use")
        params = SamplingParams() if params is None else params
        if self.executor.crosses_processes and isinstance(params, SamplingParams):
            check_picklable(params)
        if isinstance(params, SamplingParams) and num_samples(params) > 1:
            self._add_parallel(request_id, prompt, params, priority, arrival_time,
                               group_id or request_id, plain_deltas)
            return
        req, text = self.processor.process(request_id, prompt, params, priority, arrival_time)
        req.group_id = group_id or request_id
        self.scheduler.add_request(req)
        self.states[request_id] = self._new_state(req, text, plain_deltas)

    def _new_state(self, req, text: str | None, plain_deltas: bool = False) -> RequestState:
        state = RequestState(req, text, self.tokenizer)
        p = req.sampling_params
        state.wants_plain = (plain_deltas and p.output_kind == RequestOutputKind.DELTA
                             and p.logprobs is None)
        if req.sampling_params.structured_outputs is not None:
            # Its own matcher (each sample of n > 1 too), from the grammar the processor
            # compiled and cached.
            state.grammar = self.processor.structured.new_state(
                req.sampling_params.structured_outputs)
        if state.samples_late:
            self._guided.add(req.request_id)
        return state

    def _add_parallel(self, request_id, prompt, params, priority, arrival_time,
                      group_id: str, plain_deltas: bool = False) -> None:
        self.processor.check_params(params)  # the children's params hide n and best_of
        parent = ParentRequest(request_id, params)
        # The prompt is tokenized and checked once; the other samples reuse its token ids.
        first, text = self.processor.process(parent.child_ids[0], prompt,
                                             child_params(params, 0), priority, arrival_time)
        same = {"prompt": text, "prompt_token_ids": first.prompt_token_ids} if text else {
            "prompt_token_ids": first.prompt_token_ids}
        made = [(first, text)] + [
            self.processor.process(cid, same, child_params(params, i), priority,
                                   first.arrival_time)
            for i, cid in enumerate(parent.child_ids) if i]  # all valid before queueing
        leader = made[0][0]
        for i, (req, text) in enumerate(made):
            req.group_id = group_id
            if i:
                req.fork_of = leader
            self.scheduler.add_request(req)
            self.states[req.request_id] = self._new_state(req, text, plain_deltas)
            self._child_parent[req.request_id] = (parent, i)
        self.parents[request_id] = parent

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prompt prefix (vLLM's name). Only when idle: with requests
        unfinished or a step in flight it changes nothing and returns False."""
        if self.has_unfinished_requests():
            return False
        return self.scheduler.reset_prefix_cache()

    def abort_request(self, request_ids: str | list[str]) -> None:
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        for rid in list(ids):
            parent = self.parents.pop(rid, None)
            if parent is not None:
                ids.extend(parent.child_ids)
        self.scheduler.finish_requests(ids, RequestStatus.FINISHED_ABORTED)
        for rid in ids:
            self.states.pop(rid, None)
            self._child_parent.pop(rid, None)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests() or self._inflight is not None

    def get_num_unfinished_requests(self) -> int:
        return self.scheduler.num_unfinished

    def get_tokenizer(self):
        return self.tokenizer

    # ------------------------------------------------------------------ the step
    def step(self) -> list[RequestOutput | StepDelta]:
        """Schedule and launch one step; return the outputs of the step before it (with
        asynchronous scheduling, whose host work then overlaps the device) or of this one.
        RequestOutputs, and StepDelta tuples only for requests added with ``plain_deltas``.

        A fault traced to one request ends that request (finish_reason "error") and the step
        goes on. Any other exception drops every request, resets the worker and raises
        EngineStepError: the engine itself stays usable."""
        try:
            return self._step()
        except Exception as e:
            logger.exception("engine step failed; dropping every request")
            self.reset()
            raise EngineStepError(f"an engine step failed: {type(e).__name__}: {e}") from e

    def reset(self) -> None:
        """Drop every request and start over: a fresh scheduler (every KV block free, the
        prefix cache emptied), the worker's per-request state cleared."""
        self._inflight = None
        self._guided.clear()
        self.states.clear()
        self.parents.clear()
        self._child_parent.clear()
        self.scheduler = self._new_scheduler()
        self.executor.reset()

    def shutdown(self) -> None:
        """Release the executor's workers (processes, devices)."""
        self.executor.shutdown()

    def check_health(self, timeout_s: float = 60.0) -> None:
        """Run one tiny greedy request end to end; raises if the device cannot serve."""
        rid = f"__health_check_{next(self._ids)}"
        self.add_request(rid, {"prompt_token_ids": [0]},
                         SamplingParams(max_tokens=1, temperature=0.0, detokenize=False))
        deadline = time.monotonic() + timeout_s
        try:
            while rid in self.states or self._inflight is not None:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"health check did not finish in {timeout_s} s")
                self._step()
        except BaseException:
            self.reset()
            raise

    def _step(self) -> list[RequestOutput | StepDelta]:
        t0 = time.perf_counter()
        inflight, self._inflight = self._inflight, None
        sched = self.scheduler.schedule()
        guided = self._guided_samplers(sched) if self._guided else []
        if inflight is None and all(self.states[rid].grammar is None for rid in guided):
            guided = []  # nothing in flight, no bitmask to fill: they sample at once
        sched.defer_sampling = bool(guided)
        t1 = time.perf_counter()
        handle = self.executor.execute_model_async(sched)
        outputs, num_prompt, num_gen = [], 0, 0
        if guided:
            # The forward pass runs while the host finishes the step before (whose tokens
            # advance the matchers) and fills the guided rows' bitmask; then they sample.
            if inflight is not None:
                outputs, num_prompt, num_gen = self._process(*inflight)
                inflight = None
            handle = self.executor.sample_tokens(self._grammar_bitmask(guided))
        t2 = time.perf_counter()
        if self.config.scheduler_config.async_scheduling and not sched.is_empty:
            self._inflight = (sched, handle)
            if inflight is not None:
                outputs, num_prompt, num_gen = self._process(*inflight)
        else:
            if inflight is not None:
                outputs, num_prompt, num_gen = self._process(*inflight)
            more, p2, g2 = self._process(sched, handle)
            outputs += more
            num_prompt, num_gen = num_prompt + p2, num_gen + g2
        self._account(sched, t0, t1, t2, num_prompt, num_gen)
        return outputs

    def _guided_samplers(self, sched) -> list[str]:
        """The requests of ``_guided`` that sample a token in ``sched``, in batch order."""
        for rid in [r for r in self._guided if r not in self.states]:
            self._guided.discard(rid)  # finished, aborted, failed
        requests = self.scheduler.requests
        # A scheduled request samples when its tokens reach its end: schedule() then
        # counted the token it will sample as pending.
        return [rid for rid in sched.num_scheduled_tokens
                if rid in self._guided and requests[rid].num_pending]

    def _grammar_bitmask(self, guided: list[str]):
        """The allowed next tokens of ``guided`` (requests that ended meanwhile, with the
        step before, are left out: their tokens are dropped)."""
        grammars = {}
        for rid in guided:
            state = self.states.get(rid)
            if state is not None and state.grammar is not None:
                grammars[rid] = state.grammar
        return self.processor.structured.step_bitmask(grammars)

    def _process(self, sched, handle) -> tuple[list[RequestOutput | StepDelta], int, int]:
        """Wait for a launched step's tokens and turn them into outputs."""
        tw = time.perf_counter()
        runner_out = handle.result()
        self._wait_s += time.perf_counter() - tw
        self.timings.prepare_s += runner_out.prepare_s
        failed = dict(runner_out.failed or {})
        if failed:  # their sampled tokens are not used
            keep = [i for i, rid in enumerate(runner_out.req_ids) if rid not in failed]
            runner_out.req_ids = [runner_out.req_ids[i] for i in keep]
            runner_out.sampled_token_ids = [runner_out.sampled_token_ids[i] for i in keep]
        new_tokens, finished = self.scheduler.update_from_output(sched, runner_out)
        for rid, chunk in (runner_out.prompt_logprobs or {}).items():
            state = self.states.get(rid)
            if state is not None and state.prompt_logprobs is not None:
                state.add_prompt_logprobs(chunk)
        finished_ids = {r.request_id for r in finished}
        lp = runner_out.logprobs or {}
        outputs: list[RequestOutput | StepDelta] = []
        stopped: list[str] = []
        num_prompt = 0
        for req, token in new_tokens:
            state = self.states.get(req.request_id)
            if state is None:
                continue
            if req.num_output_tokens == 1:
                num_prompt += req.num_prompt_tokens
                state.num_cached_tokens = req.num_cached_tokens
            if state.grammar is not None and not state.grammar.accept(token):
                # Only when other constraints (min_tokens, allowed_token_ids, bad_words)
                # left no token the grammar allows: end this request, not the batch, with
                # a client error naming the field.
                failed[req.request_id] = grammar_conflict(state.params,
                                                          req.num_output_tokens - 1)
                continue
            try:
                out, done = self._output_for(req, state, token, finished_ids, lp, stopped)
            except Exception as e:  # noqa: BLE001 - detokenization etc. of this request only
                logger.exception("request %s failed while its output was built",
                                 req.request_id)
                failed[req.request_id] = f"{type(e).__name__}: {e}"
                continue
            if out is not None:
                outputs.append(out)
            if done:
                del self.states[req.request_id]
                self._child_parent.pop(req.request_id, None)
        if stopped:
            self.scheduler.finish_requests(stopped, RequestStatus.FINISHED_STOPPED)
        if failed:
            outputs += self._fail_requests(failed)
        return outputs, num_prompt, len(new_tokens)

    def _output_for(self, req, state: RequestState, token: int, finished_ids: set[str],
                    lp: dict, stopped: list[str]
                    ) -> tuple[RequestOutput | StepDelta | None, bool]:
        """Fold one new token into its request's output state; (output to emit, done)."""
        done = req.request_id in finished_ids
        reason = req.status.finish_reason
        # As in vLLM, the EOS / stop token that ended a request is not part of its text.
        stop_token_end = (done and req.status == RequestStatus.FINISHED_STOPPED
                          and not state.params.include_stop_str_in_output)
        hit_stop = state.add_token(token, lp.get(req.request_id),
                                   detokenize=not stop_token_end)
        if hit_stop:
            # A stop string wins over a length cap reached on the same token.
            if not done:
                stopped.append(req.request_id)
            done, reason = True, "stop"
        stop_reason = state.detok.stop_reason if (
            hit_stop and state.detok is not None) else req.stop_reason
        out = state.make_output(done, reason, stop_reason)
        if out is None:
            return None, done
        link = self._child_parent.get(req.request_id)
        if out.__class__ is tuple:  # a StepDelta (state.plain)
            if link is not None:  # the parent's, at this sample's index
                out = (link[0].request_id, link[1], out[2], out[3])
            return out, done
        if link is not None:
            parent, index = link
            out = parent.add(index, out)
            if parent.done:
                self.parents.pop(parent.request_id, None)
        if out is not None and state.wants_plain:
            # Its first output went out (with the prompt's fields and logprobs): the later
            # ones can be plain. A sample's too: its parent's first output went out by now.
            state.plain = True
        return out, done

    def _fail_requests(self, failed: dict[str, str | tuple[str, str]]) -> list[RequestOutput]:
        """End requests whose own step work failed: their blocks go back to the pool now and
        each user request gets one final output carrying the error. A failed sample fails its
        whole parent (its siblings are aborted). A value is the reason, or (reason, field)
        when the request's own fields were at fault."""
        outputs: list[RequestOutput] = []
        done_parents: set[str] = set()
        for rid, message in failed.items():
            message, param = message if isinstance(message, tuple) else (message, None)
            state = self.states.pop(rid, None)
            link = self._child_parent.pop(rid, None)
            self.scheduler.finish_requests([rid], RequestStatus.FINISHED_ERROR)
            user_id = link[0].request_id if link is not None else rid
            if user_id in done_parents:
                continue
            if link is not None:
                done_parents.add(user_id)
                parent = self.parents.get(user_id)
                if parent is not None:
                    self.abort_request(user_id)  # the siblings
            out = RequestOutput(
                request_id=user_id, prompt=state.prompt if state else None,
                prompt_token_ids=state.prompt_token_ids if state else None,
                prompt_logprobs=None,
                outputs=[CompletionOutput(index=0, text="", token_ids=[],
                                          cumulative_logprob=None, logprobs=None,
                                          finish_reason="error")],
                finished=True, error=str(RequestFailedError(user_id, message)),
                error_param=param)
            outputs.append(out)
        return outputs

    def _account(self, sched, t0: float, t1: float, t2: float, num_prompt: int,
                 num_gen: int) -> None:
        """Timings, trace and stats of one step() call; ``sched`` is the step it launched."""
        t3 = time.perf_counter()
        wait, self._wait_s = self._wait_s, 0.0
        tm = self.timings
        tm.schedule_s += t1 - t0
        tm.execute_s += t2 - t1 + wait
        tm.output_s += t3 - t2 - wait
        tm.wall_s += t3 - t0
        num_tokens = sched.total_num_scheduled_tokens
        tm.steps += 1
        tm.decode_steps += num_tokens == len(sched.num_scheduled_tokens)
        tm.tokens += num_tokens
        if tm.trace is not None:
            running = self.scheduler.running
            tm.trace.append(StepTrace(
                len(running), len(sched.num_scheduled_tokens),
                sched.total_num_scheduled_tokens, t3 - t0,
                sum(r.num_computed_tokens for r in running),
                self.scheduler.kv.pool.num_used_blocks, t1 - t0, t2 - t1 + wait,
                t3 - t2 - wait, t0))
        self.last_stats = StepStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            num_scheduled_tokens=num_tokens,
            num_prompt_tokens=num_prompt,
            num_generation_tokens=num_gen,
            kv_cache_usage=self.scheduler.kv.usage,
            num_free_blocks=self.scheduler.kv.num_free_blocks,
            step_seconds=t3 - t0,
        )
