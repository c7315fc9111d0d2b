"""Sampling parameters for text generation (public API, vLLM-compatible names).

Pure Python on purpose: this module must never import torch, so that API validation,
the scheduler and the OpenAI server can use it without touching a device.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from enum import Enum, IntEnum
from typing import Any

from octavo.errors import InvalidRequestError, check_text
from octavo.errors import short_repr as _short
from octavo.structured_output.params import (
    GuidedDecodingParams,
    StructuredOutputsParams,
    as_structured_outputs,
)

__all__ = ["BeamSearchParams", "GuidedDecodingParams", "RequestOutputKind", "SamplingParams",
           "SamplingType", "StructuredOutputsParams"]

# Temperatures below this are treated as greedy decoding.
_SAMPLING_EPS = 1e-5
# The widest integer a request may carry: every count, id and seed ends up in an int64
# tensor or a C long somewhere, so anything wider is refused here, not overflowed later.
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
# Values that travel in float32 tensors (temperature, logit_bias) must fit one: past this
# they would become inf there.
FLOAT32_MAX = 3.4e38
# top_k travels as an int32 on some kernels; a larger value means "the whole vocabulary".
TOP_K_MAX = 2**31 - 1


class SamplingType(IntEnum):
    """How the next token is chosen; the sampler batches requests by this."""

    GREEDY = 0
    RANDOM = 1
    RANDOM_SEED = 2


class RequestOutputKind(Enum):
    """What each streamed RequestOutput carries."""

    CUMULATIVE = 0  # all text/tokens generated so far
    DELTA = 1  # only what is new since the previous output
    FINAL_ONLY = 2  # nothing until the request finishes


# --------------------------------------------------------------------------- helpers


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _fail(name: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(name, message)


def _as_float(name: str, value: Any, limit: float | None = None) -> float:
    """Return `value` as a finite float (of magnitude at most ``limit``) or raise an error
    naming the field."""
    if not _is_number(value):
        raise _fail(name, f"{name} must be a number, got {_short(value)}")
    try:
        value = float(value)
    except OverflowError:  # an int too large for a double
        raise _fail(name, f"{name} is out of range, got {_short(value)}") from None
    if not math.isfinite(value):
        raise _fail(name, f"{name} must be finite, got {value!r}")
    if limit is not None and abs(value) > limit:
        raise _fail(name, f"{name} must be within [-{limit:g}, {limit:g}], got {value!r}")
    return value


def _check_int(name: str, value: Any, lo: int = INT64_MIN, hi: int = INT64_MAX) -> int:
    if not _is_int(value):
        raise _fail(name, f"{name} must be an integer, got {_short(value)}")
    if not lo <= value <= hi:
        raise _fail(name, f"{name} must be in [{lo}, {hi}], got {_short(value)}")
    return value


def _check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _fail(name, f"{name} must be a bool, got {_short(value)}")
    return value


def _token_id_list(name: str, value: Any) -> list[int]:
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise _fail(name, f"{name} must be a list of token ids, got {_short(value)}")
    out = list(value)
    for tok in out:
        if not _is_int(tok) or not 0 <= tok <= INT64_MAX:
            raise _fail(name, f"{name} must contain non-negative integer token ids, got "
                        f"{_short(tok)}")
    # Without repeats (first occurrence kept): each step of the request builds its masks
    # from these lists, and a million copies of a few ids slowed every step of the batch.
    return list(dict.fromkeys(out))


def _str_list(name: str, value: Any) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, Iterable) or isinstance(value, (bytes, Mapping)):
        raise _fail(name, f"{name} must be a string or a list of strings, got {_short(value)}")
    out = list(value)
    for s in out:
        if not isinstance(s, str):
            raise _fail(name, f"{name} must contain only strings, got {_short(s)}")
        if s == "":
            raise _fail(name, f"{name} cannot contain an empty string, got {_short(out)}")
        check_text(name, s)
    return out


# --------------------------------------------------------------------------- SamplingParams


@dataclass(eq=True)
class SamplingParams:
    """Sampling parameters for one request.

    Field names, defaults and meaning follow vLLM / the OpenAI completions API.
    Normalisation done at construction (visible on the attributes):
      * `stop` -> list[str], `stop_token_ids` -> list[int], `bad_words` -> list[str]
      * `top_k == -1` -> 0 (0 means "disabled"; use `top_k_enabled`)
      * `logit_bias` keys -> int (OpenAI clients send string keys), values -> float
      * greedy (temperature < 1e-5): top_p=1.0, top_k=0, min_p=0.0
      * `output_kind` ints -> RequestOutputKind
    """

    n: int = 1
    best_of: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    truncate_prompt_tokens: int | None = None
    use_beam_search: bool = False
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    # Offline only: callables ``(output_token_ids, logits) -> logits`` or
    # ``(prompt_token_ids, output_token_ids, logits) -> logits`` applied to this request's
    # row (a 1-D float32 tensor of the vocabulary's logits) before sampling. One that raises
    # ends its own request with an error; the rest of the batch goes on.
    logits_processors: list[Any] | None = None
    # Constrain the output to a JSON schema / regex / choice / grammar (octavo.structured_output).
    # vLLM's newer name and its older one; either may be given, both then hold the same object.
    structured_outputs: StructuredOutputsParams | None = None
    guided_decoding: GuidedDecodingParams | None = None

    # Filled by update_from_generation_config(); not constructor arguments.
    eos_token_id: int | None = field(default=None, init=False, repr=False, compare=False)
    _all_stop_token_ids: set[int] = field(
        default_factory=set, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        self._verify()
        self._all_stop_token_ids = set(self.stop_token_ids)

    # ------------------------------------------------------------------ validation

    def _verify(self) -> None:
        """Validate and normalise every field; raise ValueError naming field and value."""
        # -- counts
        # (Upper bounds on n, best_of and logprobs depend on the engine: the processor.)
        _check_int("n", self.n)
        if self.n < 1:
            raise _fail("n", f"n must be at least 1, got {self.n}")
        if self.best_of is not None:
            _check_int("best_of", self.best_of)
            if self.best_of < self.n:
                raise _fail("best_of", f"best_of must be greater than or equal to n, got "
                            f"n={self.n} and best_of={self.best_of}")

        # -- penalties
        self.presence_penalty = _as_float("presence_penalty", self.presence_penalty)
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise _fail("presence_penalty",
                        f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        self.frequency_penalty = _as_float("frequency_penalty", self.frequency_penalty)
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise _fail("frequency_penalty",
                        f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}")
        self.repetition_penalty = _as_float("repetition_penalty", self.repetition_penalty,
                                            FLOAT32_MAX)
        if self.repetition_penalty <= 0.0:
            raise _fail("repetition_penalty",
                f"repetition_penalty must be greater than zero, got {self.repetition_penalty}"
            )

        # -- distribution shaping
        self.temperature = _as_float("temperature", self.temperature, FLOAT32_MAX)
        if self.temperature < 0.0:
            raise _fail("temperature",
                        f"temperature must be non-negative, got {self.temperature}")
        self.top_p = _as_float("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise _fail("top_p", f"top_p must be in (0, 1], got {self.top_p}")
        _check_int("top_k", self.top_k, hi=TOP_K_MAX)
        if self.top_k < -1:
            raise _fail("top_k",
                        f"top_k must be -1 or 0 (disabled) or at least 1, got {self.top_k}")
        if self.top_k == -1:
            self.top_k = 0
        self.min_p = _as_float("min_p", self.min_p)
        if not 0.0 <= self.min_p <= 1.0:
            raise _fail("min_p", f"min_p must be in [0, 1], got {self.min_p}")
        if self.seed is not None:
            # vLLM's range: any 64-bit seed, signed or not.
            _check_int("seed", self.seed, hi=2**64 - 1)

        # -- stopping
        self.stop = [] if self.stop is None else _str_list("stop", self.stop)
        self.stop_token_ids = (
            []
            if self.stop_token_ids is None
            else _token_id_list("stop_token_ids", self.stop_token_ids)
        )
        self.bad_words = [] if self.bad_words is None else _str_list("bad_words", self.bad_words)
        _check_bool("ignore_eos", self.ignore_eos)
        if self.max_tokens is not None:
            _check_int("max_tokens", self.max_tokens)
            if self.max_tokens < 1:
                raise _fail("max_tokens",
                            f"max_tokens must be at least 1, got {self.max_tokens}")
        _check_int("min_tokens", self.min_tokens)
        if self.min_tokens < 0:
            raise _fail("min_tokens",
                        f"min_tokens must be greater than or equal to 0, got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise _fail("min_tokens", f"min_tokens must be less than or equal to "
                        f"max_tokens={self.max_tokens}, got {self.min_tokens}")

        # -- logprobs
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is None:
                continue
            _check_int(name, value)
            if value < -1:
                raise _fail(name, f"{name} must be non-negative (or -1 for the full "
                            f"vocabulary), got {value}")

        # -- detokenization flags
        for name in (
            "detokenize",
            "skip_special_tokens",
            "spaces_between_special_tokens",
            "include_stop_str_in_output",
            "use_beam_search",
        ):
            _check_bool(name, getattr(self, name))
        if self.stop and not self.detokenize:
            raise _fail("stop", f"stop strings need detokenize=True, got stop="
                        f"{_short(self.stop)} with detokenize=False")

        # -- logits restrictions
        if self.logit_bias is not None:
            self.logit_bias = self._normalise_logit_bias(self.logit_bias)
        if self.logits_processors is not None:
            if isinstance(self.logits_processors, (str, bytes, Mapping)) or not isinstance(
                    self.logits_processors, Iterable):
                raise _fail("logits_processors", "logits_processors must be a list of "
                            f"callables, got {_short(self.logits_processors)}")
            self.logits_processors = list(self.logits_processors)
            for fn in self.logits_processors:
                if not callable(fn):
                    raise _fail("logits_processors", "logits_processors must contain "
                                f"callables, got {_short(fn)}")
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = _token_id_list("allowed_token_ids", self.allowed_token_ids)
            if not self.allowed_token_ids:
                raise _fail("allowed_token_ids", f"allowed_token_ids must not be empty, got "
                            f"{self.allowed_token_ids!r}")

        # -- output / prompt handling
        if not isinstance(self.output_kind, RequestOutputKind):
            try:
                self.output_kind = RequestOutputKind(self.output_kind)
            except (ValueError, TypeError):
                raise _fail("output_kind", f"output_kind must be a RequestOutputKind (0, 1 or "
                            f"2), got {_short(self.output_kind)}") from None
        if self.truncate_prompt_tokens is not None:
            _check_int("truncate_prompt_tokens", self.truncate_prompt_tokens)
            if self.truncate_prompt_tokens < 1 and self.truncate_prompt_tokens != -1:
                raise _fail("truncate_prompt_tokens", "truncate_prompt_tokens must be at "
                            "least 1 (or -1 for the model's maximum length), got "
                            f"{self.truncate_prompt_tokens}")

        # -- beam search knobs
        self.length_penalty = _as_float("length_penalty", self.length_penalty)
        if not (isinstance(self.early_stopping, bool) or self.early_stopping == "never"):
            raise _fail("early_stopping", f"early_stopping must be True, False or 'never', "
                        f"got {_short(self.early_stopping)}")
        if self.use_beam_search and self.temperature >= _SAMPLING_EPS:
            raise _fail("temperature", f"temperature must be 0 when use_beam_search=True, "
                        f"got {self.temperature}")

        # -- structured outputs
        self._verify_structured_outputs()

        # -- greedy: the shaping knobs are meaningless, make them neutral
        if self.temperature < _SAMPLING_EPS:
            self.top_p = 1.0
            self.top_k = 0
            self.min_p = 0.0

    def _verify_structured_outputs(self) -> None:
        so, gd = self.structured_outputs, self.guided_decoding
        if so is not None:
            so = as_structured_outputs("structured_outputs", so)
        if gd is not None:
            gd = as_structured_outputs("guided_decoding", gd)
        if so is not None and gd is not None and so is not gd and so != gd:
            raise _fail("structured_outputs", "give structured_outputs or guided_decoding "
                        "(its older name), not both")
        so = so if so is not None else gd
        self.structured_outputs = self.guided_decoding = so
        if so is not None and self.use_beam_search:
            raise _fail("structured_outputs", "structured outputs are not supported with "
                        "use_beam_search=True")

    @staticmethod
    def _normalise_logit_bias(bias: Any) -> dict[int, float]:
        if not isinstance(bias, Mapping):
            raise _fail("logit_bias",
                        f"logit_bias must be a dict of token id -> bias, got {_short(bias)}")
        out: dict[int, float] = {}
        for key, value in bias.items():
            tok = key
            if isinstance(key, str):
                try:
                    tok = int(key)
                except ValueError:  # not a number, or too many digits to parse
                    tok = None
            if not _is_int(tok) or not 0 <= tok <= INT64_MAX:
                raise _fail("logit_bias", f"logit_bias keys must be non-negative token ids, "
                            f"got {_short(key)}")
            if not _is_number(value):
                raise _fail("logit_bias", f"logit_bias[{_short(key)}] must be a number, got "
                            f"{_short(value)}")
            out[tok] = _as_float("logit_bias", value, FLOAT32_MAX)
        return out

    # ------------------------------------------------------------------ derived

    @property
    def sampling_type(self) -> SamplingType:
        if self.temperature < _SAMPLING_EPS:
            return SamplingType.GREEDY
        if self.seed is not None:
            return SamplingType.RANDOM_SEED
        return SamplingType.RANDOM

    @property
    def top_k_enabled(self) -> bool:
        """True when top-k filtering applies (top_k >= 1)."""
        return self.top_k > 0

    @property
    def all_stop_token_ids(self) -> set[int]:
        """stop_token_ids plus every EOS id (even with ignore_eos): masked while < min_tokens."""
        return self._all_stop_token_ids

    @property
    def output_text_buffer_length(self) -> int:
        """Characters a streaming detokenizer must hold back so stop strings are never emitted."""
        if not self.stop or self.include_stop_str_in_output:
            return 0
        return max(len(s) for s in self.stop) - 1

    def update_from_generation_config(
        self,
        generation_config: Mapping[str, Any] | None = None,
        model_eos_token_id: int | None = None,
    ) -> None:
        """Fold the model's EOS ids into this request's stop conditions.

        `model_eos_token_id` (the tokenizer's EOS) becomes `eos_token_id`: it stops the
        request unless `ignore_eos`. Extra ids from `generation_config["eos_token_id"]`
        (int or list) become regular stop tokens unless `ignore_eos`. All of them join
        `all_stop_token_ids` regardless, so min_tokens can mask them.
        """
        if model_eos_token_id is not None:
            self.eos_token_id = model_eos_token_id
            self._all_stop_token_ids.add(model_eos_token_id)
        eos_ids = (generation_config or {}).get("eos_token_id")
        if eos_ids is None:
            return
        extra = {eos_ids} if _is_int(eos_ids) else set(eos_ids)
        extra.discard(model_eos_token_id)
        if not extra:
            return
        self._all_stop_token_ids.update(extra)
        if not self.ignore_eos:
            self.stop_token_ids = self.stop_token_ids + sorted(
                extra.difference(self.stop_token_ids)
            )

    def clone(self) -> SamplingParams:
        """Deep copy (lists, dicts and the stop-id set are independent); logits processors
        are shared, not copied (they may hold state or resources deepcopy cannot clone)."""
        procs = self.logits_processors
        memo = {id(procs): None} if procs is not None else {}
        clone = copy.deepcopy(self, memo)
        clone.logits_processors = None if procs is None else list(procs)
        return clone

    def __repr__(self) -> str:
        parts = [f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.repr]
        return f"SamplingParams({', '.join(parts)})"


# --------------------------------------------------------------------------- beam search


@dataclass
class BeamSearchParams:
    """Parameters for `LLM.beam_search` (kept separate from sampling, as in vLLM)."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        self._verify()

    def _verify(self) -> None:
        _check_int("beam_width", self.beam_width)
        if self.beam_width < 1:
            raise _fail("beam_width", f"beam_width must be at least 1, got {self.beam_width}")
        _check_int("max_tokens", self.max_tokens)
        if self.max_tokens < 1:
            raise _fail("max_tokens", f"max_tokens must be at least 1, got {self.max_tokens}")
        _check_bool("ignore_eos", self.ignore_eos)
        self.temperature = _as_float("temperature", self.temperature)
        if self.temperature < 0.0:
            raise _fail("temperature", f"temperature must be non-negative, got {self.temperature}")
        self.length_penalty = _as_float("length_penalty", self.length_penalty)
        _check_bool("include_stop_str_in_output", self.include_stop_str_in_output)
