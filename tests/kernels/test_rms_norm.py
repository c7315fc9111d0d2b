"""rms_norm / fused_add_rms_norm (Triton) against their references."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from octavo.kernels.rms_norm import (  # noqa: E402
    fused_add_rms_norm,
    fused_add_rms_norm_ref,
    rms_norm,
    rms_norm_ref,
)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
TOL = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(5, 64), (3, 100), (2, 3, 32), (0, 16)])
def test_rms_norm(dtype, shape, device):
    x = (torch.randn(shape, device=device) * 3).to(dtype)
    w = (torch.rand(shape[-1], device=device) + 0.5).to(dtype)
    out = rms_norm(x, w, 1e-6)
    assert out.shape == x.shape and out.dtype == dtype
    torch.testing.assert_close(out, rms_norm_ref(x, w, 1e-6), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(5, 64), (3, 100)])
def test_fused_add_rms_norm(dtype, shape, device):
    x = torch.randn(shape, device=device).to(dtype)
    res = torch.randn(shape, device=device).to(dtype)
    x0, res0 = x.clone(), res.clone()
    w = (torch.rand(shape[-1], device=device) + 0.5).to(dtype)
    out, new_res = fused_add_rms_norm(x, res, w, 1e-5)
    ref_out, ref_res = fused_add_rms_norm_ref(x, res, w, 1e-5)
    # Bit-exact on GPU; Triton's CPU interpreter truncates (not rounds) fp32 -> bf16.
    exact = device.type == "cuda" or dtype != torch.bfloat16
    tol = dict(atol=0, rtol=0) if exact else TOL[dtype]
    torch.testing.assert_close(new_res, ref_res, **tol)
    torch.testing.assert_close(new_res, x + res, **tol)
    torch.testing.assert_close(out, ref_out, **TOL[dtype])
    assert torch.equal(x, x0) and torch.equal(res, res0)  # inputs untouched


def test_rms_norm_matches_formula(device):
    x = torch.randn(4, 32, device=device)
    w = torch.rand(32, device=device)
    expect = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    torch.testing.assert_close(rms_norm(x, w, 1e-6), expect, atol=1e-5, rtol=1e-5)


def test_strided_rows(device):
    x = torch.randn(6, 64, device=device)[::2]  # row stride 128
    w = torch.rand(64, device=device)
    torch.testing.assert_close(rms_norm(x, w, 1e-6), rms_norm_ref(x, w, 1e-6))


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("hidden", [2048, 4096, 5120, 8192])
def test_gpu_real_shapes(hidden):
    x = torch.randn(1000, hidden, device="cuda", dtype=torch.bfloat16)
    res = torch.randn_like(x)
    w = torch.rand(hidden, device="cuda", dtype=torch.bfloat16) + 0.5
    torch.testing.assert_close(rms_norm(x, w, 1e-6), rms_norm_ref(x, w, 1e-6), **TOL[x.dtype])
    out, new_res = fused_add_rms_norm(x, res, w, 1e-6)
    ref_out, ref_res = fused_add_rms_norm_ref(x, res, w, 1e-6)
    torch.testing.assert_close(new_res, ref_res)
    torch.testing.assert_close(out, ref_out, **TOL[x.dtype])
