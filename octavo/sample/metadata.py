"""Per-step sampling inputs, one row per request that samples this step."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from octavo.sample.grammar_mask import GrammarMask
from octavo.sample.penalty_rows import PenaltyRows


@dataclass
class SamplingMetadata:
    all_greedy: bool
    temperature: torch.Tensor | None  # [B] float32; 0 marks greedy rows
    top_k: torch.Tensor | None  # [B] int64, vocab size where disabled; None if none use it
    top_p: torch.Tensor | None  # [B] float32; None if none use it
    min_p: torch.Tensor | None  # [B] float32; None if none use it
    # Row -> generator for seeded rows (deterministic whatever the batch).
    generators: dict[int, torch.Generator]
    max_num_logprobs: int | None  # None: no row wants logprobs
    # Rows whose logits need processing (penalties, biases, bans) before sampling.
    row_contexts: list | None = None
    # Generator for unseeded rows (the engine's seed).
    generator: torch.Generator | None = None
    # Structured outputs: the guided rows' token bitmask (octavo.sample.grammar_mask).
    grammar: GrammarMask | None = None
    # The worker's penalty counts (penalty_rows.PenaltyRows); None: host tallies.
    penalties: PenaltyRows | None = None
