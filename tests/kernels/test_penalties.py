"""The one-pass penalties kernel (octavo/kernels/penalties.py) against the torch path
(penalty_rows.penalize): rows picked out of order from a larger pool, a ragged vocabulary
block, every kind of penalty, negative and zero logits, and rows left alone."""

from __future__ import annotations

import torch

from octavo.kernels.penalties import BLOCK, apply_penalties
from octavo.sample.penalty_rows import penalize


def test_kernel_equals_torch(device):
    g = torch.Generator().manual_seed(0)
    vocab, pool, b = BLOCK + 77, 6, 5
    logits = torch.randn(b, vocab, generator=g) * 3
    logits[:, :10] = 0.0
    counts = torch.randint(0, 3, (pool, vocab), generator=g, dtype=torch.int32)
    counts[counts > 0] = torch.randint(1, 9, (int((counts > 0).sum()),), generator=g,
                                       dtype=torch.int32)
    prompt = (torch.rand(pool, vocab, generator=g) < 0.3).to(torch.uint8)
    at = torch.tensor([3, 0, 4])  # row 1 and 2 untouched
    rows = torch.tensor([5, 2, 0])
    rep = torch.tensor([1.3, 1.0, 0.7])
    freq = torch.tensor([0.0, 0.6, -0.2])
    pres = torch.tensor([0.0, -0.4, 1.1])
    want = logits.clone()
    penalize(want, at, rows, counts, prompt, rep, freq, pres)
    got = logits.clone().to(device)
    apply_penalties(got, at.to(device), rows.to(device), counts.to(device), prompt.to(device),
                    rep.to(device), freq.to(device), pres.to(device))
    torch.testing.assert_close(got.cpu(), want, rtol=1e-6, atol=1e-6)
    assert torch.equal(got.cpu()[1:3], logits[1:3])
    assert not torch.equal(want[0], logits[0])
