"""bitsandbytes 4-bit weights without a dequantized copy (``octavo/kernels/bnb4_gemv.py``): the
decode GEMV and the one-launch dequantization against ``bnb_weight.dequantize_packed`` (the
torch path, bitsandbytes' values), NF4 and FP4, blocks of 32-128, one and two rows, bf16 /
fp16 / float32 activations, partial tiles and K split over programs, in Triton's CPU
interpreter (or the GPU where there is one); an sm_90 compile without spills; Llama-3.1-8B's
shapes on the GPU."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from octavo.kernels.bnb4_gemv import bnb4_gemv, dequantize_4bit, supported  # noqa: E402
from octavo.quantization import bnb_format as fmt  # noqa: E402
from octavo.quantization.bnb_weight import (  # noqa: E402
    blocks_or_dense,
    byte_table,
    dequantize_packed,
)


def _weight(n, k, blocksize, quant_type, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    packed, absmax = fmt.quantize_4bit(w, quant_type, blocksize)
    b = blocks_or_dense(packed, absmax, fmt.code_table(quant_type, w.device), blocksize, n, k)
    return (b.packed.contiguous().to(device), b.absmax.contiguous().to(device),
            byte_table(b.code).to(device), b)


def _rel(got, want):
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


# (n, k, blocksize, quant type, tiles = (block_n, block_k, warps, waves) or the plan)
CASES = [
    (48, 256, 64, "nf4", None),
    (40, 384, 64, "fp4", (16, 128, 4, 4)),  # K split over programs
    (33, 640, 128, "nf4", (8, 128, 4, 4)),  # a partial row tile
    (64, 512, 32, "nf4", (16, 64, 4, 1)),
]


@pytest.mark.parametrize("n,k,blocksize,quant_type,tiles", CASES)
@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("entries", [16, 256])
def test_gemv_matches_the_dequantized_product(n, k, blocksize, quant_type, tiles, m, dtype,
                                              entries, device):
    q, a, t, b = _weight(n, k, blocksize, quant_type, device, seed=n + m)
    if entries == 16:  # the 16 codes themselves: a gather per nibble
        t = b.code.float().contiguous().to(device)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(k)).to(dtype).to(device)
    got = bnb4_gemv(x, q, a, t, blocksize, tiles)
    want = x.float() @ dequantize_packed(b.packed, b.absmax, b.code, blocksize,
                                         torch.float32).to(device).t()
    assert got.shape == (m, n) and got.dtype == dtype
    assert _rel(got, want) < (1e-6 if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("n,k,blocksize,quant_type,tiles", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dequantize_gives_the_torch_values(n, k, blocksize, quant_type, tiles, dtype, device):
    q, a, t, b = _weight(n, k, blocksize, quant_type, device)
    got = dequantize_4bit(q, a, t, blocksize, dtype)
    want = dequantize_packed(q, a, None, blocksize, torch.float32, table=t)
    assert got.dtype == dtype
    if dtype == torch.bfloat16 and str(device) == "cpu":
        # Triton's interpreter truncates float32 to bfloat16 (the GPU rounds to nearest)
        assert ((got.float() - want).abs() <= want.abs() * 2.0 ** -7).all()
    else:
        assert torch.equal(got, want.to(dtype))


def test_supported():
    assert supported(1, 4096, 64) and supported(2, 4096, 64)
    assert not supported(3, 4096, 64)  # decode rows only
    assert not supported(1, 4100, 64)  # K whole blocks
    assert not supported(1, 96, 12)  # a word's 8 weights in one block


@pytest.mark.parametrize("entries", [16, 256])
def test_gemv_compiles_for_sm90_without_spills(entries):
    """Two rows, bf16 pairs, the default plan (32 x 256 over 4 warps), either table."""

    from tests.kernels.sm90 import compile_sm90

    code = compile_sm90(
        "octavo.kernels.bnb4_gemv:_bnb4_gemv_kernel", "--const", "BLOCK_M=2", "BLOCK_N=32",
        "BLOCK_K=256", "BS=64", "X_PAIRS=1", "PDL=1", f"TABLE={entries}", "--ptr",
        "x_ptr=i32", "q_ptr=i32", "a_ptr=fp32", f"t_ptr={'fp32' if entries == 16 else 'i64'}",
        "out_ptr=bf16", "part_ptr=fp32", "cnt_ptr=i32", "--div16", "K", "N", "K_PER_SPLIT",
        "stride_xm", "stride_qn", "stride_an", "--num-warps", "4")
    assert code.local_bytes == 0, code.report


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)])
@pytest.mark.parametrize("m", [1, 2])
def test_llama_8b_shapes_on_the_gpu(n, k, m):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    q, a, t, b = _weight(n, k, 64, "nf4", "cuda")
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = dequantize_4bit(q, a, t, 64, torch.float32)
    assert torch.equal(w, dequantize_packed(q, a, None, 64, torch.float32, table=t))
    assert _rel(bnb4_gemv(x, q, a, t, 64), x.float() @ w.t()) < 1e-2
    assert _rel(bnb4_gemv(x, q, a, b.code.float().cuda(), 64), x.float() @ w.t()) < 1e-2
