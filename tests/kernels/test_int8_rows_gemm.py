"""The 8-bit rows-layout tensor-core GEMM (octavo/kernels/int8_rows_gemm.py) against the float32
dequantize-then-matmul reference: small shapes through the Triton interpreter on the CPU
(float32: the interpreter's bf16 dot is not the GPU's), Llama-8B shapes in bf16 on the GPU."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from octavo.kernels.int8_gemv import int8_gemv_ref  # noqa: E402
from octavo.kernels.int8_rows_gemm import int8_rows_gemm, supports  # noqa: E402
from tests.kernels.test_int8_gemv import _case as _gemv_case  # noqa: E402  (one set of cases)
from tests.kernels.test_int8_gemv import _rel_err  # noqa: E402


def _case(m, k, n, group, sym, dtype, seed=0, device=None):
    x, w, s, z, _ = _gemv_case(m, k, n, group, sym, dtype, seed,
                               **({"device": device} if device else {}))
    return x, w, s, z


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
