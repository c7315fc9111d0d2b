"""The large-batch GEMM on the swap-AB layout (octavo/kernels/w4a16_swapab_wide.py) against the
dequantize-then-matmul reference: small shapes through the interpreter on the CPU (fp16 and
float32: the interpreter's bf16 dot is not the GPU's), real shapes and the engine's dispatch on
the GPU."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from octavo import envs  # noqa: E402
from octavo.kernels import int_weight_layout  # noqa: E402
from octavo.kernels.w4a16_gemm import pack_along_k, w4a16_gemm_ref  # noqa: E402
from octavo.kernels.w4a16_swapab import pack_swapab  # noqa: E402
from octavo.kernels.w4a16_swapab_wide import tiles, uses_h16, w4a16_swapab_wide  # noqa: E402
from tests.quantization.gemm_checks import check_graph_replays, rel_err  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _weights(k, n, group, bits, device=DEVICE, dtype=torch.float16, seed=0):
    """(packed swap-AB weight, along-K weight for the reference, scales, zeros)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 2**bits, (k, n), generator=g)
    scales = (torch.rand(k // group, n, generator=g) * 0.02 + 0.001).to(dtype)
    # Up to 2**bits: GPTQ's "zeros minus one" convention can store 16 for a 4-bit weight.
    zeros = torch.randint(0, 2**bits + 1, (k // group, n), generator=g).to(dtype)
    return (pack_swapab(q, bits).to(device), pack_along_k(q, bits).to(device),
            scales.to(device), zeros.to(device))


@pytest.mark.parametrize("m,k,n,group,bits,tuning", [
    (1, 64, 256, 32, 4, {}),
    (5, 128, 512, 64, 4, {"split_k": 2}),  # two 64-row blocks, K split in two
    (70, 128, 256, 64, 4, {"block_m": 64, "block_k": 32}),  # two batch tiles, the last masked
    (3, 64, 128, 32, 8, {}),  # 8-bit: two values per int16
    (33, 128, 256, 128, 8, {"split_k": 3, "block_k": 32}),  # a split of 2 steps and one of 1
    (17, 256, 256, 32, 4, {"block_k": 16}),  # K steps shorter than the group
])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_matches_reference(m, k, n, group, bits, tuning, dtype):
    packed, qweight, scales, zeros = _weights(k, n, group, bits, dtype=dtype)
    x = torch.randn(m, k, device=DEVICE).to(dtype)
    out = w4a16_swapab_wide(x, packed, scales, zeros, group, bits, **tuning)
    ref = w4a16_gemm_ref(x.float(), qweight, scales.float(), zeros.float(), group, bits)
    assert out.shape == (m, n) and out.dtype == dtype
    assert rel_err(out, ref) < (1e-5 if dtype == torch.float32 else 5e-3)


def test_tiles_and_h16_rule():
    assert tiles(65) == (128, 8) and tiles(64) == (64, 4)
    bf, f16 = torch.empty(1, dtype=torch.bfloat16), torch.empty(1, dtype=torch.float16)
    assert uses_h16(torch.bfloat16, bf, 4)
    assert not uses_h16(torch.bfloat16, f16, 4)  # fp16 scales would round to bf16 first
    assert not uses_h16(torch.bfloat16, bf, 8)  # 0x4300 | q holds 7 bits
    assert not uses_h16(torch.float16, f16, 4)


def test_rows_knob(monkeypatch):
    monkeypatch.delenv("OCTAVO_INT_WIDE_MIN_M", raising=False)
    monkeypatch.delenv("OCTAVO_INT_WIDE_MAX_M", raising=False)
    assert envs.int_wide_rows((129, 1024)) == (129, 1024)
    monkeypatch.setenv("OCTAVO_INT_WIDE_MIN_M", "65")
    monkeypatch.setenv("OCTAVO_INT_WIDE_MAX_M", "0")
    assert envs.int_wide_rows((129, 1024)) == (65, 0)
    monkeypatch.setenv("OCTAVO_INT_WIDE_MIN_M", "x")
    with pytest.raises(ValueError, match="OCTAVO_INT_WIDE_MIN_M.*'x'"):
        envs.int_wide_rows((129, 1024))


@pytest.mark.gpu
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("m", [65, 129, 256, 1000])
@pytest.mark.parametrize("k,n", [(4096, 28672), (14336, 4096)])
def test_real_shapes_gpu(m, bits, k, n):
    packed, qweight, scales, zeros = _weights(k, n, 128, bits, device=torch.device("cuda"),
                                              dtype=torch.bfloat16)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    out = w4a16_swapab_wide(x, packed, scales, zeros, 128, bits)
    assert rel_err(out, w4a16_gemm_ref(x, qweight, scales, zeros, 128, bits)) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_pairs_equal_float32_dequantization_gpu(dtype):
    """With scales of the activations' type the pair arithmetic gives the float32 path's
    weights exactly, hence the same outputs bit for bit (fp16 runs float32 either way)."""
    packed, _, scales, zeros = _weights(4096, 1024, 128, 4, device=torch.device("cuda"),
                                        dtype=dtype)
    x = torch.randn(200, 4096, device="cuda", dtype=dtype)
    pairs = w4a16_swapab_wide(x, packed, scales, zeros, 128, 4, h16=dtype == torch.bfloat16)
    assert torch.equal(pairs, w4a16_swapab_wide(x, packed, scales, zeros, 128, 4, h16=False))


@pytest.mark.gpu
def test_engine_dispatch_and_graph_replays_gpu(monkeypatch):
    """The swap-AB layout's batches in the wide range take this kernel (split-K counters
    come back to zero replay after replay)."""
    packed, qweight, scales, zeros = _weights(14336, 1024, 128, 4, device=torch.device("cuda"),
                                              dtype=torch.bfloat16)
    x = torch.randn(160, 14336, device="cuda", dtype=torch.bfloat16)
    lo, hi = int_weight_layout.WIDE_ROWS
    assert lo <= 160 <= hi
    out = int_weight_layout.linear(x, packed, scales, zeros, 128, 4, int_weight_layout.SWAPAB)
    assert torch.equal(out, w4a16_swapab_wide(x, packed, scales, zeros, 128, 4))
    check_graph_replays(lambda x: int_weight_layout.linear(
        x, packed, scales, zeros, 128, 4, int_weight_layout.SWAPAB),
        lambda x: w4a16_gemm_ref(x, qweight, scales, zeros, 128, 4), x)
    monkeypatch.setenv("OCTAVO_INT_WIDE_MIN_M", "100000")  # off: dequantize-then-cuBLAS
    off = int_weight_layout.linear(x, packed, scales, zeros, 128, 4, int_weight_layout.SWAPAB)
    on = w4a16_swapab_wide(x, packed, scales, zeros, 128, 4)  # x as the replays left it
    assert not torch.equal(off, on) and rel_err(off, on) < 1e-2
