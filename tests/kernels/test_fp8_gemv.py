"""The FP8-weight GEMV (octavo/kernels/fp8_gemv.py) against its float32 reference: small shapes
through the Triton interpreter on the CPU, Llama-8B shapes on the GPU."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from octavo.kernels.fp8_gemv import fp8_gemv, fp8_gemv_ref  # noqa: E402

FP8 = torch.float8_e4m3fn
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _case(m, k, n, dtype, device=DEVICE, seed=0):
    g = torch.Generator().manual_seed(seed)
    weight = (torch.randn(n, k, generator=g) * 100).clamp(-448, 448).to(FP8)
    scale = torch.rand(n, generator=g) * 0.01 + 1e-4
    x = torch.randn(m, k, generator=g).to(dtype)
    return x.to(device), weight.to(device), scale.to(device)


def _rel_err(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp(min=1e-12)).item()


@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("k,n,tuning", [
    (64, 40, {}),                                   # N not a multiple of the tile
    (100, 24, {"block_k": 32, "split_k": 2}),       # K tail masked, two splits
    (96, 16, {"block_k": 16, "block_n": 16, "split_k": 5}),
    (48, 8, {"block_k": 64, "split_k": 1}),          # one step, larger than K
])
def test_matches_reference(m, k, n, tuning):
    x, weight, scale = _case(m, k, n, torch.float32)
    out = fp8_gemv(x, weight, scale, **tuning)
    assert out.shape == (m, n) and out.dtype == x.dtype
    assert _rel_err(out, fp8_gemv_ref(x, weight, scale)) < 1e-5


def test_split_k_is_deterministic_and_leaves_counters_zeroed():
    from octavo.kernels import split_k

    x, weight, scale = _case(2, 128, 32, torch.float32)
    first = fp8_gemv(x, weight, scale, block_k=16, split_k=4)
    assert torch.equal(first, fp8_gemv(x, weight, scale, block_k=16, split_k=4))
    assert not split_k.counters(DEVICE, 1).any()


def test_scale_must_be_one_per_row():
    x, weight, scale = _case(1, 32, 8, torch.float32)
    with pytest.raises(AssertionError):
        fp8_gemv(x, weight, scale[:4])


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("k,n", [(4096, 6144), (14336, 4096), (4096, 28672)])
def test_real_shapes_gpu(m, k, n):
    x, weight, scale = _case(m, k, n, torch.bfloat16, device=torch.device("cuda"))
    out = fp8_gemv(x, weight, scale)
    assert _rel_err(out, fp8_gemv_ref(x, weight, scale)) < 1e-2
