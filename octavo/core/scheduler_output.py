"""What the scheduler hands the worker each step. New requests travel in full, running ones as
diffs (new block ids and how far they have been computed)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from octavo.sampling_params import SamplingParams


@dataclass
class NewRequestData:
    req_id: str
    token_ids: list[int]  # prompt + any output generated before a preemption
    num_prompt_tokens: int
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int
    bad_words_token_ids: list[list[int]] | None = None


@dataclass
class CachedRequestData:
    req_id: str
    new_block_ids: list[int]
    num_computed_tokens: int


@dataclass
class SchedulerOutput:
    new_reqs: list[NewRequestData] = field(default_factory=list)
    cached_reqs: list[CachedRequestData] = field(default_factory=list)
    # Tokens to compute this step, per request, in batch order.
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    total_num_scheduled_tokens: int = 0
    # Requests the worker must forget (finished, aborted or preempted since the last step).
    finished_req_ids: set[str] = field(default_factory=set)
    preempted_req_ids: set[str] = field(default_factory=set)
    # (source block, destination block) copies to make before the forward pass: the
    # copy-on-write of a shared partial block when a parallel sample forks.
    block_copies: list[tuple[int, int]] = field(default_factory=list)
    # Preemption by swap, whole blocks of every layer, made before block_copies and the
    # forward pass, swap-outs first: (GPU block, CPU block) and (CPU block, GPU block).
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)
    # Structured outputs: a guided request samples this step. The worker launches the
    # forward pass and waits for sample_tokens(bitmask): the engine fills the guided rows'
    # bitmask on the host meanwhile (after the step before has been processed, under
    # asynchronous scheduling), so the grammar's host work overlaps the device's.
    defer_sampling: bool = False

    @property
    def is_empty(self) -> bool:
        return self.total_num_scheduled_tokens == 0


@dataclass
class ModelRunnerOutput:
    """Per scheduled request that reached the end of its tokens: the sampled token."""

    req_ids: list[str]
    sampled_token_ids: list[int]
    # Optional per-request extras (logprobs of the sampled token etc.), keyed by request id.
    logprobs: dict[str, object] | None = None
    # Prompt logprobs of this step's prefill chunk, for requests that asked, by request id.
    prompt_logprobs: dict[str, object] | None = None
    # Requests whose step work failed for a reason of their own (a logits processor that
    # raised): request id -> the error's text. Their sampled token is not to be used.
    failed: dict[str, str] | None = None
    # Host seconds the worker spent turning the step into input tensors (profiling).
    prepare_s: float = 0.0
