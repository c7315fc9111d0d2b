"""The CPU KV pool is zeroed lazily: its pages become resident only when blocks are used."""

from __future__ import annotations

import sys

import pytest
import torch

from octavo.worker.kv_cache import lazy_zeros


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_lazy_zeros_is_a_zeroed_writable_tensor():
    t = lazy_zeros((2, 3, 4, 16, 8), torch.bfloat16)
    assert t.shape == (2, 3, 4, 16, 8) and t.dtype == torch.bfloat16 and t.is_contiguous()
    assert torch.count_nonzero(t) == 0
    t[1, 2] = 1.5
    assert t.float().sum().item() == 1.5 * 4 * 16 * 8
    assert lazy_zeros((0, 4), torch.float32).numel() == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_untouched_pool_is_not_resident():
    before = _rss_bytes()
    t = lazy_zeros((2, 2048, 16, 1024), torch.float32)  # 256 MiB
    t[:, :8].fill_(1.0)  # a few blocks in use: 1 MiB
    assert _rss_bytes() - before < 64 << 20
    del t
