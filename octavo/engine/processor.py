"""Validates prompts and sampling parameters at the boundary and builds Requests."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from octavo.config import ModelConfig
from octavo.core.request import Request
from octavo.errors import InvalidRequestError, check_text
from octavo.sampling_params import INT64_MAX, INT64_MIN, SamplingParams
from octavo.structured_output.manager import StructuredOutputManager

logger = logging.getLogger(__name__)

# bad_words lists tokenized lately. A server tokenizes a request's list on a worker thread
# when it validates, then the engine thread adds the request (each sample of n > 1 again):
# a list of 100k words takes seconds to tokenize, which must not happen on the engine thread.
BAD_WORDS_CACHE_SIZE = 16

PromptType = str | list[int] | Mapping[str, Any]

# Features a later milestone brings: rejected clearly instead of silently ignored.
_UNSUPPORTED = (
    # Beam search runs above the engine (octavo/engine/beam_runner.py): LLM.generate and
    # LLM.beam_search route it there; a request reaching the processor is not.
    ("use_beam_search", lambda p: p.use_beam_search,
     "beam search outside LLM.generate / LLM.beam_search"),
    ("prompt_logprobs", lambda p: p.prompt_logprobs is not None and (p.best_of or p.n) > 1,
     "prompt_logprobs with n > 1 or best_of > 1"),
)


def check_context_length(num_prompt_tokens: int, max_tokens: int | None,
                         max_model_len: int) -> None:
    """The servers' rule, as vLLM's: a prompt plus max_tokens beyond the context is refused
    (400), never silently cut short. (Offline generation clamps max_tokens instead.)"""
    if max_tokens is not None and num_prompt_tokens + max_tokens > max_model_len:
        raise InvalidRequestError(
            "max_tokens", f"This model's maximum context length is {max_model_len} tokens. "
            f"However, you requested {num_prompt_tokens + max_tokens} tokens "
            f"({num_prompt_tokens} in the prompt, {max_tokens} in the completion). Please "
            "reduce the length of the prompt or of max_tokens.")


_ONLY_INT = {int}  # the ids' types, all plain ints (a bool is not one)


class Processor:
    """Checks a request against the model before it is queued, so that nothing reaching the
    scheduler can make a step raise. Stateless apart from warn-once bookkeeping: servers may
    call it from a worker thread while the engine thread steps."""

    def __init__(self, model_config: ModelConfig, tokenizer, max_n: int | None = None,
                 structured_outputs_backend: str | None = None) -> None:
        self.model_config = model_config
        self.tokenizer = tokenizer
        self.vocab_size = model_config.hf_config.vocab_size
        # Compiles (and caches) constrained requests' grammars here, before they are queued:
        # a grammar that does not compile is the request's 400, never a step's fault.
        self.structured = StructuredOutputManager(
            tokenizer, self.vocab_size, tuple(model_config.eos_token_ids),
            structured_outputs_backend)
        self.max_logprobs = getattr(model_config, "max_logprobs", 20)
        self.max_n = max_n  # None: no cap on n / best_of
        self._warned: set[str] = set()
        self._bad_words_cache: OrderedDict[tuple[str, ...], list[list[int]]] = OrderedDict()
        self._bad_words_lock = threading.Lock()

    def process(self, request_id: str, prompt: PromptType, params: SamplingParams | None,
                priority: int = 0, arrival_time: float | None = None
                ) -> tuple[Request, str | None]:
        params = SamplingParams() if params is None else params
        self.check_params(params)
        if isinstance(priority, bool) or not isinstance(priority, int) or not (
                INT64_MIN <= priority <= INT64_MAX):
            raise InvalidRequestError("priority", f"priority must be a 64-bit integer, got "
                                      f"{str(priority)[:40]!r}")
        text, ids = self._tokenize(prompt)
        max_len = self.model_config.max_model_len
        keep = params.truncate_prompt_tokens
        if keep is not None:
            # As in vLLM: truncation (keep the last tokens; -1 = max_model_len) comes before
            # the length check, so it can rescue an overlong prompt.
            if keep == -1:
                keep = max_len
            elif keep > max_len:
                raise InvalidRequestError(
                    "truncate_prompt_tokens", f"truncate_prompt_tokens={keep} is larger than "
                    f"max_model_len={max_len}")
            ids = ids[-keep:]
        if len(ids) > max_len:
            raise InvalidRequestError(
                "prompt", f"prompt has {len(ids)} tokens, longer than max_model_len={max_len}")
        room = max_len - len(ids)
        max_tokens = room if params.max_tokens is None else min(params.max_tokens, max(room, 1))
        req = Request(request_id, ids, params,
                      eos_token_ids=frozenset(self.model_config.eos_token_ids),
                      arrival_time=arrival_time, priority=priority, max_tokens=max(max_tokens, 1))
        if params.bad_words:
            req.bad_words_token_ids = self._bad_words(params.bad_words)
        return req, text

    def check_params(self, params: SamplingParams) -> None:
        """The prompt-independent checks (a parent of parallel samples runs them once)."""
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError(
                "sampling_params",
                f"sampling_params must be SamplingParams, got {type(params).__name__}")
        self._check_limits(params)
        ranks = params.use_beam_search or (params.best_of or params.n) > params.n
        if params.length_penalty != 1.0 and not ranks:
            self._warn_once("length_penalty", f"length_penalty={params.length_penalty} has no "
                            "effect without beam search (or best_of > n); it is ignored")
        for field, bad, what in _UNSUPPORTED:
            if bad(params):
                raise InvalidRequestError(field, f"{what} is not supported yet ({field}="
                                          f"{getattr(params, field)!r})")
        if params.stop and (self.tokenizer is None or not params.detokenize):
            raise InvalidRequestError("stop", f"stop={params.stop!r} needs detokenization "
                                      "(a tokenizer and detokenize=True)")
        self._check_token_ids(params)
        if params.structured_outputs is not None:
            self.structured.compile(params.structured_outputs)

    def _check_limits(self, params: SamplingParams) -> None:
        """Counts bounded by the engine: a request must not be able to ask for work or output
        out of proportion to everyone else's."""
        cap = self.max_n
        if cap is not None:
            for field in ("n", "best_of"):
                value = getattr(params, field)
                if value is not None and value > cap:
                    raise InvalidRequestError(
                        field, f"{field}={value} is larger than this server's limit of {cap} "
                        "samples per request (max_n, at most max_num_seqs)")
        limit = self.max_logprobs
        for field in ("logprobs", "prompt_logprobs"):
            value = getattr(params, field)
            if value is None or limit == -1:
                continue
            asked = self.vocab_size if value == -1 else value
            if asked > limit:
                raise InvalidRequestError(
                    field, f"{field}={value} is larger than max_logprobs={limit} (the most "
                    "logprobs per position this engine returns)")

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message)

    def _check_token_ids(self, params: SamplingParams) -> None:
        for field in ("stop_token_ids", "allowed_token_ids", "logit_bias"):
            ids = getattr(params, field)
            for t in ids or ():
                if not 0 <= int(t) < self.vocab_size:
                    raise InvalidRequestError(
                        field, f"{field} holds token id {t}, outside the vocabulary "
                        f"[0, {self.vocab_size})")

    def _bad_words(self, words: list[str]) -> list[list[int]]:
        """Each word's token ids, alone and after a space, without duplicates (shared with
        every request that sends the same list: read-only)."""
        if self.tokenizer is None:
            raise InvalidRequestError("bad_words", f"bad_words={words!r} needs a tokenizer")
        key = tuple(words)
        with self._bad_words_lock:
            seqs = self._bad_words_cache.get(key)
            if seqs is not None:
                self._bad_words_cache.move_to_end(key)
                return seqs
        seqs = []
        seen: set[tuple[int, ...]] = set()  # (a list scan per word was quadratic)
        for word in words:
            # The word alone and after a space tokenize differently in most vocabularies.
            for text in (word, " " + word.lstrip()):
                ids = list(self.tokenizer.encode(text, add_special_tokens=False))
                if ids and tuple(ids) not in seen:
                    seen.add(tuple(ids))
                    seqs.append(ids)
        with self._bad_words_lock:
            self._bad_words_cache[key] = seqs
            while len(self._bad_words_cache) > BAD_WORDS_CACHE_SIZE:
                self._bad_words_cache.popitem(last=False)
        return seqs

    def _tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidRequestError("prompt", "prompt is empty")
            check_text("prompt", prompt)
            if self.tokenizer is None:
                raise InvalidRequestError(
                    "prompt", "text prompts need a tokenizer (skip_tokenizer_init=True was "
                    "set): pass {'prompt_token_ids': [...]}")
            return prompt, list(self.tokenizer.encode(prompt))
        if isinstance(prompt, Mapping):
            if "prompt_token_ids" in prompt:
                ids = prompt["prompt_token_ids"]
                text = prompt.get("prompt")
                if text is not None:
                    if not isinstance(text, str):
                        raise InvalidRequestError("prompt", f"prompt must be a string, got "
                                                  f"{type(text).__name__}")
                    check_text("prompt", text)
            elif "prompt" in prompt:
                return self._tokenize(prompt["prompt"])
            else:
                raise InvalidRequestError(
                    "prompt", f"prompt dict needs 'prompt' or 'prompt_token_ids', got keys "
                    f"{sorted(map(str, prompt))[:10]}")
        elif isinstance(prompt, list | tuple):
            ids, text = prompt, None
        else:
            raise InvalidRequestError("prompt", f"prompt must be a string, a token id list or "
                                      f"a dict, got {type(prompt).__name__}")
        if isinstance(ids, str | bytes | Mapping) or not hasattr(ids, "__iter__"):
            raise InvalidRequestError("prompt_token_ids", "prompt_token_ids must be a list of "
                                      f"token ids, got {type(ids).__name__}")
        ids = list(ids)
        if not ids:
            raise InvalidRequestError("prompt_token_ids", "prompt_token_ids is empty")
        # The common case in C loops (types, then the range): a Python loop over 1,024 ids
        # took ~0.5 ms, once in the server's process and again on the engine thread, where
        # a burst of 1,000 adds held the steps back by as much. Anything else, or an id out
        # of range, takes the loop below, which names the first bad one.
        if set(map(type, ids)) == _ONLY_INT and min(ids) >= 0 and max(ids) < self.vocab_size:
            return text, ids
        for t in ids:
            if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < self.vocab_size:
                shown = repr(t) if len(repr(t)) <= 40 else repr(t)[:40] + "..."
                raise InvalidRequestError(
                    "prompt_token_ids", f"prompt_token_ids holds {shown}, not a token id in "
                    f"[0, {self.vocab_size})")
        return text, ids
