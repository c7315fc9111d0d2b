"""Structured outputs in the sampler: the guided rows' token bitmask applied to the logits.

One batched op over the guided rows of the step (a batch mixing guided and free requests pays
for the guided rows only), in plain torch so it runs on any device and torch version: the
int32 words are unpacked to a [G, V] boolean on the device, and the disallowed logits become
-inf with one masked fill.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class GrammarMask:
    bitmask: torch.Tensor  # int32 [G, ceil(V / 32)] on the logits' device
    rows: torch.Tensor | None  # int64 [G]: the logits rows they constrain; None: rows 0..G-1


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """int32 [G, W] -> bool [G, vocab_size]: bit j of word w (LSB first) is token 32 w + j.
    Tokens past the bitmask's 32 W (a logits vocabulary wider than the grammar's) are
    disallowed."""
    shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    allowed = ((bitmask.unsqueeze(-1) >> shifts) & 1).bool().flatten(1)
    width = allowed.shape[1]
    if width >= vocab_size:
        return allowed[:, :vocab_size]
    pad = allowed.new_zeros(allowed.shape[0], vocab_size - width)
    return torch.cat([allowed, pad], dim=1)


def apply_token_bitmask(logits: torch.Tensor, mask: GrammarMask) -> torch.Tensor:
    """Set the logits of tokens the grammar disallows to -inf, in place; returns logits."""
    allowed = unpack_bitmask(mask.bitmask, logits.shape[-1])
    if mask.rows is None:
        guided = logits[: allowed.shape[0]]
        guided.masked_fill_(~allowed, float("-inf"))
        return logits
    guided = logits.index_select(0, mask.rows).masked_fill_(~allowed, float("-inf"))
    return logits.index_copy_(0, mask.rows, guided)
