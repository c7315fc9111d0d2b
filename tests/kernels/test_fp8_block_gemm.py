"""Block-scaled FP8 weights (e4m3 with a float32 scale per block of rows x columns): the FP8
GEMV's block mode (``fp8_block_gemm.fp8_block_gemv``, U8 = 3) and the block GEMM
(``fp8_block_gemm``, fused_moe's down launch with one expert) against the float32 reference
over the dequantized weight: small shapes in Triton's CPU interpreter (or the GPU where
there is one), an sm_90 compile of the GEMV's block mode, Llama-3.1-8B's shapes on the
GPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from octavo.kernels.fp8_block_gemm import (  # noqa: E402
    block_supported,
    fp8_block_gemm,
    fp8_block_gemm_reference,
    fp8_block_gemv,
)

FP8 = torch.float8_e4m3fn


def _case(m, n, k, block, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) * 100).clamp(-448, 448).to(FP8)
    s = torch.rand(-(-n // block[0]), -(-k // block[1]), generator=g) / (200 * k ** 0.5) + 1e-6
    x = torch.randn(m, k, generator=g).to(dtype)
    return x.to(device), w.to(device), s.to(device)


def _rel(got, want):
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


# (n, k, block): partial row and column blocks; 128 x 128 as Qwen3-FP8 ships
SHAPES = [(96, 256, (32, 64)), (70, 200, (16, 64)), (128, 384, (128, 128))]


@pytest.mark.parametrize("n,k,block", SHAPES)
@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("glu", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemv_block_mode(n, k, block, m, glu, dtype, device):
    x, w, s = _case(m, n, k, block, dtype, device, seed=n + m)
    want = fp8_block_gemm_reference(x.float(), w, s, block)
    if glu:
        want = F.silu(want[:, :n // 2]) * want[:, n // 2:]
    got = fp8_block_gemv(x, w, s, block, glu=glu)
    assert got.shape == want.shape and got.dtype == dtype
    assert _rel(got, want) < (1e-6 if dtype == torch.float32 else 2e-2)


@pytest.mark.parametrize("n,k,block", SHAPES)
@pytest.mark.parametrize("m", [3, 40])  # decode tiles of 16 rows; 64-row tiles
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemm(n, k, block, m, dtype, device):
    x, w, s = _case(m, n, k, block, dtype, device, seed=n * m)
    got = fp8_block_gemm(x, w, s, block)
    want = fp8_block_gemm_reference(x, w, s, block)
    assert got.shape == (m, n) and got.dtype == dtype
    assert _rel(got, want) < (1e-6 if dtype == torch.float32 else 1e-2)


def test_supported_and_errors(device):
    assert block_supported(2, 256, (128, 128)) and not block_supported(3, 256, (128, 128))
    assert not block_supported(1, 256, (128, 48))  # K steps of 32 cannot fit 48 columns
    x, w, s = _case(3, 64, 128, (32, 32), torch.float32, device)
    with pytest.raises(ValueError, match=r"weight \(64, 128\) torch.float32 is not"):
        fp8_block_gemm(x, w.float(), s, (32, 32))
    with pytest.raises(ValueError, match=r"scale is \(2, 3\) .*not float32 \(2, 4\) \(one per"):
        fp8_block_gemm(x, w, s[:, :3].contiguous(), (32, 32))
    assert fp8_block_gemm(x[:0], w, s, (32, 32)).shape == (0, 64)


def test_gemv_block_mode_compiles_for_sm90():
    """The block mode with 128 x 128 scales, 128-wide K steps over 4 warps, compiles for
    sm_90 without spills."""

    from tests.kernels.sm90 import compile_sm90

    code = compile_sm90(
        "octavo.kernels.fp8_gemv:_fp8_gemv_kernel", "--const", "BLOCK_M=1", "BLOCK_N=32",
        "BLOCK_K=128", "BITS=0", "X_LOAD=2", "GLU=0", "ROPE=0", "HEAD_DIM=2", "STAGES=2",
        "PDL=1", "TILED=0", "U8=3", "GROUP=128", "HAS_Z=0", "ASM=1", "ROW_BLOCK=128",
        "--ptr", "x_ptr=i64", "w_ptr=i32", "s_ptr=fp32", "out_ptr=bf16", "part_ptr=fp32",
        "cnt_ptr=i32", "z_ptr=fp32", "--div16", "K", "N", "K_PER_SPLIT", "stride_xm",
        "stride_wn", "stride_sn", "--ones", "stride_sg", "--f32", "zero", "--num-warps", "4")
    assert code.local_bytes == 0, code.report


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)])
@pytest.mark.parametrize("m", [1, 2, 16, 200])
def test_llama_8b_shapes_on_the_gpu(n, k, m):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("needs CUDA with e4m3 (compute capability 8.9)")
    x, w, s = _case(m, n, k, (128, 128), torch.bfloat16, "cuda")
    got = fp8_block_gemv(x, w, s, (128, 128)) if m <= 2 else fp8_block_gemm(x, w, s, (128, 128))
    assert _rel(got, fp8_block_gemm_reference(x, w, s, (128, 128))) < 1e-2


@pytest.mark.parametrize("n,k,block", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dequantize_rounds_each_weight_once(n, k, block, dtype, device):
    from octavo.kernels.fp8_block_gemm import dequantize
    from octavo.kernels.fused_moe import dequantize_fp8_weight

    _, w, s = _case(1, n, k, block, dtype, device)
    got = dequantize(w, s, block, dtype)
    want = dequantize_fp8_weight(w, s, block)
    assert got.dtype == dtype
    if dtype == torch.bfloat16 and str(device) == "cpu":
        # Triton's interpreter truncates float32 to bfloat16 (the GPU rounds to nearest)
        assert ((got.float() - want).abs() <= want.abs() * 2.0 ** -7).all()
    else:
        assert torch.equal(got, want.to(dtype))
