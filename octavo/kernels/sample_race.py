"""Temperature sampling in one pass over the logits: the exponential race (Gumbel-max).

Drawing a token from softmax(logits / T) is the same as taking
``argmax(logits / T - log(E))`` with one E ~ Exp(1) per vocabulary entry (the softmax's
normaliser cancels in the argmax). The torch path in octavo/sample/sampler.py does this in
several full passes over a [B, V] float32 tensor (divide, softmax, draw, divide, argmax, and a
greedy argmax besides); this kernel reads each logit once, draws E from a counter-based
generator (Philox, keyed by a per-row seed and the token id: counter i gives the four draws
of tokens 4i .. 4i + 3, so a row's draw never depends on the rest of the batch) and keeps a
running (max, argmax). Greedy rows (T < 1e-5) take the plain argmax in the same launch. The
vocabulary is split over several programs when the batch is small, so one row does not leave
the GPU idle; a tiny torch reduction picks the winner.

Used on CUDA when no row needs top-k / top-p / min-p (those need the sorted distribution).
"""

from __future__ import annotations

import torch

from octavo.kernels.triton_utils import (
    interpreting,
    next_power_of_2,
    require_triton,
    tl,
    triton,
    vocab_splits,
)

_GREEDY_EPS = 1e-5  # as the sampler: temperatures below this are greedy
LN2 = tl.constexpr(0.6931471805599453) if tl is not None else None
LOG2_LN2 = tl.constexpr(-0.5287663729448977) if tl is not None else None


@triton.jit
def _log2(x, ASM: tl.constexpr):
    """log2 by the hardware approximation (MUFU.LG2, ~2**-22 relative error: noise for a
    draw, not a result) where it runs; the interpreter takes tl.log2."""
    if ASM:
        y = tl.inline_asm_elementwise("lg2.approx.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                      is_pure=True, pack=1)
    else:
        y = tl.log2(x)
    return y


@triton.jit
def _race_kernel(
    logits_ptr,
    temp_ptr,
    base_seed_ptr,
    row_seed_ptr,
    best_val_ptr,
    best_idx_ptr,
    vocab,
    stride_row,
    cols_per_split,
    num_splits,
    HAS_ROW_SEEDS: tl.constexpr,
    BLOCK: tl.constexpr,
    ASM: tl.constexpr,
):
    row = tl.program_id(0)
    split = tl.program_id(1)
    t = tl.load(temp_ptr + row)
    greedy = t < 1e-5
    inv_t = tl.where(greedy, 1.0, 1.0 / tl.where(greedy, 1.0, t))
    # Unseeded rows: a per-step base drawn on the device (no host round trip) plus the row;
    # seeded rows (row seed >= 0): their own seed, whatever the batch.
    seed = tl.load(base_seed_ptr) + row
    if HAS_ROW_SEEDS:
        own = tl.load(row_seed_ptr + row)
        seed = tl.where(own >= 0, own, seed)
    lo = split * cols_per_split
    hi = tl.minimum(lo + cols_per_split, vocab)
    best_val = tl.full([], float("-inf"), tl.float32)
    best_idx = tl.full([], 0, tl.int32)
    base = logits_ptr + row.to(tl.int64) * stride_row
    for start in range(lo, hi, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < hi
        x = tl.load(base + cols, mask=mask, other=float("-inf")).to(tl.float32)
        # One Philox call (10 rounds, most of this loop's instructions) gives four uniforms:
        # columns 4i .. 4i + 3 take the four outputs of counter i (start is a multiple of 4,
        # so a column's draw does not depend on the split).
        u0, u1, u2, u3 = tl.rand4x(seed, start // 4 + tl.arange(0, BLOCK // 4))
        u = tl.reshape(tl.join(tl.join(u0, u1), tl.join(u2, u3)), [BLOCK])
        # -log(E) with E = -log(u): the Gumbel noise of the race, by base-2 logarithms:
        # -ln(-ln u) = -ln 2 (log2(-log2 u) + log2(ln 2)).
        noise = -LN2 * (_log2(-_log2(u, ASM), ASM) + LOG2_LN2)
        score = tl.where(greedy, x, x * inv_t + noise)
        score = tl.where(mask, score, float("-inf"))
        m = tl.max(score, 0)
        i = tl.argmax(score, 0).to(tl.int32) + start
        take = m > best_val  # strict: the earlier column wins a tie, as torch.argmax
        best_idx = tl.where(take, i, best_idx)
        best_val = tl.maximum(m, best_val)
    tl.store(best_val_ptr + row * num_splits + split, best_val)
    tl.store(best_idx_ptr + row * num_splits + split, best_idx)


def race_sample(logits: torch.Tensor, temperature: torch.Tensor, base_seed: torch.Tensor,
                row_seeds: torch.Tensor | None = None) -> torch.Tensor:
    """logits [B, V] (any float dtype), temperature [B] float32 (< 1e-5: greedy), base_seed
    [1] int64 on the device (row i draws with base + i), row_seeds [B] int64 or None (a value
    >= 0 is that row's own seed) -> sampled token ids [B] int64."""
    require_triton("race_sample")
    assert logits.dim() == 2 and logits.stride(-1) == 1
    b, vocab = logits.shape
    block = max(4, min(4096, next_power_of_2(vocab)))  # whole counters of 4 draws
    splits, cols_per_split = vocab_splits(b, vocab, block, logits.device)
    vals = torch.empty((b, splits), dtype=torch.float32, device=logits.device)
    idx = torch.empty((b, splits), dtype=torch.int32, device=logits.device)
    _race_kernel[(b, splits)](
        logits, temperature, base_seed, base_seed if row_seeds is None else row_seeds, vals,
        idx, vocab, logits.stride(0), cols_per_split, splits,
        HAS_ROW_SEEDS=row_seeds is not None, BLOCK=block, ASM=not interpreting(),
        num_warps=8 if block >= 2048 else 4)
    if splits == 1:
        return idx[:, 0].long()
    return idx.gather(1, vals.argmax(dim=1, keepdim=True)).squeeze(1).long()


def race_sample_ref(logits: torch.Tensor, temperature: torch.Tensor,
                    generator: torch.Generator | None = None) -> torch.Tensor:
    """The same distribution in torch (its own random stream, not Philox's)."""
    x = logits.float()
    greedy = temperature < _GREEDY_EPS
    t = torch.where(greedy, torch.ones_like(temperature), temperature).unsqueeze(1)
    e = torch.empty_like(x).exponential_(generator=generator)
    race = (x / t - e.log()).argmax(dim=1)
    return torch.where(greedy, x.argmax(dim=1), race)
