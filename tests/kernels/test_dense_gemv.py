"""dense_gemv (CUDA-core GEMV for 1-2 rows with a bf16 / fp16 weight, PDL) against F.linear,
and float_linear's choice of kernel."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from octavo.kernels.dense_gemv import MAX_M, dense_gemv, supports  # noqa: E402


def _case(m, n, k, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(device, dtype)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(device, dtype)
    return x, w


@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("nk", [(40, 96), (33, 1000), (64, 512)])  # ragged N, ragged K, even
@pytest.mark.parametrize("split_k", [1, 3, None])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_matches_float32_linear(m, nk, split_k, dtype, device):
    n, k = nk
    x, w = _case(m, n, k, dtype, device, m * 1000 + n + k)
    got = dense_gemv(x, w, block_n=16, block_k=64, split_k=split_k)
    ref = F.linear(x.float(), w.float())
    assert got.dtype == dtype and got.shape == (m, n)
    # Float32 accumulation rounded once: within one unit in the last place of the output.
    ulp = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -10
    assert ((got.float() - ref).abs() <= ulp * ref.abs().clamp_min(1.0)).all()


@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("nk", [(40, 96), (33, 1000), (64, 512)])
@pytest.mark.parametrize("split_k", [1, 3])
def test_glu_input_equals_the_activation_then_the_gemv(m, nk, split_k, device):
    """``glu=True`` on [gate | up] gives the bits of silu_and_mul's kernel followed by the
    GEMV on its output (one shared formula, rounded to x's dtype), with even and ragged K."""
    from octavo.kernels.activation import silu_and_mul

    n, k = nk
    g = torch.Generator().manual_seed(n + k)
    gate_up = (torch.randn(m, 2 * k, generator=g) * 3).to(device, torch.bfloat16)
    _, w = _case(m, n, k, torch.bfloat16, device, 7)
    bias = torch.randn(n, generator=g).to(device, torch.bfloat16)
    fused = dense_gemv(gate_up, w, bias, block_n=16, block_k=64, split_k=split_k, glu=True)
    separate = dense_gemv(silu_and_mul(gate_up), w, bias, block_n=16, block_k=64,
                          split_k=split_k)
    assert fused.shape == (m, n) and torch.equal(fused, separate)


def test_split_sums_are_deterministic_and_the_bias_is_added(device):
    x, w = _case(1, 48, 256, torch.bfloat16, device, 7)
    b = torch.randn(48).to(device, torch.bfloat16)
    a1 = dense_gemv(x, w, b, block_n=16, block_k=64, split_k=4)
    a2 = dense_gemv(x, w, b, block_n=16, block_k=64, split_k=4)
    assert torch.equal(a1, a2)
    ref = F.linear(x.float(), w.float(), b.float())
    torch.testing.assert_close(a1.float(), ref, atol=3e-2, rtol=2e-2)


def test_a_3d_input_keeps_its_leading_dims(device):
    x, w = _case(2, 24, 64, torch.float16, device, 3)
    got = dense_gemv(x.view(2, 1, 64), w, block_n=8, block_k=32)
    assert got.shape == (2, 1, 24)
    torch.testing.assert_close(got.view(2, 24).float(), F.linear(x.float(), w.float()),
                               atol=1e-2, rtol=1e-2)


def test_supports_only_one_or_two_half_precision_rows():
    w = torch.empty(8, 32, dtype=torch.bfloat16)
    assert supports(torch.empty(MAX_M, 32, dtype=torch.bfloat16), w)
    assert not supports(torch.empty(MAX_M + 1, 32, dtype=torch.bfloat16), w)
    assert not supports(torch.empty(0, 32, dtype=torch.bfloat16), w)
    assert not supports(torch.empty(1, 32), w.float())  # float32 stays cuBLAS
    assert not supports(torch.empty(1, 32, dtype=torch.float16), w)  # dtypes differ
    strided = torch.empty(32, 8, dtype=torch.bfloat16).t()  # [8, 32], not contiguous along K
    assert not supports(torch.empty(1, 32, dtype=torch.bfloat16), strided)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_float_linear_picks_the_gemv_for_decode_rows(monkeypatch):
    from octavo.kernels import dense_gemv as mod
    from octavo.kernels.float_linear import linear

    monkeypatch.setenv("OCTAVO_CUDA_DENSE", "0")  # the CUDA dense GEMM would come first
    calls = []
    real = mod.dense_gemv
    monkeypatch.setattr(mod, "dense_gemv", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    w = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16)
    for m in (1, 2, 3):
        x = torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16)
        torch.testing.assert_close(linear(x, w).float(), F.linear(x.float(), w.float()),
                                   atol=0.1, rtol=2e-2)
    assert len(calls) == 1  # one row only (GEMV_ROWS)
    monkeypatch.setenv("OCTAVO_DENSE_GEMV", "0")
    linear(torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16), w)
    assert len(calls) == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("nk", [(4096, 1024), (1024, 3072), (6144, 4096), (28672, 4096),
                                (4096, 14336), (151936, 1024)])
def test_real_shapes_on_the_gpu(m, nk):
    n, k = nk
    x, w = _case(m, n, k, torch.bfloat16, torch.device("cuda"), n + k + m)
    got = dense_gemv(x, w)
    ref = F.linear(x.float(), w.float())
    assert ((got.float() - ref).abs() <= 2.0 ** -7 * ref.abs().clamp_min(1.0)).all()
