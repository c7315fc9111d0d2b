"""Activations to FP8 per group of columns (``octavo/kernels/fp8_group_quant.py``) against the
torch expressions it reproduces, in Triton's CPU interpreter (or the GPU where there is one):
partial last groups, zero groups, padded rows, the scales' rows-contiguous layout; and the
W8A8 blockwise GEMM built on it (``fp8_block_gemm.block_scaled_mm``) on the GPU at
Llama-3.1-8B's shapes against the same arithmetic emulated in float32."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from octavo.kernels.fp8_block_gemm import block_scaled_mm, fp8_block_gemm_reference  # noqa: E402
from octavo.kernels.fp8_group_quant import fp8_group_quant, fp8_group_quant_ref  # noqa: E402

FP8 = torch.float8_e4m3fn


@pytest.mark.parametrize("m,k,group,rows", [(3, 256, 128, 4), (5, 200, 64, 8), (1, 96, 32, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_group_quant_matches_torch(m, k, group, rows, dtype, device):
    g = torch.Generator().manual_seed(m * k)
    x = (torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g) * 30).to(dtype)
    x[0, :group] = 0  # an all-zero group
    x = x.to(device)
    on_cpu = str(device) == "cpu"
    q, s = fp8_group_quant(x, group, 1e-12, rows=rows,
                           out_dtype=torch.float32 if on_cpu else FP8)
    want_q, want_s = fp8_group_quant_ref(x, group, 1e-12)
    assert q.shape == (rows, k) and s.shape == (rows, -(-k // group))
    assert s.stride() == (1, rows)  # rows contiguous: cuBLAS's 1 x 128 scale operand
    assert torch.equal(s[:m], want_s) and (s[m:] == 1e-12).all()
    got = q[:m].to(FP8) if on_cpu else q[:m]  # the interpreter's quotients, rounded by torch
    assert torch.equal(got.float(), want_q.float())
    assert (q[m:].float() == 0).all()


def test_block_scaled_mm_declines_off_sm90(device):
    x = torch.randn(4, 256, dtype=torch.bfloat16, device=device)
    w = torch.zeros(128, 256, device=device).to(FP8)
    s = torch.ones(1, 2, device=device)
    if str(device) == "cpu":
        assert block_scaled_mm(x, w, s, (128, 128)) is None
    assert block_scaled_mm(x.float(), w, s, (128, 128)) is None  # float32: dequantized
    assert block_scaled_mm(x, w, s.repeat(2, 2), (64, 64)) is None


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)])
@pytest.mark.parametrize("m", [17, 64, 300])
def test_block_scaled_mm_on_the_gpu(n, k, m):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs an sm_90 GPU")
    g = torch.Generator().manual_seed(n + m)
    w = (torch.randn(n, k, generator=g) * 100).clamp(-448, 448).to(FP8).cuda()
    s = (torch.rand(n // 128, k // 128, generator=g) / (200 * k ** 0.5) + 1e-6).cuda()
    x = torch.randn(m, k, generator=g).to(torch.bfloat16).cuda()
    got = block_scaled_mm(x, w, s, (128, 128))
    assert got is not None and got.shape == (m, n) and got.dtype == torch.bfloat16
    q, qs = fp8_group_quant_ref(x, 128, 1e-12)
    x_rounded = (q.float().view(m, -1, 128) * qs[..., None]).view(m, k)
    want = fp8_block_gemm_reference(x_rounded, w, s, (128, 128))
    rel = ((got.float() - want.float()).norm() / want.float().norm()).item()
    assert rel < 5e-3, rel
    # and within FP8 activation rounding of the weight-only product
    exact = fp8_block_gemm_reference(x.float(), w, s, (128, 128))
    assert ((got.float() - exact).norm() / exact.norm()).item() < 5e-2
