"""The one-launch bitmask op (octavo/kernels/grammar_mask.py) against the torch unpacking:
every bit of every word (the sign bit included), rows by index or leading, a bitmask narrower
than the logits (its tail disallowed), a vocabulary not a multiple of the block."""

from __future__ import annotations

import pytest
import torch

from octavo.kernels.grammar_mask import apply_bitmask_inplace
from octavo.sample.grammar_mask import unpack_bitmask


def _case(b, vocab, g, words, seed, device, dtype):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, vocab, generator=gen).to(dtype).to(device)
    bitmask = torch.randint(-2**31, 2**31, (g, words), generator=gen, dtype=torch.int64)
    bitmask = bitmask.to(torch.int32)
    bitmask[0, 0] = -1  # all allowed, the sign bit among them
    bitmask[-1, -1] = 0  # none
    return logits, bitmask.to(device)


def _reference(logits, bitmask, rows):
    out = logits.clone()
    allowed = unpack_bitmask(bitmask.cpu(), logits.shape[1]).to(logits.device)
    idx = rows if rows is not None else torch.arange(bitmask.shape[0], device=logits.device)
    for i, r in enumerate(idx.tolist()):
        out[r][~allowed[i]] = float("-inf")
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("b, vocab, g, words, indexed", [
    (3, 100, 3, 4, False),     # 128 bits for 100 tokens: the last word's tail ignored
    (5, 1100, 2, 35, True),    # two blocks, rows picked by index
    (4, 1300, 4, 20, False),   # bitmask of 640 ids for 1300 logits: the rest disallowed
])
def test_matches_the_torch_unpacking(device, dtype, b, vocab, g, words, indexed):
    logits, bitmask = _case(b, vocab, g, words, vocab, device, dtype)
    rows = None
    if indexed:
        rows = torch.tensor([4, 1][:g], dtype=torch.int64, device=device)
    expected = _reference(logits, bitmask, rows)
    out = apply_bitmask_inplace(logits, bitmask, rows)
    assert out is logits
    assert torch.equal(out, expected)
    untouched = [r for r in range(b) if rows is not None and r not in rows.tolist()]
    for r in untouched:
        assert torch.isfinite(out[r]).all()


def test_sampler_path_uses_it_on_a_strided_view(device):
    """Rows of a wider buffer (the runner's logits may be a view): only the last dim must be
    contiguous."""
    big = torch.randn(4, 80, device=device)
    logits = big[:, :70]
    bitmask = torch.tensor([[0b1010, 0, 0], [-1, -1, -1]], dtype=torch.int32, device=device)
    apply_bitmask_inplace(logits, bitmask)
    assert torch.isfinite(logits[0, [1, 3]]).all() and torch.isinf(logits[0, 0])
    assert torch.isinf(logits[0, 4:]).all()
    assert torch.isfinite(logits[1]).all() and torch.isfinite(logits[2:]).all()
    assert torch.isfinite(big[:, 70:]).all()
