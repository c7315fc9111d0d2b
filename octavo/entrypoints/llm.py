"""The offline API: ``LLM(model=...).generate(prompts, sampling_params)``, as in vLLM."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from octavo.beam_search import BeamSearchOutput
from octavo.engine.arg_utils import EngineArgs
from octavo.engine.beam_runner import (
    BeamJob,
    BeamSearchRunner,
    beam_search_output,
    request_output,
)
from octavo.engine.llm_engine import LLMEngine
from octavo.engine.processor import PromptType
from octavo.entrypoints.chat_utils import Conversation, apply_chat_template
from octavo.errors import InvalidRequestError, short_repr
from octavo.outputs import RequestOutput
from octavo.sampling_params import BeamSearchParams, RequestOutputKind, SamplingParams
from octavo.startup_heap import heap_frozen_while_running


def _with_prompt_index(error: ValueError, index: int) -> ValueError:
    """The same error, its message prefixed with the prompt's index (the field it names is
    kept, so callers can still tell which parameter was at fault)."""
    if isinstance(error, InvalidRequestError):
        return InvalidRequestError(error.param, f"prompt {index}: {error}")
    return ValueError(f"prompt {index}: {error}")


def _as_list(name: str, value: Any, what: str) -> list[Any]:
    """``value`` (a sequence) as a list; InvalidRequestError naming ``name`` for anything
    else (a string or a dict would be iterated into characters or keys, None not at all)."""
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        raise InvalidRequestError(name, f"{name} must be {what}, got "
                                  f"{short_repr(value)} ({type(value).__name__})")
    return list(value)


class LLM:
    """An engine for offline batched generation.

    Accepts vLLM's constructor arguments (model, tokenizer, dtype, seed, max_model_len,
    max_num_seqs, max_num_batched_tokens, block_size, gpu_memory_utilization, swap_space,
    preemption_mode, enforce_eager, quantization, tensor_parallel_size, ...). ``model=None``
    runs the embedded default, SmolLM2-135M-Instruct.

    ``data_parallel_size=N`` (N > 1) runs N engine processes (Ray actors under
    ``distributed_executor_backend="ray"``), each ``tensor_parallel_size`` ranks, and spreads
    every ``generate`` over them, least loaded first; outputs stay in input order. Scripts
    then need the ``if __name__ == "__main__":`` guard (the processes are spawned);
    ``llm.llm_engine.shutdown()`` stops them. ``beam_search`` needs one engine.
    """

    def __init__(self, model: str | None = None, tokenizer: str | None = None,
                 dtype: str = "auto", seed: int = 0, data_parallel_size: int = 1,
                 **kwargs: Any) -> None:
        unknown = set(kwargs) - EngineArgs.field_names()
        if unknown:
            raise ValueError(f"unknown LLM arguments: {sorted(unknown)}")
        from octavo.replicas.router import check_num_replicas

        check_num_replicas(data_parallel_size, "data_parallel_size")
        args = EngineArgs(model=model, tokenizer=tokenizer, dtype=dtype, seed=seed, **kwargs)
        self._replicas = None
        if data_parallel_size > 1:
            from octavo.replicas.offline import OfflineReplicas

            self._replicas = OfflineReplicas(args, data_parallel_size)
            # Config, tokenizer and processor, no model: what generate validates with.
            self.llm_engine = self._replicas.front
        else:
            self.llm_engine = LLMEngine.from_engine_args(args)

    def get_tokenizer(self):
        return self.llm_engine.get_tokenizer()

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prompt prefix, so the next ``generate`` computes its prompts
        again (as vLLM's ``LLM.reset_prefix_cache``); True when reset. Between ``generate``
        calls the engine is idle, so this succeeds."""
        if self._replicas is not None:
            raise NotImplementedError(
                "reset_prefix_cache with data_parallel_size > 1: the replicas' caches live in "
                "their own processes and are not reachable from here yet")
        return self.llm_engine.reset_prefix_cache()

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        priority: list[int] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt; returns one finished RequestOutput per prompt, in order."""
        if isinstance(prompts, str | dict) or (
                isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = _as_list("prompts", prompts, "a prompt (text, token ids or a dict) or a list "
                           "of prompts")
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(prompts)
        else:
            params = _as_list("sampling_params", sampling_params,
                              "SamplingParams or a list of them, one per prompt")
            if len(params) != len(prompts):
                raise InvalidRequestError("sampling_params", f"got {len(params)} "
                                          f"sampling_params for {len(prompts)} prompts")
        if priority is not None:
            priority = _as_list("priority", priority, "a list of integers, one per prompt")
            if len(priority) != len(prompts):
                raise InvalidRequestError("priority", f"got {len(priority)} priority values for "
                                          f"{len(prompts)} prompts")
        engine = self.llm_engine
        if self._replicas is not None:
            return self._generate_on_replicas(prompts, params, priority, use_tqdm)
        beams = BeamSearchRunner(engine)
        jobs: dict[int, BeamJob] = {}
        # Validate everything before queueing anything, so a bad prompt leaves no orphans.
        for i, (p, sp) in enumerate(zip(prompts, params)):
            try:
                if isinstance(sp, SamplingParams) and sp.use_beam_search:
                    # Beam search runs as rounds of one-token requests (beam_runner.py).
                    jobs[i] = beams.job_for_sampling("", p, sp, priority[i] if priority else 0)
                else:
                    engine.processor.process("validate", p, sp)
            except ValueError as e:
                raise _with_prompt_index(e, i) from None
        ids = []
        try:
            for i, (p, sp) in enumerate(zip(prompts, params)):
                rid = engine.next_request_id()
                ids.append(rid)
                if i in jobs:
                    jobs[i].request_id = rid
                    beams.start(jobs[i])
                    continue
                if sp.output_kind != RequestOutputKind.FINAL_ONLY:
                    sp = sp.clone()
                    sp.output_kind = RequestOutputKind.FINAL_ONLY
                engine.add_request(rid, p, sp, priority=priority[i] if priority else 0)
            return self._run(ids, use_tqdm, beams)
        except BaseException:
            beams.abort()
            engine.abort_request(ids)
            raise

    def _generate_on_replicas(self, prompts: list[PromptType], params: list[SamplingParams],
                              priority: list[int] | None, use_tqdm: bool
                              ) -> list[RequestOutput]:
        """``generate`` over data-parallel replicas: everything validated here first (a bad
        prompt queues nothing), then each prompt is a request to the least-loaded replica,
        whose engine runs beam search (``use_beam_search``) itself."""
        from octavo.engine.beam_runner import validation_params
        from octavo.executor.base import check_picklable

        engine = self.llm_engine
        for i, (p, sp) in enumerate(zip(prompts, params)):
            try:
                check_picklable(sp)
                engine.processor.process("validate", p, validation_params(engine, sp))
            except ValueError as e:
                raise _with_prompt_index(e, i) from None
        return self._replicas.generate(prompts, params, priority, use_tqdm)

    def beam_search(
        self,
        prompts: PromptType | Sequence[PromptType],
        params: BeamSearchParams,
        use_tqdm: bool = False,
    ) -> list[BeamSearchOutput]:
        """Beam search for every prompt (strings or ``{"prompt_token_ids": [...]}`` dicts), as
        vLLM's ``LLM.beam_search``; returns one BeamSearchOutput per prompt, in order, each
        with its ``beam_width`` best beams, best first. Scores and stopping follow Hugging Face
        transformers' beam search (``early_stopping=False``); ``temperature`` is accepted for
        vLLM compatibility and, as there, does not change the (raw) logprobs beams are ranked
        by."""
        if not isinstance(params, BeamSearchParams):
            raise ValueError(f"params must be BeamSearchParams, got {type(params).__name__}")
        if isinstance(prompts, str | dict) or (
                isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        engine = self.llm_engine
        if self._replicas is not None:
            raise ValueError("LLM.beam_search runs on one engine, not over "
                             "data_parallel_size > 1 replicas yet; use generate() with "
                             "SamplingParams(use_beam_search=True), which they run")
        beams = BeamSearchRunner(engine)
        jobs = []
        for i, p in enumerate(prompts):
            try:
                jobs.append(beams.job_for_beam_params(engine.next_request_id(), p, params))
            except ValueError as e:
                raise _with_prompt_index(e, i) from None
        try:
            for job in jobs:
                beams.start(job)
            outs = self._run([job.request_id for job in jobs], use_tqdm, beams,
                             lambda job: beam_search_output(job, self.get_tokenizer()))
        except BaseException:
            beams.abort()
            raise
        return outs  # type: ignore[return-value]

    def chat(
        self,
        messages: Conversation | Sequence[Conversation],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
    ) -> list[RequestOutput]:
        """Generate replies to one conversation or a list of conversations (lists of
        {"role", "content"} dicts), formatted with the model's chat template."""
        if messages and isinstance(messages[0], Mapping):
            messages = [messages]  # type: ignore[list-item]
        tokenizer = self.get_tokenizer()
        template = chat_template or self.llm_engine.config.model_config.chat_template
        prompts = [apply_chat_template(tokenizer, conv, template, add_generation_prompt)
                   for conv in messages]
        # The template already holds the BOS/special tokens: do not add them again.
        ids = [{"prompt": p, "prompt_token_ids": tokenizer.encode(p, add_special_tokens=False)}
               for p in prompts]
        return self.generate(ids, sampling_params, use_tqdm=use_tqdm)

    def _run(self, ids: list[str], use_tqdm: bool, beams: BeamSearchRunner | None = None,
             beam_output: Callable[[BeamJob], Any] | None = None) -> list[Any]:
        """Step the engine until every request in ``ids`` is done. Outputs of beam-search
        rounds go to ``beams``; a finished search becomes ``beam_output(job)`` (by default a
        RequestOutput with the request's n best beams)."""
        engine = self.llm_engine
        order = {rid: i for i, rid in enumerate(ids)}
        results: list[Any] = [None] * len(ids)
        if beam_output is None:
            def beam_output(job: BeamJob) -> RequestOutput:
                return request_output(job, self.get_tokenizer())
        bar = None
        if use_tqdm:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(ids), desc="Processed prompts", dynamic_ncols=True,
                       postfix="est. speed input: 0.00 toks/s, output: 0.00 toks/s")
        t0 = time.perf_counter()
        in_toks = out_toks = 0
        with heap_frozen_while_running():  # no full GC pass over the startup heap
            while engine.has_unfinished_requests():
                for out in engine.step():
                    if beams is not None and beams.owns(out.request_id):
                        job = beams.consume(out)
                        if job is None:
                            continue
                        results[order[job.request_id]] = beam_output(job)
                        num_in = len(job.prompt_token_ids)
                        num_out = sum(len(beam.tokens) for beam in job.search.finished)
                    elif out.finished and out.request_id in order:
                        results[order[out.request_id]] = out
                        num_in = len(out.prompt_token_ids)
                        num_out = sum(len(c.token_ids) for c in out.outputs)
                    else:
                        continue
                    if bar is not None:
                        in_toks += num_in
                        out_toks += num_out
                        dt = time.perf_counter() - t0
                        bar.postfix = (f"est. speed input: {in_toks / dt:.2f} toks/s, "
                                       f"output: {out_toks / dt:.2f} toks/s")
                        bar.update(1)
        if bar is not None:
            bar.close()
        missing = [ids[i] for i, r in enumerate(results) if r is None]
        if missing:
            raise RuntimeError(f"requests {missing} ended without a final output")
        return results  # type: ignore[return-value]
