"""Incremental detokenization and stop strings.

Decoding the whole output every step is quadratic; decoding one token at a time breaks
multi-token characters and leading spaces. We decode a short window: the text of
ids[prefix:read] versus ids[prefix:], and emit the difference once it is complete (no
trailing replacement character).

The text grows in an ``io.StringIO``: ``str += delta`` on an attribute copies the whole text
every token (a 32k-token output took 0.14 s of the engine thread, a 128k one 5.9 s); a
step's readers take only its end (``text_since``), and the whole text is joined only where
an output needs it (``text``).
"""

from __future__ import annotations

import io
from collections.abc import Callable

from octavo.sampling_params import SamplingParams

_CONTEXT_TOKENS = 5  # prompt tokens kept as left context for the first decodes
# Tokens in the decode window that together decode to "" before it is dropped (see add_token).
_MAX_SILENT_WINDOW = 8


def rust_decoder(tokenizer, skip_special_tokens: bool) -> Callable[[list[int]], str] | None:
    """``ids -> text`` straight from a fast tokenizer's Rust backend, when that is exactly
    what ``tokenizer.decode`` would return (transformers 5's tokenizers-backed classes: their
    ``_decode`` is the backend's decode, and clean-up is off or skipped for BPE); else None.
    The streaming hot path: the Python wrapper (argument conversion, kwargs) cost several
    times the decode itself, twice per token."""
    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:
        return None
    cls = type(tokenizer)
    backend = getattr(tokenizer, "_tokenizer", None)
    if (not isinstance(tokenizer, TokenizersBackend) or backend is None
            or cls.decode is not PreTrainedTokenizerBase.decode
            or cls._decode is not TokenizersBackend._decode):
        return None
    if getattr(tokenizer, "clean_up_tokenization_spaces", False):
        model = getattr(getattr(tokenizer, "backend_tokenizer", None), "model", None)
        if type(model).__name__ != "BPE" or getattr(
                tokenizer, "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_"
                "output", False):
            return None  # the wrapper would clean the text up: keep it
    decode = backend.decode
    return lambda ids: decode(ids, skip_special_tokens=skip_special_tokens)


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self.tokenizer = tokenizer
        self.params = params
        ctx = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self.ids = ctx
        self.prefix_offset = 0
        self.read_offset = len(ctx)
        self._text = io.StringIO(newline="")  # no newline translation
        self.text_len = 0
        self.stop_reason: str | None = None
        self.max_stop_len = max((len(s) for s in params.stop), default=0)
        self.num_output_tokens = 0
        self._fast = rust_decoder(tokenizer, params.skip_special_tokens)
        # The text of ids[prefix_offset:read_offset], while those offsets hold.
        self._prefix: tuple[int, int, str] | None = None

    def _decode(self, ids: list[int]) -> str:
        if self._fast is not None:
            return self._fast(ids)
        return self.tokenizer.decode(
            ids, skip_special_tokens=self.params.skip_special_tokens,
            spaces_between_special_tokens=self.params.spaces_between_special_tokens)

    def _prefix_text(self) -> str:
        key = (self.prefix_offset, self.read_offset)
        if self._prefix is None or self._prefix[:2] != key:
            self._prefix = (*key, self._decode(self.ids[self.prefix_offset: self.read_offset]))
        return self._prefix[2]

    def add_token(self, token_id: int) -> bool:
        """Append one token; return True when a stop string finished the request."""
        self.ids.append(token_id)
        self.num_output_tokens += 1
        prefix = self._prefix_text()
        full = self._decode(self.ids[self.prefix_offset:])
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            if not full and len(self.ids) - self.prefix_offset > _MAX_SILENT_WINDOW:
                # A long run of tokens that decode to nothing (a tokenizer without the
                # model's vocabulary, as in benchmarks with dummy weights) would make every
                # later decode longer: drop it, there is no text for it to complete.
                self.prefix_offset = self.read_offset = len(self.ids)
            return False
        delta = full[len(prefix):]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        self._append(delta)
        if self.num_output_tokens <= self.params.min_tokens:
            return False  # as in vLLM, stop strings count only once min_tokens tokens are out
        return self._check_stop(len(delta))

    def flush(self) -> None:
        """At the end, emit any bytes held back waiting for a complete character."""
        if self.read_offset < len(self.ids):
            prefix = self._prefix_text()
            full = self._decode(self.ids[self.prefix_offset:])
            if len(full) > len(prefix):
                self._append(full[len(prefix):])
            self.read_offset = len(self.ids)

    @property
    def text(self) -> str:
        """The output text so far (joined: O(its length))."""
        return self._text.getvalue()

    def text_since(self, start: int, end: int | None = None) -> str:
        """``text[start:end]``, reading only that part."""
        end = self.text_len if end is None else min(end, self.text_len)
        if start >= end:
            return ""
        self._text.seek(start)
        return self._text.read(end - start)

    def _append(self, delta: str) -> None:
        self._text.seek(self.text_len)
        self._text.write(delta)
        self.text_len += len(delta)

    def _check_stop(self, delta_len: int) -> bool:
        if not self.params.stop:
            return False
        start = max(0, self.text_len - delta_len - self.max_stop_len + 1)
        window = self.text_since(start)
        best = None
        for stop in self.params.stop:
            idx = window.find(stop)
            if idx != -1 and (best is None or idx < best[0]):
                best = (idx, stop)
        if best is None:
            return False
        idx, stop = best
        end = start + (idx + len(stop) if self.params.include_stop_str_in_output else idx)
        self._text.seek(end)
        self._text.truncate()
        self.text_len = end
        self.stop_reason = stop
        return True
