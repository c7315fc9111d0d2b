"""The one-pass temperature sampler (octavo/kernels/sample_race.py) against torch: greedy rows
exact, random rows following softmax(logits / T), draws depending only on (seed, row's
logits), split-vocabulary launches equal to one-program ones."""

from __future__ import annotations

import pytest
import torch

from octavo.kernels.sample_race import race_sample, race_sample_ref

V = 37  # odd, so blocks and splits have ragged ends


def _logits(b, v=V, seed=0, device="cpu", dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, v, generator=g) * 2).to(dtype).to(device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_rows_are_argmax(device, dtype):
    x = _logits(5, device=device, dtype=dtype)
    x[2, 7] = x[2, 11] = x[2].max() + 1  # a tie: the first column wins, as torch.argmax
    t = torch.zeros(5, device=device)
    base = torch.tensor([5], dtype=torch.int64, device=device)
    assert race_sample(x, t, base).tolist() == x.float().argmax(1).tolist()


def test_mixed_rows_and_seed_determinism(device):
    x = _logits(6, device=device)
    t = torch.tensor([0.0, 0.7, 1.0, 0.0, 2.0, 0.5], device=device)
    base = torch.tensor([100], dtype=torch.int64, device=device)
    seeds = torch.tensor([-1, 2**62 + 3, -1, -1, 5, -1], dtype=torch.int64, device=device)
    a = race_sample(x, t, base, seeds)
    assert a.tolist() == race_sample(x, t, base, seeds).tolist()  # same seeds, same draw
    assert a[0] == x[0].argmax() and a[3] == x[3].argmax()
    # A seeded row's draw does not depend on the batch around it or the step's base seed.
    other = torch.tensor([7], dtype=torch.int64, device=device)
    solo = race_sample(x[4:5], t[4:5], other, seeds[4:5])
    assert solo.item() == a[4].item()
    # Unseeded rows draw base + row: the same as a row seed of that value.
    as_row = race_sample(x[2:3], t[2:3], other, torch.tensor([102], device=device))
    assert as_row.item() == a[2].item()


def test_distribution_matches_softmax(device):
    torch.manual_seed(0)
    n, temp = 1500, 0.8
    row = _logits(1, v=V, seed=3)[0]
    x = row.expand(n, V).contiguous().to(device)
    t = torch.full((n,), temp, device=device)
    base = torch.tensor([12345], dtype=torch.int64, device=device)
    got = torch.bincount(race_sample(x, t, base).cpu(), minlength=V).float() / n
    want = torch.softmax(row / temp, dim=0)
    # Total variation distance: ~0.05 expected for 1500 draws of a 37-way distribution.
    assert 0.5 * (got - want).abs().sum().item() < 0.12
    ref = torch.bincount(race_sample_ref(row.expand(n, V), torch.full((n,), temp)),
                         minlength=V).float() / n
    assert 0.5 * (ref - want).abs().sum().item() < 0.12


def test_split_vocabulary_matches_one_program(device, monkeypatch):
    import octavo.kernels.sample_race as mod
    from octavo.kernels import triton_utils

    x = _logits(2, v=300, device=device)
    t = torch.tensor([0.9, 0.0], device=device)
    base = torch.tensor([11], dtype=torch.int64, device=device)
    monkeypatch.setattr(mod, "next_power_of_2", lambda n: 16)  # 16-wide blocks: many splits
    many = race_sample(x, t, base)
    monkeypatch.setattr(triton_utils, "num_compute_units", lambda d: 0)  # one program a row
    one = race_sample(x, t, base)
    assert many.tolist() == one.tolist()
