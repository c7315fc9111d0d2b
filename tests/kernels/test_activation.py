"""silu_and_mul (Triton) against silu_and_mul_ref."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from octavo.kernels.activation import silu_and_mul, silu_and_mul_ref  # noqa: E402

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
TOL = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(7, 2 * 48), (3, 2 * 1500), (2, 3, 64), (0, 32)])
def test_silu_and_mul(dtype, shape, device):
    x = (torch.randn(shape, device=device) * 4).to(dtype)
    out = silu_and_mul(x)
    assert out.shape == (*shape[:-1], shape[-1] // 2) and out.dtype == dtype
    torch.testing.assert_close(out, silu_and_mul_ref(x), **TOL[dtype])


def test_matches_formula(device):
    x = torch.randn(5, 64, device=device)
    torch.testing.assert_close(silu_and_mul(x), F.silu(x[:, :32]) * x[:, 32:])


@pytest.mark.gpu
@needs_cuda
def test_gpu_real_shapes():
    x = torch.randn(4096, 2 * 11008, device="cuda", dtype=torch.bfloat16)
    torch.testing.assert_close(silu_and_mul(x), silu_and_mul_ref(x), **TOL[x.dtype])
