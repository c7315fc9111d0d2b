"""n > 1 and best_of > n: one user request fans out into samples whose outputs merge back.

The samples after the first fork from it in the scheduler and share its prompt's KV blocks
(see Scheduler._try_fork); here we only build the children and merge what they produce.
With ``best_of > n``, ``best_of`` samples run and only the ``n`` best reach the user, ranked by
``cumulative_logprob / num_generated_tokens ** length_penalty`` (the score beam search uses;
vLLM ranks by ``cumulative_logprob`` alone, which is ``length_penalty=0``).
"""

from __future__ import annotations

from octavo.engine.beam_search import beam_score
from octavo.outputs import CompletionOutput, RequestOutput
from octavo.sampling_params import RequestOutputKind, SamplingParams


def num_samples(params: SamplingParams) -> int:
    """How many sequences a request samples: best_of when given, else n."""
    return params.best_of or params.n


def child_params(params: SamplingParams, index: int) -> SamplingParams:
    """Sample ``index``'s parameters: n=1, and a distinct seed when one was given (else every
    seeded sample would draw the same tokens). With best_of > n the samples report their
    logprobs (ranking needs them; the parent drops what the user did not ask for) and only
    their final output."""
    child = params.clone()
    child.n = 1
    child.best_of = None
    if child.seed is not None:
        child.seed = child.seed * 1_000_003 + index
    if num_samples(params) > params.n:
        if child.logprobs is None:
            child.logprobs = 0
        child.output_kind = RequestOutputKind.FINAL_ONLY
        child.length_penalty = 1.0  # used by the parent's ranking, not by the sample
    return child


def child_id(request_id: str, index: int) -> str:
    return f"{request_id}#sample{index}"


class ParentRequest:
    def __init__(self, request_id: str, params: SamplingParams) -> None:
        self.request_id = request_id
        self.n = params.n
        self.num_samples = num_samples(params)
        self.kind = params.output_kind
        self.length_penalty = params.length_penalty
        self.keep_logprobs = params.logprobs is not None
        self.child_ids = [child_id(request_id, i) for i in range(self.num_samples)]
        self.completions: list[CompletionOutput | None] = [None] * self.num_samples
        self.finished: set[int] = set()

    @property
    def done(self) -> bool:
        return len(self.finished) == self.num_samples

    @property
    def ranks(self) -> bool:
        return self.num_samples > self.n

    def add(self, index: int, out: RequestOutput) -> RequestOutput | None:
        """Fold one sample's output in; returns what the user should see now, if anything."""
        completion = out.outputs[0]
        completion.index = index
        self.completions[index] = completion
        if out.finished:
            self.finished.add(index)
        if self.ranks:
            if not self.done:
                return None
            outputs = self._best()
        elif self.kind == RequestOutputKind.FINAL_ONLY and not self.done:
            return None
        elif self.kind == RequestOutputKind.DELTA:
            outputs = [completion]
        else:
            outputs = [c for c in self.completions if c is not None]
        return RequestOutput(
            request_id=self.request_id, prompt=out.prompt,
            prompt_token_ids=out.prompt_token_ids, prompt_logprobs=out.prompt_logprobs,
            outputs=outputs, finished=self.done, num_cached_tokens=out.num_cached_tokens)

    def score(self, completion: CompletionOutput) -> float:
        return beam_score(completion.cumulative_logprob or 0.0, len(completion.token_ids),
                          self.length_penalty)

    def _best(self) -> list[CompletionOutput]:
        """The n best samples, best first, re-indexed 0..n-1 (sorted() is stable with
        reverse=True too: on a tie the earlier sample wins)."""
        ranked = sorted((c for c in self.completions if c is not None), key=self.score,
                        reverse=True)
        best = ranked[:self.n]
        for i, c in enumerate(best):
            c.index = i
            if not self.keep_logprobs:
                c.logprobs = None
        return best
