"""Incremental detokenization and stop strings.

Decoding the whole output every step is quadratic; decoding one token at a time breaks
multi-token characters and leading spaces. We decode a short window: the text of
ids[prefix:read] versus ids[prefix:], and emit the difference once it is complete (no
trailing replacement character).
"""

from __future__ import annotations

from octavo.sampling_params import SamplingParams

_CONTEXT_TOKENS = 5  # prompt tokens kept as left context for the first decodes


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self.tokenizer = tokenizer
        self.params = params
        ctx = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self.ids = ctx
        self.prefix_offset = 0
        self.read_offset = len(ctx)
        self.text = ""
        self.stop_reason: str | None = None
        self.max_stop_len = max((len(s) for s in params.stop), default=0)
        self.num_output_tokens = 0

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(
            ids, skip_special_tokens=self.params.skip_special_tokens,
            spaces_between_special_tokens=self.params.spaces_between_special_tokens)

    def add_token(self, token_id: int) -> bool:
        """Append one token; return True when a stop string finished the request."""
        self.ids.append(token_id)
        self.num_output_tokens += 1
        prefix = self._decode(self.ids[self.prefix_offset: self.read_offset])
        full = self._decode(self.ids[self.prefix_offset:])
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return False
        delta = full[len(prefix):]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        self.text += delta
        if self.num_output_tokens <= self.params.min_tokens:
            return False  # as in vLLM, stop strings count only once min_tokens tokens are out
        return self._check_stop(len(delta))

    def flush(self) -> None:
        """At the end, emit any bytes held back waiting for a complete character."""
        if self.read_offset < len(self.ids):
            prefix = self._decode(self.ids[self.prefix_offset: self.read_offset])
            full = self._decode(self.ids[self.prefix_offset:])
            if len(full) > len(prefix):
                self.text += full[len(prefix):]
            self.read_offset = len(self.ids)

    def _check_stop(self, delta_len: int) -> bool:
        if not self.params.stop:
            return False
        start = max(0, len(self.text) - delta_len - self.max_stop_len + 1)
        best = None
        for stop in self.params.stop:
            idx = self.text.find(stop, start)
            if idx != -1 and (best is None or idx < best[0]):
                best = (idx, stop)
        if best is None:
            return False
        idx, stop = best
        end = idx + len(stop) if self.params.include_stop_str_in_output else idx
        self.text = self.text[:end]
        self.stop_reason = stop
        return True
