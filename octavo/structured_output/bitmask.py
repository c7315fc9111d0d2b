"""The token bitmask of one step, from the engine to the worker with the SchedulerOutput."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class GrammarBitmask:
    """Bit ``t`` of row ``i`` (LSB first in each int32 word) says whether token ``t`` may
    follow request ``req_ids[i]``'s output. Rows only for the guided requests that sample
    this step: the free ones in the batch cost nothing."""

    req_ids: list[str]
    bitmask: Any  # torch.int32 [len(req_ids), ceil(vocab / 32)], on the CPU
