"""benchmarks/quantized.py's weight-read share: what reading a step's weights at the device's
published bandwidth takes of the measured time per token."""

from __future__ import annotations

import pytest

from benchmarks.quantized import weight_read_fraction


def test_weight_read_fraction():
    # 3.35 GB at 3.35 TB/s is 1 ms: half of a 2 ms step, all of a 1 ms one
    assert weight_read_fraction(3_350_000_000, 2.0, 3.35) == 0.5
    assert weight_read_fraction(3_350_000_000, 1.0, 3.35) == 1.0
    # Llama-8B W4A16 on an H100 (session 60): 4.76 GB a step (less the embedding) in 2.452 ms
    assert weight_read_fraction(4_758_000_000, 2.452, 3.35) == pytest.approx(0.579, abs=1e-3)


@pytest.mark.parametrize("tbps,tpot", [(None, 2.0), (0.0, 2.0), (3.35, 0.0), (3.35, -1.0)])
def test_weight_read_fraction_unknown(tbps, tpot):
    assert weight_read_fraction(10**9, tpot, tbps) is None
