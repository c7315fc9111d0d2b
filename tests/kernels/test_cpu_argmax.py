"""The CPU argmax kernel (kernels/cpu/argmax.cpp) against torch.argmax(dim=-1): ties, NaN,
infinities, signed zeros, row lengths around the 16-lane vector width, strided rows."""

from __future__ import annotations

import pytest
import torch

from octavo.kernels import cpu as cpu_kernels
from octavo.sample.sampler import argmax

ops = cpu_kernels.load()
pytestmark = pytest.mark.skipif(ops is None or not hasattr(ops, "argmax_rows"),
                                reason="CPU kernels not built")


@pytest.mark.parametrize("n", [1, 7, 15, 16, 17, 31, 33, 100, 49152])
@pytest.mark.parametrize("rows", [1, 3, 32])
def test_matches_torch_argmax(rows, n):
    g = torch.Generator().manual_seed(rows * 1000 + n)
    x = torch.randn(rows, n, generator=g)
    assert torch.equal(ops.argmax_rows(x), x.argmax(dim=-1))


def test_ties_first_index():
    x = torch.zeros(4, 40)
    x[0, [3, 20, 35]] = 5.0   # a tie inside one vector and across vectors
    x[1, [33, 34]] = 1.0      # tie in the scalar tail
    x[2] = -torch.inf         # all -inf: index 0
    x[3, 5], x[3, 30] = -0.0, 0.0  # zeros are all equal: the first one
    x[3, :] = torch.where(torch.arange(40) < 5, torch.tensor(-1.0), x[3])
    assert torch.equal(ops.argmax_rows(x), x.argmax(dim=-1))


@pytest.mark.parametrize("pos", [0, 17, 38])
def test_nan_ranks_first(pos):
    x = torch.randn(2, 39, generator=torch.Generator().manual_seed(pos))
    x[0, pos] = torch.nan
    x[0, 30] = torch.inf
    x[1, 10] = torch.inf
    x[1, 12] = torch.inf
    assert torch.equal(ops.argmax_rows(x), x.argmax(dim=-1))


def test_strided_rows_and_sampler_helper():
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(1))[:, :50]  # row stride 64
    assert torch.equal(ops.argmax_rows(x), x.argmax(dim=-1))
    assert torch.equal(argmax(x), x.argmax(dim=-1))
    xb = x.to(torch.bfloat16)  # the helper falls back to torch for other dtypes
    assert torch.equal(argmax(xb), xb.argmax(dim=-1))
    with pytest.raises(RuntimeError, match="float32"):
        ops.argmax_rows(xb)
