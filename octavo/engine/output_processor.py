"""Per-request output state: detokenization, stop strings, logprobs, RequestOutput building."""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from octavo.core.request import Request
from octavo.engine.detokenizer import IncrementalDetokenizer
from octavo.flat_logprobs import FlatLogprobs
from octavo.outputs import CompletionOutput, RequestOutput
from octavo.sampling_params import RequestOutputKind, SamplingParams


def samples_after_history(params: SamplingParams) -> bool:
    """Whether a request's sampling reads its latest tokens on the host: bad words, logit
    processors over the output, min_tokens (and structured outputs, whose matcher must have
    accepted the latest token). With asynchronous scheduling its step's forward pass is
    launched while the step before is in flight; the engine then processes that step (the
    worker's token lists and the matchers take its tokens) and only then samples
    (``LLMEngine._step``, the worker's ``defer_sampling``). Penalties do not: under
    asynchronous scheduling the worker counts sampled tokens on the device
    (``octavo.sample.penalty_rows``); logit_bias and allowed_token_ids are fixed."""
    return (bool(params.bad_words) or bool(params.logits_processors)
            or params.min_tokens > 0 or params.structured_outputs is not None)


@dataclass
class RequestTimes:
    """time.monotonic() stamps of a request: arrival and first admission to the batch."""

    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None = None

    def __reduce__(self):  # positional: pickles small and loads fast (see RequestOutput)
        return (type(self), (self.arrival_time, self.first_scheduled_time,
                             self.first_token_time))

    @property
    def queue_seconds(self) -> float | None:
        if self.first_scheduled_time is None:
            return None
        return self.first_scheduled_time - self.arrival_time


# An unfinished DELTA output as plain values, for a consumer that forwards deltas as they are
# (an engine process's sink): (request_id, completion index, new text, new token ids). No
# logprobs, finish reason or prompt fields: a request with any of those gets a RequestOutput.
StepDelta = tuple[str, int, str, list[int]]


class RequestState:
    def __init__(self, request: Request, prompt: str | None, tokenizer) -> None:
        self.request_id = request.request_id
        self.prompt = prompt
        self.prompt_token_ids = request.prompt_token_ids
        self.params: SamplingParams = request.sampling_params
        # Its sampling waits for the step before to be processed (no overlap lost).
        self.samples_late = samples_after_history(self.params)
        # The request's grammar matcher (structured outputs), set by the engine.
        self.grammar = None
        self.detok = (IncrementalDetokenizer(tokenizer, request.prompt_token_ids, self.params)
                      if tokenizer is not None and self.params.detokenize else None)
        self.token_ids: list[int] = []
        # Flat lists, not a dict of Logprob objects per position (octavo/flat_logprobs.py:
        # the garbage collector's full passes walked every one of them).
        self.logprobs: FlatLogprobs | None = (
            FlatLogprobs() if self.params.logprobs is not None else None)
        self.cumulative_logprob: float | None = (
            0.0 if self.params.logprobs is not None else None)
        self.prompt_logprobs: FlatLogprobs | None = (
            FlatLogprobs([None]) if self.params.prompt_logprobs is not None else None)
        self.sent_prompt_logprobs = False
        self.num_cached_tokens = 0
        self.request = request  # for timing metrics (arrival, first scheduled)
        self.sent_tokens = 0
        self.sent_text = 0
        self.tokenizer = tokenizer
        self._decode_fn = None
        self._last_times: RequestTimes | None = None
        # Text a DELTA stream holds back while it may be the start of a stop string.
        self._hold = self.params.output_text_buffer_length
        # Set by the engine once this request's first output went out, for a consumer that
        # asked for plain deltas: each later unfinished output is then a ``StepDelta``.
        self.plain = False
        self.wants_plain = False  # plain_deltas asked for, and the request allows them

    def add_token(self, token: int, logprob_info, detokenize: bool = True) -> bool:
        """Record a token; True when a stop string ended the request. ``detokenize=False``
        keeps the token out of the text (the EOS / stop token that ended the request)."""
        self.token_ids.append(token)
        if logprob_info is not None and self.logprobs is not None:
            lp, rank, top_ids, top_lps = logprob_info
            self.cumulative_logprob += lp
            self.logprobs.append_position(token, lp, rank, top_ids, top_lps, self._decode)
        return self.detok.add_token(token) if self.detok is not None and detokenize else False

    def add_prompt_logprobs(self, chunk) -> None:
        """Entries for prompt tokens start+1 .. (a recomputed chunk after a preemption
        repeats positions already recorded; those are skipped)."""
        start, targets, lps, ranks, top_ids, top_lps = chunk
        for j, (tok, lp, rank) in enumerate(zip(targets, lps, ranks)):
            if len(self.prompt_logprobs) != start + j + 1:
                continue
            self.prompt_logprobs.append_position(
                tok, lp, rank, top_ids[j] if top_ids is not None else (),
                top_lps[j] if top_ids is not None else (), self._decode)

    @property
    def _decode(self):
        """id -> its token string, or None without a tokenizer (built at first use)."""
        if self.tokenizer is None:
            return None
        if self._decode_fn is None:
            self._decode_fn = token_strings(self.tokenizer)
        return self._decode_fn

    def plain_delta(self) -> StepDelta | None:
        """The step's new text and token ids, as ``make_output`` would put them in a DELTA
        output of an unfinished request (``plain`` requests: no logprobs, the prompt's
        logprobs sent already), without building one; None when there is nothing new."""
        text, token_ids, _ = self._take_delta(False)
        if not token_ids and not text:
            return None
        return (self.request_id, 0, text, token_ids)

    def _take_delta(self, finished: bool) -> tuple[str, list[int], list | None]:
        """(text, token ids, logprobs) not sent yet, marked sent. Unfinished, the text that
        may turn out to start a stop string is held back."""
        text = ""
        if self.detok is not None:  # only the part not sent yet is read
            upto = max(self.sent_text, self.detok.text_len - (0 if finished else self._hold))
            text, self.sent_text = self.detok.text_since(self.sent_text, upto), upto
        n = self.sent_tokens
        token_ids = self.token_ids[n:]
        logprobs = self.logprobs[n:] if self.logprobs is not None else None
        self.sent_tokens = len(self.token_ids)
        return text, token_ids, logprobs

    def make_output(self, finished: bool, finish_reason: str | None,
                    stop_reason) -> RequestOutput | StepDelta | None:
        kind = self.params.output_kind
        if self.plain and not finished:
            return self.plain_delta()
        if kind == RequestOutputKind.FINAL_ONLY and not finished:
            return None
        if finished and self.detok is not None:
            if stop_reason is None or isinstance(stop_reason, int):
                self.detok.flush()
        if kind == RequestOutputKind.DELTA:
            text, token_ids, logprobs = self._take_delta(finished)
            if not finished and not token_ids and not text:
                return None
        else:
            text = self.detok.text if self.detok is not None else ""
            token_ids, logprobs = self.token_ids, self.logprobs
        prompt_lp = self.prompt_logprobs
        if kind == RequestOutputKind.DELTA:
            prompt_lp, self.sent_prompt_logprobs = (
                None if self.sent_prompt_logprobs else prompt_lp), True
        # Positional, and no second copy of a DELTA's fresh slice: built for every request
        # at every step of a stream.
        completion = CompletionOutput(
            0, text, token_ids if kind == RequestOutputKind.DELTA else list(token_ids),
            self.cumulative_logprob, logprobs, finish_reason if finished else None,
            stop_reason if finished else None)
        return RequestOutput(self.request_id, self.prompt, self.prompt_token_ids, prompt_lp,
                             [completion], finished, self._times(), self.num_cached_tokens)

    def _times(self) -> RequestTimes:
        """The request's stamps; one object while they hold (they change at most twice)."""
        r = self.request
        t = self._last_times
        if (t is None or t.first_token_time != r.first_token_time
                or t.first_scheduled_time != r.first_scheduled_time
                or t.arrival_time != r.arrival_time):
            t = self._last_times = RequestTimes(r.arrival_time, r.first_scheduled_time,
                                                r.first_token_time)
        return t


_TOKEN_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def token_strings(tokenizer):
    """id -> ``tokenizer.convert_ids_to_tokens(id)``, read from a table of the whole vocabulary
    built once per tokenizer (one call for every id: ~0.5 us each, and logprobs=5 names six
    tokens a position, ~0.4 ms of a 130-row step); ids past it ask the tokenizer."""
    try:
        table = _TOKEN_TABLES.get(tokenizer)
    except TypeError:  # not weak-referenceable or hashable: one table per request then
        table = None
    if table is None:
        table = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        try:  # (the table holds strings only: the tokenizer stays collectable)
            _TOKEN_TABLES[tokenizer] = table
        except TypeError:
            pass
    n = len(table)
    convert = tokenizer.convert_ids_to_tokens

    def decode(tid: int) -> str | None:
        return table[tid] if 0 <= tid < n else convert(tid)

    return decode
