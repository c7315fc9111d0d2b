"""A request as the scheduler sees it: token ids, progress, status. Pure Python."""

from __future__ import annotations

import enum
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from octavo.sampling_params import SamplingParams


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    # Everything from here on is finished.
    FINISHED_STOPPED = 10
    FINISHED_LENGTH_CAPPED = 11
    FINISHED_ABORTED = 12
    FINISHED_ERROR = 13  # a fault traced to this request ended it (see octavo/errors.py)

    @property
    def is_finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED

    @property
    def finish_reason(self) -> str | None:
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


class Request:
    """One sequence being generated.

    ``num_computed_tokens`` catches up with ``num_tokens`` (prompt + generated) step by step;
    when it has caught up, the model's output at the last position is a new token.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        eos_token_ids: frozenset[int] = frozenset(),
        arrival_time: float | None = None,
        priority: int = 0,
        max_tokens: int | None = None,
        extra: Any = None,
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.eos_token_ids = eos_token_ids
        # A set: every new token is looked up in it (a list of 1,024 ids was scanned).
        self.stop_token_ids = frozenset(sampling_params.stop_token_ids or ())
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.priority = priority
        self.max_tokens = sampling_params.max_tokens if max_tokens is None else max_tokens
        self.extra = extra
        # The user request this sequence belongs to (a parallel sample's parent id): the
        # scheduler bounds one group's share of the batch while others wait.
        self.group_id = request_id
        self.output_token_ids: list[int] = []
        self.all_token_ids: list[int] = list(prompt_token_ids)
        # Tokens whose KV is written or scheduled to be (advanced when a step is scheduled).
        self.num_computed_tokens = 0
        # Output tokens sampled by scheduled steps but not yet known here. With asynchronous
        # scheduling the next step is scheduled before the last one's token arrives; the
        # worker feeds that token to the model straight from the device.
        self.num_pending = 0
        self.num_preemptions = 0
        self.status = RequestStatus.WAITING
        self.stop_reason: int | str | None = None
        # bad_words as token sequences (tokenized by the processor).
        self.bad_words_token_ids: list[list[int]] | None = None
        # Parallel sample (n > 1) that shares its prompt's KV blocks with this leader.
        self.fork_of: Request | None = None
        # Prefix caching: chained hashes of full blocks, blocks registered so far, and how
        # many prompt tokens came from the cache at admission.
        self.block_hashes: list[int] = []
        self.num_cached_blocks = 0
        self.num_cached_tokens = 0
        self.first_scheduled_time: float | None = None  # for the queue-time metric
        self.first_token_time: float | None = None  # for time-to-first-token

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    def __repr__(self) -> str:
        return (
            f"Request(id={self.request_id!r}, status={self.status.name}, "
            f"tokens={self.num_tokens}, computed={self.num_computed_tokens})"
        )
