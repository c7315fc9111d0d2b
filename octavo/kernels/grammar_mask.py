"""A structured-output step's token bitmask applied to the logits in one launch.

The torch path (octavo/sample/grammar_mask.py) unpacks the int32 words into a [G, V] boolean
and masks with it: about eight small kernels, each a host launch, on the host's critical path
of a guided step (the forward pass has finished and waits for this step's sampling). Here each
program takes one guided row and a block of the vocabulary, reads the row's words, and writes
-inf where a token's bit is clear; tokens past the bitmask's 32 W ids (a tokenizer smaller
than the logits) are disallowed too. In place, float logits of any width, rows given by index
or the leading G.
"""

from __future__ import annotations

import torch

from octavo.kernels.triton_utils import require_triton, tl, triton

_BLOCK = 1024  # tokens per program: 32 words of the bitmask


@triton.jit
def _apply_bitmask_kernel(
    logits_ptr,
    bitmask_ptr,
    rows_ptr,
    vocab,
    words,
    stride_logits,
    stride_bitmask,
    HAS_ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    g = tl.program_id(0)
    block = tl.program_id(1)
    row = g
    if HAS_ROWS:
        row = tl.load(rows_ptr + g)
    tokens = block * BLOCK + tl.arange(0, BLOCK)
    word = tokens // 32
    bits = tl.load(bitmask_ptr + g * stride_bitmask + word, mask=word < words, other=0)
    allowed = ((bits >> (tokens % 32)) & 1) != 0
    ptrs = logits_ptr + row.to(tl.int64) * stride_logits + tokens
    tl.store(ptrs, tl.full([BLOCK], float("-inf"), tl.float32).to(logits_ptr.dtype.element_ty),
             mask=(tokens < vocab) & ~allowed)


def apply_bitmask_inplace(logits: torch.Tensor, bitmask: torch.Tensor,
                          rows: torch.Tensor | None = None) -> torch.Tensor:
    """logits [B, V] (last dim contiguous), bitmask int32 [G, W] on the same device; rows:
    int64 [G] (the logits rows the bitmask rows constrain) or None for rows 0..G-1."""
    require_triton("the structured-output bitmask kernel")
    if logits.stride(-1) != 1 or bitmask.stride(-1) != 1:
        raise ValueError("apply_bitmask_inplace needs the last dim of logits and bitmask "
                         "contiguous")
    num_rows, words = bitmask.shape
    if num_rows == 0:
        return logits
    vocab = logits.shape[-1]
    grid = (num_rows, triton.cdiv(vocab, _BLOCK))
    _apply_bitmask_kernel[grid](
        logits, bitmask, rows if rows is not None else bitmask, vocab, words,
        logits.stride(0), bitmask.stride(0), HAS_ROWS=rows is not None, BLOCK=_BLOCK)
    return logits
