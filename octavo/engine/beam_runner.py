"""Runs beam searches on an LLMEngine, one token per live beam per round.

Design: every live beam becomes its own one-token request (the prompt plus the beam's tokens,
``max_tokens=1``, greedy, ``logprobs=K`` for the K candidate continuations the search needs);
when all of a prompt's beams have answered, `BeamSearch.advance` picks the next beams and they
are submitted as the next round. Beams forked from one parent share its KV blocks through
automatic prefix caching: the full blocks of their common prefix were registered in the cache
when the previous round computed them, so the next round finds them there (each request's
``num_cached_tokens`` shows it) and computes only its trailing partial block (fewer than
``block_size`` tokens). This is vLLM v1's design. We chose it over the scheduler's fork
(``Request.fork_of`` plus a partial-block copy) because that fork happens once, at admission,
from a running leader's prompt, while beams fork and die at every step from parents that are
done: doing that in the scheduler would need new request states there, whereas here nothing
below the engine changes and every block goes back to the pool as soon as its one-token
request ends (cached blocks stay findable until evicted). The price is recomputing up to
``block_size - 1`` tokens per beam per step; with ``enable_prefix_caching=False`` each beam
recomputes its whole prefix (still correct, only slower).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from octavo.beam_search import BeamSearchOutput, BeamSearchSequence
from octavo.engine.beam_search import Beam, BeamSearch, BeamSearchConfig
from octavo.engine.detokenizer import IncrementalDetokenizer
from octavo.engine.processor import PromptType
from octavo.errors import InvalidRequestError
from octavo.outputs import CompletionOutput, Logprob, RequestOutput
from octavo.sampling_params import BeamSearchParams, RequestOutputKind, SamplingParams

if TYPE_CHECKING:
    from octavo.engine.llm_engine import LLMEngine

# SamplingParams fields beam search does not implement: (field, value that means "unused").
_UNSUPPORTED_WITH_BEAMS = (
    ("stop", []), ("bad_words", []), ("logit_bias", None), ("allowed_token_ids", None),
    ("presence_penalty", 0.0), ("frequency_penalty", 0.0), ("repetition_penalty", 1.0),
    ("min_tokens", 0), ("prompt_logprobs", None),
)


@dataclass
class BeamJob:
    """One prompt's search and the engine requests of its current round."""

    request_id: str
    prompt_token_ids: list[int]
    prompt: str | None
    search: BeamSearch
    num_logprobs: int  # top logprobs each round's request asks for
    text_params: SamplingParams  # detokenization options of the final texts
    params: SamplingParams | BeamSearchParams
    priority: int = 0
    pending: dict[str, int] = field(default_factory=dict)  # engine request id -> beam index
    steps: list[dict[int, Logprob] | None] = field(default_factory=list)
    num_cached_tokens: int | None = None  # prompt tokens the first round found cached


def check_beam_params(params: SamplingParams) -> None:
    """The SamplingParams fields a ``use_beam_search=True`` request may not set
    (InvalidRequestError naming the first one set)."""
    for name, unused in _UNSUPPORTED_WITH_BEAMS:
        if getattr(params, name) != unused:
            raise InvalidRequestError(name, f"{name}={getattr(params, name)!r} is not "
                                      "supported with use_beam_search=True")


def _sampling_config(params: SamplingParams, max_tokens: int,
                     eos_token_ids: tuple[int, ...]) -> BeamSearchConfig:
    eos = frozenset() if params.ignore_eos else frozenset(eos_token_ids)
    stop_ids = frozenset(params.stop_token_ids) - eos
    return BeamSearchConfig(
        width=params.best_of or params.n, max_tokens=max_tokens,
        length_penalty=params.length_penalty, early_stopping=params.early_stopping,
        finish_token_ids=eos | stop_ids, stop_token_ids=stop_ids)


def _check_candidates(engine: LLMEngine, config: BeamSearchConfig, width_field: str) -> None:
    """Each round asks the engine for ``num_candidates`` logprobs per beam: refuse up front
    (naming the width) a search whose rounds the processor's max_logprobs cap would refuse
    midway."""
    processor = engine.processor
    limit = processor.max_logprobs
    need = min(config.num_candidates, processor.vocab_size)
    if limit != -1 and need > limit:
        raise InvalidRequestError(
            width_field, f"{width_field}={config.width} needs the {need} most likely next "
            f"tokens of every beam per step, more than max_logprobs={limit} (raise "
            "max_logprobs or narrow the beam)")


def validation_params(engine: LLMEngine, params: SamplingParams) -> SamplingParams:
    """What ``engine``'s processor should check for a request: for beam search, its own
    refusals raised here (InvalidRequestError naming the field) and the search flag cleared
    (the processor refuses beam search, which runs above it), so a server can validate a
    beam request on a worker thread before queueing anything. Other requests' params are
    returned as they are. Reads only immutable engine state: safe off the engine thread."""
    if not params.use_beam_search:
        return params
    check_beam_params(params)
    _check_candidates(engine, _sampling_config(params, 1, engine.config.model_config
                                               .eos_token_ids),
                      "best_of" if params.best_of else "n")
    checked = params.clone()
    # Beam-only knobs (SamplingParams validated them) reset too: the processor would warn
    # that a length_penalty without beam search is ignored.
    checked.use_beam_search = False
    checked.length_penalty, checked.early_stopping = 1.0, False
    return checked


class BeamSearchRunner:
    """Submits each job's rounds to the engine and folds the answers back in. Drive it by
    passing every output of ``engine.step()`` whose id it `owns` to `consume`."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._owner: dict[str, BeamJob] = {}  # round request id -> its job
        self._jobs: dict[str, BeamJob] = {}  # live jobs by request id

    # ------------------------------------------------------------------ building jobs
    def job_for_sampling(self, request_id: str, prompt: PromptType, params: SamplingParams,
                         priority: int = 0) -> BeamJob:
        """Validate a ``use_beam_search=True`` request (ValueError naming the field) and build
        its job; nothing is submitted yet."""
        check_beam_params(params)
        ids, text, room = self._prompt(prompt, params.truncate_prompt_tokens)
        config = _sampling_config(
            params, room if params.max_tokens is None else min(params.max_tokens, room),
            self._eos_ids())
        _check_candidates(self.engine, config, "best_of" if params.best_of else "n")
        return self._job(request_id, ids, text, config, params.logprobs or 0, params,
                         params, priority)

    def job_for_beam_params(self, request_id: str, prompt: PromptType,
                            params: BeamSearchParams) -> BeamJob:
        ids, text, room = self._prompt(prompt, None)
        config = BeamSearchConfig(
            width=params.beam_width, max_tokens=min(params.max_tokens, room),
            length_penalty=params.length_penalty,
            finish_token_ids=frozenset() if params.ignore_eos else frozenset(self._eos_ids()))
        _check_candidates(self.engine, config, "beam_width")
        text_params = SamplingParams(
            include_stop_str_in_output=params.include_stop_str_in_output)
        return self._job(request_id, ids, text, config, 0, text_params, params, 0)

    def _job(self, request_id, ids, text, config, user_logprobs, text_params, params,
             priority) -> BeamJob:
        vocab = self.engine.processor.vocab_size
        k = vocab if user_logprobs == -1 else max(config.num_candidates, user_logprobs)
        return BeamJob(request_id, ids, text, BeamSearch(config), min(k, vocab), text_params,
                       params, priority)

    def _eos_ids(self) -> tuple[int, ...]:
        return self.engine.config.model_config.eos_token_ids

    def _prompt(self, prompt: PromptType, truncate: int | None) -> tuple[list[int], str | None,
                                                                         int]:
        """Token ids, text and room left (>= 1) of a prompt, validated by the processor."""
        req, text = self.engine.processor.process(
            "validate", prompt, SamplingParams(max_tokens=None, truncate_prompt_tokens=truncate))
        return req.prompt_token_ids, text, req.max_tokens

    # ------------------------------------------------------------------ running
    def start(self, job: BeamJob) -> None:
        self._submit(job)
        self._jobs[job.request_id] = job

    def owns(self, request_id: str) -> bool:
        return request_id in self._owner

    def job_of(self, round_id: str) -> BeamJob:
        """The job a round request (one that `owns` is true for) belongs to."""
        return self._owner[round_id]

    def has_job(self, request_id: str) -> bool:
        return request_id in self._jobs

    def abort_job(self, request_id: str) -> None:
        """End one search: its round requests leave the engine (their KV blocks are freed).
        A no-op for an unknown or finished job."""
        job = self._jobs.pop(request_id, None)
        if job is None:
            return
        for rid in job.pending:
            self._owner.pop(rid, None)
        ids, job.pending = list(job.pending), {}
        self.engine.abort_request(ids)

    def forget(self) -> None:
        """Drop every job without touching the engine (it has dropped their requests
        already, as after a restart or at shutdown)."""
        self._owner.clear()
        self._jobs.clear()

    @property
    def num_pending(self) -> int:
        return len(self._owner)

    def consume(self, out: RequestOutput) -> BeamJob | None:
        """Take one round request's output; returns its job once the search has ended."""
        job = self._owner.pop(out.request_id)
        index = job.pending.pop(out.request_id)
        completion = out.outputs[0]
        if not completion.logprobs:
            raise RuntimeError(f"beam request {out.request_id} ended without logprobs "
                               f"({completion.finish_reason})")
        if job.num_cached_tokens is None:
            job.num_cached_tokens = out.num_cached_tokens
        job.steps[index] = completion.logprobs[0]
        if job.pending:
            return None
        job.search.advance(job.steps)  # type: ignore[arg-type]
        if job.search.done:
            self._jobs.pop(job.request_id, None)
            return job
        self._submit(job)
        return None

    def abort(self) -> None:
        ids = list(self._owner)
        self.forget()
        self.engine.abort_request(ids)

    def _submit(self, job: BeamJob) -> None:
        params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=job.num_logprobs,
                                ignore_eos=True, detokenize=False,
                                output_kind=RequestOutputKind.FINAL_ONLY)
        job.steps = [None] * len(job.search.running)
        for index, beam in enumerate(job.search.running):
            rid = f"{job.request_id}#beam{self.engine.next_request_id()}"
            self.engine.add_request(
                rid, {"prompt_token_ids": job.prompt_token_ids + beam.tokens}, params,
                priority=job.priority)
            job.pending[rid] = index
            self._owner[rid] = job


# ---------------------------------------------------------------------- outputs

def _decode(tokenizer, job: BeamJob, beam: Beam, finish_reason: str) -> str:
    params = job.text_params
    if tokenizer is None or not params.detokenize:
        return ""
    tokens = beam.tokens
    if finish_reason == "stop" and not params.include_stop_str_in_output:
        tokens = tokens[:-1]  # as for sampled requests: the ending token is not in the text
    detok = IncrementalDetokenizer(tokenizer, job.prompt_token_ids, params)
    for tok in tokens:
        detok.add_token(tok)
    detok.flush()
    return detok.text


def _top_logprobs(step: dict[int, Logprob], token: int, k: int) -> dict[int, Logprob]:
    """The chosen token plus the ``k`` most likely ones, as a sampled request reports them."""
    top = sorted(step.items(), key=lambda item: -item[1].logprob)[:k]
    out = dict(top)
    out[token] = step[token]
    return out


def request_output(job: BeamJob, tokenizer) -> RequestOutput:
    """The ``n`` best beams of a ``use_beam_search=True`` request as a RequestOutput."""
    params: SamplingParams = job.params  # type: ignore[assignment]
    outputs = []
    for index, beam in enumerate(job.search.finished[:params.n]):
        reason, stop_reason = job.search.finish_reason(beam)
        logprobs = None
        if params.logprobs is not None:
            k = len(beam.logprobs[0]) if params.logprobs == -1 else params.logprobs
            logprobs = [_top_logprobs(step, tok, k) for step, tok in zip(beam.logprobs,
                                                                          beam.tokens)]
        outputs.append(CompletionOutput(
            index=index, text=_decode(tokenizer, job, beam, reason), token_ids=list(beam.tokens),
            cumulative_logprob=beam.cum_logprob, logprobs=logprobs, finish_reason=reason,
            stop_reason=stop_reason))
    return RequestOutput(
        request_id=job.request_id, prompt=job.prompt, prompt_token_ids=job.prompt_token_ids,
        prompt_logprobs=None, outputs=outputs, finished=True,
        num_cached_tokens=job.num_cached_tokens)


def beam_search_output(job: BeamJob, tokenizer) -> BeamSearchOutput:
    """Every kept beam (``beam_width`` of them), best first, as vLLM's BeamSearchOutput."""
    sequences = []
    for beam in job.search.finished:
        reason, stop_reason = job.search.finish_reason(beam)
        sequences.append(BeamSearchSequence(
            tokens=job.prompt_token_ids + beam.tokens, logprobs=list(beam.logprobs),
            cum_logprob=beam.cum_logprob, text=_decode(tokenizer, job, beam, reason),
            finish_reason=reason, stop_reason=stop_reason, score=beam.score,
            num_prompt_tokens=len(job.prompt_token_ids)))
    return BeamSearchOutput(sequences=sequences)

