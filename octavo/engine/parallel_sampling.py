"""n > 1: one user request fans out into n sample requests whose outputs merge back.

The samples after the first fork from it in the scheduler and share its prompt's KV blocks
(see Scheduler._try_fork); here we only build the children and merge what they produce.
"""

from __future__ import annotations

from octavo.outputs import CompletionOutput, RequestOutput
from octavo.sampling_params import RequestOutputKind, SamplingParams


def child_params(params: SamplingParams, index: int) -> SamplingParams:
    """Sample ``index``'s parameters: n=1, and a distinct seed when one was given (else every
    seeded sample would draw the same tokens)."""
    child = params.clone()
    child.n = 1
    if child.seed is not None:
        child.seed = child.seed * 1_000_003 + index
    return child


def child_id(request_id: str, index: int) -> str:
    return f"{request_id}#sample{index}"


class ParentRequest:
    def __init__(self, request_id: str, n: int, kind: RequestOutputKind) -> None:
        self.request_id = request_id
        self.n = n
        self.kind = kind
        self.child_ids = [child_id(request_id, i) for i in range(n)]
        self.completions: list[CompletionOutput | None] = [None] * n
        self.finished: set[int] = set()

    @property
    def done(self) -> bool:
        return len(self.finished) == self.n

    def add(self, index: int, out: RequestOutput) -> RequestOutput | None:
        """Fold one sample's output in; returns what the user should see now, if anything."""
        completion = out.outputs[0]
        completion.index = index
        self.completions[index] = completion
        if out.finished:
            self.finished.add(index)
        if self.kind == RequestOutputKind.FINAL_ONLY and not self.done:
            return None
        if self.kind == RequestOutputKind.DELTA:
            outputs = [completion]
        else:
            outputs = [c for c in self.completions if c is not None]
        return RequestOutput(
            request_id=self.request_id, prompt=out.prompt,
            prompt_token_ids=out.prompt_token_ids, prompt_logprobs=out.prompt_logprobs,
            outputs=outputs, finished=self.done)
