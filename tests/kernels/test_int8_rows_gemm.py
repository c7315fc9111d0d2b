"""The 8-bit rows-layout tensor-core GEMM (octavo/kernels/int8_rows_gemm.py) against the float32
dequantize-then-matmul reference: small shapes through the Triton interpreter on the CPU
(float32: the interpreter's bf16 dot is not the GPU's), Llama-8B shapes in bf16 on the GPU."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from octavo.kernels.int8_gemv import int8_gemv_ref, pack_rows  # noqa: E402
from octavo.kernels.int8_rows_gemm import int8_rows_gemm, supports  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _case(m, k, n, group, sym, dtype, seed=0, device=DEVICE):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 256, (k, n), generator=g)
    scales = (torch.rand(k // group, n, generator=g) * 0.01 + 1e-3).to(torch.float16)
    zeros = 128.0 if sym else torch.randint(0, 256, (k // group, n), generator=g).to(
        torch.float16).to(device)
    x = torch.randn(m, k, generator=g).to(dtype)
    return x.to(device), pack_rows(q).to(device), scales.to(device), zeros


def _rel_err(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp(min=1e-12)).item()


@pytest.mark.parametrize("sym", [True, False])
@pytest.mark.parametrize("m,k,n,group,tuning", [
    (3, 128, 72, 32, {}),                             # N not a multiple of the tile
    (17, 128, 64, 64, {"split_k": 2}),                # 64-row tiles, two K splits
    (5, 96, 16, 96, {"block_k": 32, "block_n": 16}),  # one group per row, 3 K tiles
    (2, 64, 32, 16, {}),                              # 16-wide groups
])
def test_matches_reference(m, k, n, group, tuning, sym):
    x, w, s, z = _case(m, k, n, group, sym, torch.float32)
    out = int8_rows_gemm(x, w, s, z, group, **tuning)
    assert out.shape == (m, n) and out.dtype == torch.float32
    assert _rel_err(out, int8_gemv_ref(x, w, s, z, group)) < 1e-5


def test_supports_and_refuses_tiles_across_groups():
    assert supports(4096, 128) and supports(4096, 4096) and supports(64, 16)
    assert not supports(4096, 8) and not supports(4000, 128)
    x, w, s, z = _case(3, 128, 16, 32, True, torch.float32)
    with pytest.raises(AssertionError):
        int8_rows_gemm(x, w, s, z, 32, block_k=64)  # a K tile would straddle two groups


@pytest.mark.gpu
@pytest.mark.parametrize("m", [3, 16, 64, 128])
@pytest.mark.parametrize("k,n,group", [(4096, 6144, 128), (14336, 4096, 14336)])
def test_real_shapes_gpu(m, k, n, group):
    for sym in (True, False):
        x, w, s, z = _case(m, k, n, group, sym, torch.bfloat16, device=torch.device("cuda"))
        out = int8_rows_gemm(x, w, s, z, group)
        assert _rel_err(out, int8_gemv_ref(x, w, s, z, group)) < 2.0**-7
