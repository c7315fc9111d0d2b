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


def test_pad_rule_knob_is_parsed_and_checked(monkeypatch):
    import pytest

    from octavo import envs

    monkeypatch.delenv("OCTAVO_CUBLAS_PAD_ROWS", raising=False)
    assert envs.cublas_pad_rows() == []
    monkeypatch.setenv("OCTAVO_CUBLAS_PAD_ROWS", "97-128:192/28672, 200-250:256")
    assert envs.cublas_pad_rows() == [(97, 128, 192, 28672), (200, 250, 256, 0)]
    for bad in ("128:192", "97-128", "a-b:c", "130-128:192", "97-128:100", "0-4:8",
                "97-128:192/x", "97-128:192/-1"):
        monkeypatch.setenv("OCTAVO_CUBLAS_PAD_ROWS", bad)
        with pytest.raises(ValueError, match="OCTAVO_CUBLAS_PAD_ROWS"):
            envs.cublas_pad_rows()


def test_padded_linear_drops_the_padding_rows(monkeypatch):
    import torch
    import torch.nn.functional as F

    from octavo.kernels.float_linear import padded_linear

    torch.manual_seed(0)
    w, b = torch.randn(48, 32), torch.randn(48)
    for shape in ((100, 32), (4, 25, 32), (3, 32)):
        x = torch.randn(*shape)
        got = padded_linear(x, w, b, [(97, 128, 192, 0), (90, 100, 96, 0)])  # the first wins
        assert got.shape == (*shape[:-1], 48)
        torch.testing.assert_close(got, F.linear(x, w, b))
    x = torch.randn(100, 32)  # a rule that would shrink the rows is ignored
    torch.testing.assert_close(padded_linear(x, w, b, [(90, 100, 96, 0)]), F.linear(x, w, b))
    calls = []
    real = F.pad
    monkeypatch.setattr(F, "pad", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    padded_linear(x, w, b, [(97, 128, 192, 4096)])  # a rule for another N: not padded
    assert calls == []
    padded_linear(x, w, b, [(97, 128, 192, 48)])
    assert calls == [(0, 0, 0, 92)]
