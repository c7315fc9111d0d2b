"""Repetition, frequency and presence penalties over a step's penalized rows in one pass.

Each program takes a block of one row's vocabulary: it reads the logits, the request's output
counts (int32) and prompt marks (uint8) from ``octavo.sample.penalty_rows``' tensors, and
writes the penalized logits in place (``octavo.sample.penalty_rows.penalize`` is the torch
path, and this kernel's reference). In torch the same is a dozen launches over [R, V]
temporaries (gathers, comparisons, two wheres, casts, the scatter back): 1.3-1.5 ms a step at
W1's 130 rows x 152k vocabulary on an H100 (session 49), where this reads about 13 bytes a
logit once.

The arithmetic is the torch reference's, in its order: transformers' rule first (a positive
logit of a prompt or output token divided by the penalty, any other times it), then OpenAI's
(logit - count * frequency - (count > 0) * presence).
"""

from __future__ import annotations

import torch

from octavo.kernels.triton_utils import require_triton, tl, triton

BLOCK = 2048


@triton.jit
def _penalties_kernel(
    logits_ptr, stride_l, counts_ptr, prompt_ptr, at_ptr, rows_ptr, rep_ptr, freq_ptr,
    pres_ptr, V, BLOCK: tl.constexpr,
):  # fmt: skip
    i = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < V
    at = tl.load(at_ptr + i).to(tl.int64)
    row = tl.load(rows_ptr + i).to(tl.int64)
    rep = tl.load(rep_ptr + i)
    freq = tl.load(freq_ptr + i)
    pres = tl.load(pres_ptr + i)
    x = tl.load(logits_ptr + at * stride_l + cols, mask=mask, other=0.0)
    c = tl.load(counts_ptr + row * V + cols, mask=mask, other=0)
    in_prompt = tl.load(prompt_ptr + row * V + cols, mask=mask, other=0)
    present = c > 0
    seen = present | (in_prompt != 0)
    x = tl.where(seen, tl.where(x > 0, x / rep, x * rep), x)
    x = x - c.to(tl.float32) * freq
    x = x - present.to(tl.float32) * pres
    tl.store(logits_ptr + at * stride_l + cols, x, mask=mask)


def apply_penalties(logits: torch.Tensor, at: torch.Tensor, rows: torch.Tensor,
                    counts: torch.Tensor, prompt: torch.Tensor, rep: torch.Tensor,
                    freq: torch.Tensor, pres: torch.Tensor) -> None:
    """Penalize ``logits`` [B, V] float32 in place: row ``at[i]`` with the counts and prompt
    marks of row ``rows[i]`` of ``counts`` [N, V] int32 / ``prompt`` [N, V] uint8, and that
    row's ``rep`` / ``freq`` / ``pres`` (float32 [R])."""
    require_triton("apply_penalties")
    r = at.numel()
    vocab = logits.shape[1]
    assert logits.dtype == torch.float32 and logits.stride(1) == 1, (logits.dtype,
                                                                      logits.stride())
    assert counts.shape[1] == vocab and counts.is_contiguous() and prompt.is_contiguous()
    if r == 0:
        return
    _penalties_kernel[(r, triton.cdiv(vocab, BLOCK))](
        logits, logits.stride(0), counts, prompt, at, rows, rep, freq, pres, vocab,
        BLOCK=BLOCK, num_warps=4)

