"""split_sum: the K-split partials summed by a launch of their own, in split order, the same
bits as the in-kernel sum (0 + p0 + p1 + ...)."""

from __future__ import annotations

import pytest
import torch

from octavo.kernels.split_sum import BLOCK, sum_splits


def _in_order(partial: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    acc = torch.zeros(partial.shape[1:], dtype=torch.float32)
    for p in partial.cpu():
        acc = acc + p
    if dtype == torch.bfloat16 and str(device) == "cpu":
        # Triton's interpreter truncates float32 to bfloat16 (the GPU rounds to nearest):
        # the float32 sum's low 16 bits dropped, then an exact conversion.
        return (acc.view(torch.int32) & ~0xFFFF).view(torch.float32).to(dtype)
    return acc.to(dtype)


@pytest.mark.parametrize("splits,m,n", [(1, 3, 40), (2, 5, 256), (4, 1, BLOCK + 8), (7, 9, 96)])
def test_the_sum_is_the_in_order_sum_rounded_once(splits, m, n, device):
    g = torch.Generator().manual_seed(splits * 100 + m)
    # Magnitudes spread over 2^-20 .. 2^20: any other order or an early rounding shows.
    partial = (torch.randn(splits, m, n, generator=g)
               * torch.exp2(torch.randint(-20, 21, (splits, m, n), generator=g).float()))
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=device)
    got = sum_splits(partial.to(device), out)
    assert got is out
    assert torch.equal(got.cpu(), _in_order(partial, torch.bfloat16, device))
    out32 = torch.empty(m, n, dtype=torch.float32, device=device)
    assert torch.equal(sum_splits(partial.to(device), out32).cpu(),
                       _in_order(partial, torch.float32, device))


def test_empty_and_wrong_layouts(device):
    out = torch.empty(0, 8, dtype=torch.bfloat16, device=device)
    assert sum_splits(torch.empty(2, 0, 8, device=device), out) is out
    with pytest.raises(AssertionError):
        sum_splits(torch.zeros(2, 4, 8, device=device),
                   torch.empty(8, 4, dtype=torch.bfloat16, device=device).t())
    with pytest.raises(AssertionError):
        sum_splits(torch.zeros(2, 4, 8, dtype=torch.float16, device=device),
                   torch.empty(4, 8, dtype=torch.bfloat16, device=device))
