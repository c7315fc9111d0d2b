"""The unit-scaled W8A8 GEMM's epilogue (``octavo/kernels/outer_scale.py``): per-row and
per-column scales and a bias applied to float32 / bf16 sums, rounded once, against the torch
expression, in Triton's CPU interpreter (or the GPU where there is one); on the GPU, the
row-scaled FP8 linear through it (``fp8.scaled_mm_linear``) against ``_scaled_mm``'s
row-wise recipe and the float32 W8A8 arithmetic at Llama-3.1-8B's shapes."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from octavo.kernels.outer_scale import outer_scale, outer_scale_reference  # noqa: E402


@pytest.mark.parametrize("m,n", [(1, 40), (5, 1030), (17, 2048)])
@pytest.mark.parametrize("acc_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("scalar_a", [False, True])
def test_outer_scale_matches_torch(m, n, acc_dtype, dtype, bias, scalar_a, device):
    g = torch.Generator().manual_seed(m * n)
    acc = (torch.randn(m, n, generator=g) * 1e3).to(acc_dtype).to(device)
    a = (torch.rand(1 if scalar_a else m, generator=g) + 0.1).to(device)
    b = (torch.rand(n, generator=g) * 1e-3).to(device)
    c = torch.randn(n, generator=g).to(dtype).to(device) if bias else None
    got = outer_scale(acc, a, b, c, dtype)
    want = outer_scale_reference(acc, a, b, c, dtype)
    assert got.shape == (m, n) and got.dtype == dtype
    assert torch.allclose(got.float(), want.float(), rtol=1e-6, atol=1e-6)


def test_outer_scale_checks_its_inputs(device):
    acc = torch.zeros(3, 8, device=device)
    with pytest.raises(AssertionError):
        outer_scale(acc, torch.ones(2, device=device), torch.ones(8, device=device), None,
                    torch.float32)
    assert outer_scale(acc[:0], torch.ones(0, device=device), torch.ones(8, device=device),
                       None, torch.float32).shape == (0, 8)


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)])
@pytest.mark.parametrize("m", [9, 16, 64, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_unit_scaled_fp8_linear_on_the_gpu(n, k, m, bias, monkeypatch):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("needs CUDA with e4m3 (compute capability 8.9)")
    from octavo.kernels.fp8_quant import fp8_quant
    from octavo.quantization.fp8 import scaled_mm_linear

    g = torch.Generator().manual_seed(n + m)
    w = (torch.randn(n, k, generator=g) * 64).clamp(-448, 448).to(torch.float8_e4m3fn).cuda()
    s = (torch.rand(n, generator=g) * 1e-3 + 1e-4).cuda()
    x = torch.randn(m, k, generator=g).to(torch.bfloat16).cuda()
    c = torch.randn(n, generator=g).to(torch.bfloat16).cuda() if bias else None
    monkeypatch.setenv("OCTAVO_FP8_TENSORWISE", "1")
    got = scaled_mm_linear(x, w, s, None, c)
    monkeypatch.setenv("OCTAVO_FP8_TENSORWISE", "0")
    rowwise = scaled_mm_linear(x, w, s, None, c)
    xq, xs = fp8_quant(x, None, 1e-12, "clamp")
    want = (xq.float() * xs) @ (w.float() * s[:, None]).t()
    want = want if c is None else want + c.float()

    def rel(y):
        return ((y.float() - want).norm() / want.norm()).item()

    assert got.dtype == torch.bfloat16 and got.shape == (m, n)
    assert rel(got) < 4e-3 and rel(got) <= rel(rowwise) * 1.05 + 1e-4, (rel(got), rel(rowwise))


@pytest.mark.parametrize("m,half", [(1, 40), (6, 1100)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_glu_mode_gives_the_unfused_bits(m, half, dtype, device):
    """silu(gate) * up in the epilogue: the bits of the epilogue's plain output fed to the
    gated activation's own kernel (``activation.silu_and_mul``)."""
    from octavo.kernels.activation import silu_and_mul

    g = torch.Generator().manual_seed(m + half)
    acc = (torch.randn(m, 2 * half, generator=g) * 1e3).to(device)
    a = (torch.rand(m, generator=g) + 0.1).to(device)
    b = (torch.rand(2 * half, generator=g) * 1e-3).to(device)
    got = outer_scale(acc, a, b, None, dtype, glu=True)
    want = silu_and_mul(outer_scale(acc, a, b, None, dtype))
    assert got.shape == (m, half) and got.dtype == dtype
    assert torch.equal(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [9, 64])
def test_unit_scaled_glu_on_the_gpu(m, monkeypatch):
    """Llama-3.1-8B's gate_up: the GLU epilogue's bits equal the plain epilogue's output
    through the activation kernel."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("needs CUDA with e4m3 (compute capability 8.9)")
    from octavo.kernels.activation import silu_and_mul
    from octavo.quantization.fp8 import scaled_mm_linear

    g = torch.Generator().manual_seed(m)
    w = (torch.randn(28672, 4096, generator=g) * 64).clamp(-448, 448).to(
        torch.float8_e4m3fn).cuda()
    s = (torch.rand(28672, generator=g) * 1e-3 + 1e-4).cuda()
    x = torch.randn(m, 4096, generator=g).to(torch.bfloat16).cuda()
    monkeypatch.setenv("OCTAVO_FP8_TENSORWISE", "1")
    got = scaled_mm_linear(x, w, s, None, glu=True)
    assert torch.equal(got, silu_and_mul(scaled_mm_linear(x, w, s, None)))
