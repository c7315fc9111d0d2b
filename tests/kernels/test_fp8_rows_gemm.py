"""Row-scaled FP8 weights past the GEMV's rows (``octavo/kernels/fp8_rows_gemm.py``, fused_moe's
down launch with one expert and row scales): against the float32 product with the
dequantized weight, in Triton's CPU interpreter (or the GPU where there is one), partial row
and column tiles, float32 / bf16 / fp16 activations; Llama-3.1-8B's shapes on the GPU."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from octavo.kernels.fp8_rows_gemm import (  # noqa: E402
    default_tiles,
    fp8_rows_gemm,
    fp8_rows_gemm_reference,
)
from octavo.kernels.fused_moe import MoeTiles  # noqa: E402

FP8 = torch.float8_e4m3fn


def _case(m, n, k, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) * 100).clamp(-448, 448).to(FP8)
    s = torch.rand(n, generator=g) / (200 * k ** 0.5) + 1e-6
    x = torch.randn(m, k, generator=g).to(dtype)
    return x.to(device), w.to(device), s.to(device)


def _rel(got, want):
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


@pytest.mark.parametrize("m,n,k,tiles", [
    (3, 48, 128, None),
    (17, 70, 192, MoeTiles(16, 32, 64, 4, 2)),  # a second row tile; partial N and K tiles
    (9, 64, 256, MoeTiles(32, 64, 128, 4, 2)),
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gemm_matches_the_dequantized_product(m, n, k, tiles, dtype, device):
    x, w, s = _case(m, n, k, dtype, device, seed=m * n)
    got = fp8_rows_gemm(x, w, s, tiles)
    want = x.float() @ (w.float() * s[:, None].float()).t()
    assert got.shape == (m, n) and got.dtype == dtype
    assert _rel(got, want) < (1e-6 if dtype == torch.float32 else 1e-2)
    if dtype != torch.float32:
        assert _rel(got, fp8_rows_gemm_reference(x, w, s)) < 1e-2


def test_errors_and_empty_batches(device):
    x, w, s = _case(3, 32, 64, torch.float32, device)
    with pytest.raises(ValueError, match=r"weight \(32, 64\) torch.float32 is not"):
        fp8_rows_gemm(x, w.float(), s)
    with pytest.raises(ValueError, match=r"scale is \(31,\) torch.float32, not float32 \[32\]"):
        fp8_rows_gemm(x, w, s[:31])
    assert fp8_rows_gemm(x[:0], w, s).shape == (0, 32)
    assert default_tiles(16, torch.bfloat16).block_m == 16
    assert default_tiles(40, torch.bfloat16).block_m == 32


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)])
@pytest.mark.parametrize("m", [3, 16, 33, 64])
def test_llama_8b_shapes_on_the_gpu(n, k, m):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("needs CUDA with e4m3 (compute capability 8.9)")
    x, w, s = _case(m, n, k, torch.bfloat16, "cuda")
    assert _rel(fp8_rows_gemm(x, w, s), fp8_rows_gemm_reference(x, w, s)) < 1e-2
