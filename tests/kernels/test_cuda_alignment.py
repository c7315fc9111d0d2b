"""cuda_module.aligned / aligned_rows: what the CUDA kernels' 16-byte copies may read."""

from __future__ import annotations

import torch

from octavo.kernels import cuda_module


def _offset_view(rows: int, cols: int) -> torch.Tensor:
    """A contiguous [rows, cols] bf16 view that starts 2 bytes past a 16-byte boundary."""
    base = torch.arange(rows * cols + 1, dtype=torch.float32).to(torch.bfloat16)
    view = base[1:].view(rows, cols)
    assert view.is_contiguous() and view.data_ptr() % 16 == 2
    return view


def test_aligned_copies_only_what_is_not():
    view = _offset_view(4, 64)
    for fix in (cuda_module.aligned, cuda_module.aligned_rows):
        out = fix(view)
        assert out.data_ptr() % 16 == 0 and out.is_contiguous() and torch.equal(out, view)
    fresh = torch.zeros(4, 64, dtype=torch.bfloat16)
    assert cuda_module.aligned(fresh) is fresh and cuda_module.aligned_rows(fresh) is fresh


def test_aligned_rows_keeps_padded_rows_and_copies_the_rest():
    padded = torch.zeros(4, 80, dtype=torch.bfloat16)[:, :64]  # rows 160 bytes apart
    assert cuda_module.aligned_rows(padded) is padded
    assert cuda_module.aligned(padded).is_contiguous()
    odd = torch.zeros(4, 70, dtype=torch.bfloat16)[:, :64]  # a row stride of 70: copied
    out = cuda_module.aligned_rows(odd)
    assert out.is_contiguous() and torch.equal(out, odd)
