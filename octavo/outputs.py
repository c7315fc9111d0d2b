"""Public output objects returned by `LLM.generate` and the async engine (vLLM-compatible).

Pure Python: never imports torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class Logprob:
    """Log-probability of one token, with its rank in the vocabulary (1 = most likely)."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None

    def __reduce__(self):  # positional: pickles small and loads fast (see RequestOutput)
        return (type(self), (self.logprob, self.rank, self.decoded_token))


# One dict per generated position: token id -> Logprob (sampled token + top-k alternatives).
# The engine hands out an ``octavo.flat_logprobs.FlatLogprobs``, which reads as this list.
SampleLogprobs = Sequence[dict[int, Logprob]]
# One entry per prompt position; the first is None (nothing predicts the first token).
PromptLogprobs = Sequence[dict[int, Logprob] | None]


@dataclass
class CompletionOutput:
    """One generated sequence of a request.

    finish_reason: None while running, then "stop" (EOS / stop string / stop token),
    "length" (max_tokens or model length) or "abort".
    stop_reason: the stop string or stop token id that ended it; None for EOS or length.
    """

    index: int
    text: str
    token_ids: Sequence[int]
    cumulative_logprob: float | None
    logprobs: SampleLogprobs | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None

    def __reduce__(self):  # positional: pickles small and loads fast (see RequestOutput)
        return (type(self), (self.index, self.text, self.token_ids, self.cumulative_logprob,
                             self.logprobs, self.finish_reason, self.stop_reason))

    def __repr__(self) -> str:
        return (
            f"CompletionOutput(index={self.index}, "
            f"text={self.text!r}, "
            f"token_ids={list(self.token_ids)}, "
            f"cumulative_logprob={self.cumulative_logprob}, "
            f"logprobs={self.logprobs}, "
            f"finish_reason={self.finish_reason}, "
            f"stop_reason={self.stop_reason!r})"
        )


@dataclass
class RequestOutput:
    """Everything the engine reports for one request at one point in time."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int] | None
    prompt_logprobs: PromptLogprobs | None
    outputs: list[CompletionOutput]
    finished: bool
    metrics: Any | None = None
    num_cached_tokens: int | None = 0
    # Set when a fault traced to this request ended it (finish_reason "error"): the reason.
    error: str | None = None
    # With ``error``: the request's own field at fault (its constraints conflicted), or None
    # when the fault was not the client's (RequestFailedError.param).
    error_param: str | None = None

    def __reduce__(self):
        # The fields by position: an engine process pickles one of these per request per
        # step, and the default (a state dict set on a bare object) loaded 7x slower.
        return (type(self), (self.request_id, self.prompt, self.prompt_token_ids,
                             self.prompt_logprobs, self.outputs, self.finished, self.metrics,
                             self.num_cached_tokens, self.error, self.error_param))

    def add(self, next_output: RequestOutput, aggregate: bool) -> None:
        """Merge a later output for the same request into this one.

        With `aggregate` (DELTA streaming consumers that fell behind), text, token ids and
        logprobs are appended; otherwise each completion is replaced by the newer one.
        """
        self.finished |= next_output.finished
        self.metrics = next_output.metrics
        self.num_cached_tokens = next_output.num_cached_tokens
        if next_output.error is not None:
            self.error, self.error_param = next_output.error, next_output.error_param
        by_index = {c.index: i for i, c in enumerate(self.outputs)}
        for nxt in next_output.outputs:
            i = by_index.get(nxt.index)
            if i is None:
                self.outputs.append(nxt)
                by_index[nxt.index] = len(self.outputs) - 1
                continue
            if not aggregate:
                self.outputs[i] = nxt
                continue
            cur = self.outputs[i]
            cur.text += nxt.text
            cur.token_ids = list(cur.token_ids) + list(nxt.token_ids)
            if nxt.logprobs is not None:
                from octavo.flat_logprobs import FlatLogprobs  # it imports this module

                merged = (cur.logprobs[:] if isinstance(cur.logprobs, FlatLogprobs)
                          else FlatLogprobs(cur.logprobs or ()))
                merged.extend(nxt.logprobs)
                cur.logprobs = merged
            cur.cumulative_logprob = nxt.cumulative_logprob
            cur.finish_reason = nxt.finish_reason
            cur.stop_reason = nxt.stop_reason

    def __repr__(self) -> str:
        return (
            f"RequestOutput(request_id={self.request_id}, "
            f"prompt={self.prompt!r}, "
            f"prompt_token_ids={self.prompt_token_ids}, "
            f"prompt_logprobs={self.prompt_logprobs}, "
            f"outputs={self.outputs}, "
            f"finished={self.finished}, "
            f"metrics={self.metrics}, "
            f"num_cached_tokens={self.num_cached_tokens}"
            + (f", error={self.error!r})" if self.error else ")")
        )
