"""A sampled token's logprob and rank, and the row's log-normaliser, in one pass over the logits.

The sampler's logprobs (``logprobs=k`` in SamplingParams) need, per row, log Z (logsumexp of
the logits), the sampled token's logprob (its logit - log Z) and its rank (1 + the number of
logits above it); the top k then come from ``topk`` on the logits themselves (log-softmax is
monotonic). The torch path materialised the [B, V] float32 log-softmax and read it twice more
(compare-and-count, top-k), after a float32 copy of bf16 logits: ~0.9 GB of traffic a step at
W1's 256 rows of 152k. This kernel reads each logit once in its own dtype: an online
(max, sum of exp) and a count of the logits above the sampled one's. The vocabulary is split
over several programs when the batch is small; a few torch ops on [B, splits] combine them.
"""

from __future__ import annotations

import torch

from octavo.kernels.triton_utils import (
    next_power_of_2,
    require_triton,
    tl,
    triton,
    vocab_splits,
)


@triton.jit
def _stats_kernel(logits_ptr, sampled_ptr, max_ptr, sum_ptr, count_ptr, vocab, stride_row,
                  cols_per_split, num_splits, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    split = tl.program_id(1)
    base = logits_ptr + row.to(tl.int64) * stride_row
    target = tl.load(base + tl.load(sampled_ptr + row)).to(tl.float32)
    lo = split * cols_per_split
    hi = tl.minimum(lo + cols_per_split, vocab)
    run_max = tl.full([BLOCK], float("-inf"), tl.float32)
    run_sum = tl.zeros([BLOCK], tl.float32)
    above = tl.zeros([BLOCK], tl.int32)
    for start in range(lo, hi, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < hi
        x = tl.load(base + cols, mask=mask, other=float("-inf")).to(tl.float32)
        # Per lane, an online (max, sum of exp): a lane's sum is rescaled when its max grows.
        new_max = tl.maximum(run_max, x)
        safe = tl.where(new_max == float("-inf"), 0.0, new_max)
        run_sum = run_sum * tl.exp(run_max - safe) + tl.exp(x - safe)
        run_max = new_max
        above += (x > target).to(tl.int32)
    m = tl.max(run_max, 0)
    safe_m = tl.where(m == float("-inf"), 0.0, m)
    lane_safe = tl.where(run_max == float("-inf"), 0.0, run_max)
    s = tl.sum(run_sum * tl.exp(lane_safe - safe_m), 0)
    out = row * num_splits + split
    tl.store(max_ptr + out, m)
    tl.store(sum_ptr + out, s)
    tl.store(count_ptr + out, tl.sum(above, 0))


def logprob_stats(logits: torch.Tensor,
                  sampled: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits [B, V] (any float dtype, unit column stride), sampled [B] int64 ->
    (log Z [B] float32, the sampled tokens' logprobs [B] float32, their ranks [B] int64)."""
    require_triton("logprob_stats")
    assert logits.dim() == 2 and logits.stride(-1) == 1, (logits.shape, logits.stride())
    b, vocab = logits.shape
    block = max(16, min(2048, next_power_of_2(vocab)))
    splits, cols_per_split = vocab_splits(b, vocab, block, logits.device)
    dev = logits.device
    maxes = torch.empty((b, splits), dtype=torch.float32, device=dev)
    sums = torch.empty((b, splits), dtype=torch.float32, device=dev)
    counts = torch.empty((b, splits), dtype=torch.int32, device=dev)
    sampled = sampled.contiguous()
    _stats_kernel[(b, splits)](logits, sampled, maxes, sums, counts, vocab, logits.stride(0),
                               cols_per_split, splits, BLOCK=block,
                               num_warps=8 if block >= 2048 else 4)
    # Each split's sum is relative to its own max (0 where all its logits are -inf).
    m = maxes[:, 0] if splits == 1 else maxes.max(dim=1).values
    m = torch.where(m == float("-inf"), torch.zeros_like(m), m)
    s = sums[:, 0] if splits == 1 else (
        sums * torch.exp(torch.where(maxes == float("-inf"), torch.zeros_like(maxes), maxes)
                         - m.unsqueeze(1))).sum(dim=1)
    log_z = m + torch.log(s)  # -inf for a row of -inf logits
    token = logits.gather(1, sampled.unsqueeze(1)).squeeze(1).float() - log_z
    ranks = counts.sum(dim=1, dtype=torch.int64) + 1
    return log_z, token, ranks


def logprob_stats_ref(logits: torch.Tensor,
                      sampled: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The same in torch, through the float32 log-softmax."""
    x = logits.float()
    log_z = torch.logsumexp(x, dim=-1)
    lp = torch.log_softmax(x, dim=-1)
    token = lp.gather(1, sampled.unsqueeze(1)).squeeze(1)
    ranks = (x > x.gather(1, sampled.unsqueeze(1))).sum(dim=-1) + 1
    return log_z, token, ranks
