"""Validates prompts and sampling parameters at the boundary and builds Requests."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from octavo.config import ModelConfig
from octavo.core.request import Request
from octavo.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

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


class Processor:
    def __init__(self, model_config: ModelConfig, tokenizer) -> None:
        self.model_config = model_config
        self.tokenizer = tokenizer
        self.vocab_size = model_config.hf_config.vocab_size
        self._warned: set[str] = set()

    def process(self, request_id: str, prompt: PromptType, params: SamplingParams | None,
                priority: int = 0, arrival_time: float | None = None
                ) -> tuple[Request, str | None]:
        params = SamplingParams() if params is None else params
        self.check_params(params)
        text, ids = self._tokenize(prompt)
        max_len = self.model_config.max_model_len
        keep = params.truncate_prompt_tokens
        if keep is not None:
            # As in vLLM: truncation (keep the last tokens; -1 = max_model_len) comes before
            # the length check, so it can rescue an overlong prompt.
            if keep == -1:
                keep = max_len
            elif keep > max_len:
                raise ValueError(f"truncate_prompt_tokens={keep} is larger than "
                                 f"max_model_len={max_len}")
            ids = ids[-keep:]
        if len(ids) > max_len:
            raise ValueError(
                f"prompt has {len(ids)} tokens, longer than max_model_len={max_len}")
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
            raise ValueError(f"sampling_params must be SamplingParams, got {type(params).__name__}")
        ranks = params.use_beam_search or (params.best_of or params.n) > params.n
        if params.length_penalty != 1.0 and not ranks:
            self._warn_once("length_penalty", f"length_penalty={params.length_penalty} has no "
                            "effect without beam search (or best_of > n); it is ignored")
        for field, bad, what in _UNSUPPORTED:
            if bad(params):
                raise ValueError(f"{what} is not supported yet ({field}="
                                 f"{getattr(params, field)!r})")
        if params.stop and (self.tokenizer is None or not params.detokenize):
            raise ValueError(f"stop={params.stop!r} needs detokenization (a tokenizer and "
                             "detokenize=True)")
        self._check_token_ids(params)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message)

    def _check_token_ids(self, params: SamplingParams) -> None:
        for field in ("allowed_token_ids", "logit_bias"):
            ids = getattr(params, field)
            for t in ids or ():
                if not 0 <= int(t) < self.vocab_size:
                    raise ValueError(f"{field} holds token id {t}, outside the vocabulary "
                                     f"[0, {self.vocab_size})")

    def _bad_words(self, words: list[str]) -> list[list[int]]:
        if self.tokenizer is None:
            raise ValueError(f"bad_words={words!r} needs a tokenizer")
        seqs: list[list[int]] = []
        for word in words:
            # The word alone and after a space tokenize differently in most vocabularies.
            for text in (word, " " + word.lstrip()):
                ids = list(self.tokenizer.encode(text, add_special_tokens=False))
                if ids and ids not in seqs:
                    seqs.append(ids)
        return seqs

    def _tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt is empty")
            if self.tokenizer is None:
                raise ValueError("text prompts need a tokenizer (skip_tokenizer_init=True was "
                                 "set): pass {'prompt_token_ids': [...]}")
            return prompt, list(self.tokenizer.encode(prompt))
        if isinstance(prompt, Mapping):
            if "prompt_token_ids" in prompt:
                ids = prompt["prompt_token_ids"]
                text = prompt.get("prompt")
            elif "prompt" in prompt:
                return self._tokenize(prompt["prompt"])
            else:
                raise ValueError(f"prompt dict needs 'prompt' or 'prompt_token_ids', got keys "
                                 f"{sorted(prompt)}")
        elif isinstance(prompt, list | tuple):
            ids, text = prompt, None
        else:
            raise ValueError(f"prompt must be a string, a token id list or a dict, got "
                             f"{type(prompt).__name__}")
        ids = list(ids)
        if not ids:
            raise ValueError("prompt_token_ids is empty")
        for t in ids:
            if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < self.vocab_size:
                raise ValueError(f"prompt_token_ids holds {t!r}, not a token id in "
                                 f"[0, {self.vocab_size})")
        return text, ids
