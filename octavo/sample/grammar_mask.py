"""Structured outputs in the sampler: the guided rows' token bitmask applied to the logits.

One batched op over the guided rows of the step (a batch mixing guided and free requests pays
for the guided rows only). On CUDA with Triton, one kernel launch
(octavo/kernels/grammar_mask.py). Elsewhere in plain torch, so it runs on any device and torch
version: the int32 words are unpacked to a [G, V] boolean on the device, and the disallowed
logits become -inf with one masked fill (a few small kernels). On the CPU that unpacking
is most of the cost of a guided step (~40 ms for 32 rows of a 49k vocabulary on this 2-core
machine, against ~3 ms): there xgrammar's own CPU kernel applies the bitmask (the bitmask
is xgrammar's format; without the library, the torch path).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from octavo import envs
from octavo.kernels.triton_available import HAS_TRITON


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


@functools.cache
def _cpu_kernel():
    try:
        from xgrammar import apply_token_bitmask_inplace
    except ImportError:
        return None
    return apply_token_bitmask_inplace


def _apply_on_cpu(kernel, logits: torch.Tensor, mask: GrammarMask) -> torch.Tensor:
    bitmask = mask.bitmask
    rows = None
    if mask.rows is not None:  # the kernel takes one bitmask row per logits row
        rows = mask.rows.tolist()
        full = bitmask.new_full((logits.shape[0], bitmask.shape[1]), -1)
        full[mask.rows] = bitmask
        bitmask = full
    elif bitmask.shape[0] != logits.shape[0]:  # the leading rows
        rows = list(range(bitmask.shape[0]))
    width = 32 * bitmask.shape[1]
    kernel(logits, bitmask, vocab_size=min(width, logits.shape[1]), indices=rows,
           backend="cpu")
    if width < logits.shape[1]:  # tokens past the grammar's vocabulary: never allowed
        tail = logits[:, width:]
        if rows is None:
            tail[: mask.bitmask.shape[0]] = float("-inf")
        else:
            tail[mask.rows] = float("-inf")
    return logits


def apply_token_bitmask(logits: torch.Tensor, mask: GrammarMask) -> torch.Tensor:
    """Set the logits of tokens the grammar disallows to -inf, in place; returns logits."""
    if (logits.device.type == "cpu" and logits.dtype == torch.float32
            and logits.is_contiguous() and _cpu_kernel() is not None):
        return _apply_on_cpu(_cpu_kernel(), logits, mask)
    if logits.is_cuda and HAS_TRITON and logits.stride(-1) == 1 and envs.grammar_mask_kernel():
        from octavo.kernels.grammar_mask import apply_bitmask_inplace  # Triton: CUDA only

        return apply_bitmask_inplace(logits, mask.bitmask.contiguous(), mask.rows)
    allowed = unpack_bitmask(mask.bitmask, logits.shape[-1])
    if mask.rows is None:
        guided = logits[: allowed.shape[0]]
        guided.masked_fill_(~allowed, float("-inf"))
        return logits
    guided = logits.index_select(0, mask.rows).masked_fill_(~allowed, float("-inf"))
    return logits.index_copy_(0, mask.rows, guided)
