"""skinny_gemm (decode-batch float GEMM, split-K reduced in place) against F.linear."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from octavo.kernels.skinny_gemm import skinny_gemm, supports  # noqa: E402


@pytest.mark.parametrize("m", [1, 3, 16, 24, 33])
@pytest.mark.parametrize("nk", [(40, 32), (96, 160), (64, 48)])
@pytest.mark.parametrize("split_k", [1, 3, None])
def test_matches_linear(m, nk, split_k, device):
    n, k = nk
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float16
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, generator=g).to(device, dtype)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(device, dtype)
    b = torch.randn(n, generator=g).to(device, dtype)
    got = skinny_gemm(x, w, b, block_n=32, block_k=16, split_k=split_k)
    ref = F.linear(x.float(), w.float(), b.float())
    torch.testing.assert_close(got.float(), ref, atol=3e-2, rtol=3e-2)
    assert got.dtype == dtype and got.shape == (m, n)


def test_a_3d_input_keeps_its_leading_dims(device):
    x = torch.randn(2, 3, 32).to(device, torch.float16)
    w = torch.randn(24, 32).to(device, torch.float16)
    got = skinny_gemm(x, w, block_n=16, block_k=16)
    assert got.shape == (2, 3, 24)
    torch.testing.assert_close(got.float(), F.linear(x.float(), w.float()), atol=5e-2, rtol=2e-2)


def test_supports_only_decode_batches_in_half_precision():
    w = torch.empty(8, 32, dtype=torch.bfloat16)
    assert not supports(torch.empty(1, 32, dtype=torch.bfloat16), w)  # not CUDA
    if torch.cuda.is_available():
        wc = w.cuda()
        assert supports(torch.empty(32, 32, dtype=torch.bfloat16, device="cuda"), wc)
        assert not supports(torch.empty(33, 32, dtype=torch.bfloat16, device="cuda"), wc)
        assert not supports(torch.empty(1, 32, device="cuda"), wc)  # float32 stays cuBLAS


def test_only_tall_k_weights_are_preferred():
    from octavo.kernels.skinny_gemm import preferred

    assert preferred(torch.empty(1024, 2048)) and preferred(torch.empty(1024, 3072))
    assert not preferred(torch.empty(4096, 1024)) and not preferred(torch.empty(4096, 4096))
    # 17-32 rows: small tall-K weights only (Qwen3-0.6B's o / down, not Llama-8B's down).
    llama_down = torch.empty(4096, 14336)
    assert preferred(llama_down, 16) and not preferred(llama_down, 17)
    assert preferred(torch.empty(1024, 3072), 32) and preferred(torch.empty(1024, 2048), 17)
    assert not preferred(torch.empty(4096, 1024), 32)


# CI compiles the largest tile; the others (2.5 s each on 2 cores) with the slow tests.
@pytest.mark.parametrize("m,k", [pytest.param(16, 1024, marks=pytest.mark.slow),
                                 pytest.param(32, 1024, marks=pytest.mark.slow),
                                 pytest.param(64, 1024, marks=pytest.mark.slow), (64, 3072)])
def test_default_tiles_fit_shared_memory(m, k):
    """The default tiles compiled for sm_90 (offline, by scripts/triton_sass.py with the
    ptxas the triton package carries; in a process of its own, as the interpreter's kernels
    do not compile) fit an H200 SM's shared memory at the launch's four stages: 64 rows at
    256-wide K steps asked for 245,760 bytes on the H200, and the launch failed."""
    import re

    from octavo.kernels.skinny_gemm import default_tiles
    from tests.kernels.sm90 import compile_sm90

    block_n, block_k = default_tiles(m, k)
    code = compile_sm90(
        "octavo.kernels.skinny_gemm:_skinny_gemm_kernel", "--const",
        f"BLOCK_M={max(16, 1 << (m - 1).bit_length())}", f"BLOCK_N={block_n}",
        f"BLOCK_K={block_k}", "PDL=0", "--ptr", "cnt_ptr=i32", "part_ptr=fp32",
        "--ones", "stride_xk", "stride_wk", "stride_on", "stride_pn",
        "--div16", "stride_xm", "stride_wn", "stride_om", "K", "K_PER_SPLIT", "stride_ps",
        "stride_pm", "--num-warps", "4", "--num-stages", "4")
    found = re.search(r"shared (\d+) B", code.report)
    assert found, code.report
    assert int(found.group(1)) <= 232448, found.group(0)
