"""benchmarks/cublas_rows.py's verdict: the row counts a GEMM would run faster padded to."""

from __future__ import annotations

from benchmarks.cublas_rows import slower_than_larger


def test_counts_slower_than_a_larger_one_name_the_fastest_larger():
    # Session 35's Llama-8B gate_up (us): 128 rows slower than 192.
    assert slower_than_larger({64: 68.8, 128: 103.4, 192: 73.8, 256: 88.9}) == {128: (192, 73.8)}
    assert slower_than_larger({8: 3.0, 16: 5.0, 24: 4.0, 32: 2.0}) == {8: (32, 2.0),
                                                                        16: (32, 2.0),
                                                                        24: (32, 2.0)}
    assert slower_than_larger({1: 1.0, 2: 2.0, 3: 3.0}) == {}  # monotonic: nothing to pad
    assert slower_than_larger({}) == {}
