"""What the worker remembers about a running request between steps."""

from __future__ import annotations

from dataclasses import dataclass, field

from octavo.sample.logits_processors import BadWordIndex, RowCache
from octavo.sampling_params import SamplingParams


@dataclass
class CachedRequestState:
    req_id: str
    token_ids: list[int]  # prompt + outputs; the worker appends what it samples
    num_prompt_tokens: int
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int
    # Built once from the scheduler's token sequences (see BadWordIndex).
    bad_words_token_ids: BadWordIndex | None = None
    slot: int = -1  # row of the persistent block table (InputBuffers.req_tables)
    table_len: int = 0  # how many of block_ids that row holds already
    # Its logits processing's state, kept across steps (RowCache: filled on first use).
    row_cache: RowCache = field(default_factory=RowCache)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens
