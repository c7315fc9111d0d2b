"""The fused bitsandbytes 4-bit GEMM (``octavo/kernels/bnb4_gemm.py``, codes decoded by selects)
against the
dequantized product (``bnb_weight.dequantize_packed``, bitsandbytes' values): NF4 and FP4,
blocks of 32-256, row counts from 3 to past one M tile, partial N tiles, K split over
programs, float32 / float16 activations in Triton's CPU interpreter (bf16 too on a GPU:
the interpreter's bf16 dot is wrong), Llama-3.1-8B's shapes on the GPU; an sm_90 compile
without spills."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from octavo.kernels.bnb4_gemm import block_k, bnb4_gemm, plan, supported  # noqa: E402
from octavo.quantization.bnb_weight import dequantize_packed  # noqa: E402
from tests.kernels.test_bnb4_gemv import _rel, _weight  # noqa: E402


def _want(x, b, blocksize, device):
    """The dequantize-then-matmul path's result: the weight rounded once to x's dtype."""
    w = dequantize_packed(b.packed, b.absmax, b.code, blocksize, torch.float32)
    return x.float() @ w.to(x.dtype).float().to(device).t()


# (m, n, k, blocksize, quant type, split_k: None = the plan's)
CASES = [
    (3, 48, 256, 64, "nf4", None),
    (17, 40, 384, 64, "fp4", 3),  # two M tiles, K split over programs
    (9, 33, 256, 128, "nf4", None),  # a partial N tile, 128-wide K steps
    (20, 64, 512, 32, "nf4", 2),  # 32-wide K steps
    (5, 64, 512, 256, "fp4", 1),
]


@pytest.mark.parametrize("m,n,k,blocksize,quant_type,split_k", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_gemm_matches_the_dequantized_product(m, n, k, blocksize, quant_type, split_k, dtype,
                                              device):
    if dtype == torch.bfloat16 and device.type == "cpu":
        pytest.skip("bf16 tl.dot is wrong in Triton's CPU interpreter (see test_w4a16_gemm)")
    q, a, t, b = _weight(n, k, blocksize, quant_type, device, seed=m + n)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(k)).to(dtype).to(device)
    got = bnb4_gemm(x, q, a, tuple(b.code.float().tolist()), blocksize, split_k=split_k)
    assert got.shape == (m, n) and got.dtype == dtype
    assert _rel(got, _want(x, b, blocksize, device)) < (1e-6 if dtype == torch.float32
                                                         else 1e-2)


def test_the_k_step_divides_the_blocksize_and_k():
    assert block_k(4096, 64) == 64 and block_k(4096, 256) == 128 and block_k(96, 32) == 32
    assert block_k(4096, 16) is None and not supported(16, 4096, 16)
    assert block_k(4112, 64) is None  # K not a multiple of the step
    bm, bn, bk, splits, per_split = plan(16, 4096, 4096, 64, torch.device("cpu"))
    assert (bm, bn, bk) == (16, 64, 64) and per_split % bk == 0 and splits * per_split >= 4096
    assert plan(64, 4096, 4096, 64, torch.device("cpu"))[:2] == (64, 64)
    assert plan(256, 4096, 4096, 64, torch.device("cpu"))[:2] == (128, 64)


def test_gemm_compiles_for_sm90_without_spills():
    """bf16, 16 x 64 tiles with 64-wide K steps (the plan at <= 16 rows), 4 warps, NF4's
    codes."""

    from octavo.quantization import bnb_format as fmt
    from tests.kernels.sm90 import compile_sm90

    codes = fmt.code_table("nf4", torch.device("cpu")).float().tolist()
    code = compile_sm90(
        "octavo.kernels.bnb4_gemm:_bnb4_gemm_kernel", "--const", "BS=64", "FP32_DOT=0",
        "BLOCK_M=16", "BLOCK_N=64", "BLOCK_K=64", *(f"C{i}={c!r}" for i, c in enumerate(codes)),
        "--ptr", "x_ptr=bf16", "q_ptr=u8",
        "a_ptr=fp32", "out_ptr=bf16", "part_ptr=fp32", "cnt_ptr=i32", "--div16",
        "K", "N", "K_PER_SPLIT", "stride_xm", "stride_qn", "stride_an", "--num-warps", "4")
    assert code.local_bytes == 0, code.report


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)])
@pytest.mark.parametrize("m", [9, 16, 64, 256])
def test_llama8b_shapes_on_the_gpu(n, k, m):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    dev = torch.device("cuda")
    q, a, t, b = _weight(n, k, 64, "nf4", dev, seed=m)
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    codes = tuple(b.code.float().tolist())
    assert _rel(bnb4_gemm(x, q, a, codes, 64), _want(x, b, 64, dev)) < 1e-2
