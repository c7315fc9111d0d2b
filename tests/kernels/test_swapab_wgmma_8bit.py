"""The CUDA large-batch kernel's 8-bit form (octavo/kernels/swapab_wgmma.py, session 64): its
dequantizations' exactness and its switch on the CPU; on the GPU the 4-bit file's checks at 8
bits (the one-hot read-back is there, parametrized by width), and the engine's routing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from octavo import envs
from octavo.kernels import swapab_wgmma
from octavo.kernels.w4a16_swapab import pack_swapab
from tests.kernels.swapab_wgmma_emulation import FORMS, dequant_ref, needs_gpu, weights


def test_the_8_bit_dequantizations_are_exact():
    """8-bit weights: 0x43800000 | q << 15 is the float 256 + q and fma(256 + q, s, -(256 + z)
    s) is (q - z) s (c exact in float32); packed_values' 8-bit pairs are kByteBias + q (fp16: PRMT's
    0x64qq = 1024 + q; bf16: (0x4300 | q & 127) - (0x4380 ^ q & 128) = q - 128, both operands
    and the difference exact); adding -(bias + z) is exact in the type, and the product with a
    scale of the type rounds once, to the float form's value rounded to the type: for every
    q < 256, z <= 256 and a spread of scales."""
    q = np.arange(256, dtype=np.uint32)
    assert np.array_equal(((q << 15) | 0x43800000).view(np.float32), 256.0 + q)
    # packed_values, fp16: PRMT selector 0x4240 takes byte 0 of each half under 0x64.
    word = q | (q[::-1] << 16)
    lo16 = ((word & 0xFF) | 0x6400).astype(np.uint16).view(np.float16).astype(np.float32)
    assert np.array_equal(lo16, 1024.0 + q)
    # packed_values, bf16: the two LOP3s and lo - y in bf16 (exact: every value an integer of at
    # most 8 significant bits).
    lo = ((q & 0x7F) | 0x4300).astype(np.uint32) << 16
    y = ((q & 0x80) ^ 0x4380).astype(np.uint32) << 16
    diff = torch.from_numpy(lo.view(np.float32) - y.view(np.float32)).to(torch.bfloat16)
    assert torch.equal(diff.float(), torch.from_numpy(q.astype(np.float32) - 128))
    g = torch.Generator().manual_seed(0)
    for dtype, bias in ((torch.bfloat16, -128.0), (torch.float16, 1024.0)):
        s = torch.cat([torch.rand(300, generator=g) * 0.05, torch.rand(100, generator=g) * 40])
        s = s.to(dtype)
        qs = torch.arange(256, dtype=torch.float32)[:, None, None]
        zs = torch.arange(257, dtype=torch.float32)[None, :, None]
        zb = (-(zs + bias)).to(dtype)
        assert torch.equal(zb.float(), -(zs + bias))  # the packed zero, exact
        packed = ((qs + bias).to(dtype) + zb) * s[None, None, :]  # as __hadd2 / __hmul2
        want = ((qs - zs) * s.float()[None, None, :]).to(dtype)
        assert torch.equal(packed, want), dtype
        c = (-(zs + 256) * s.float()[None, None, :])  # float32, exact
        assert torch.equal(c.double(), -(zs.double() + 256) * s.double()[None, None, :])
        fused = ((qs.double() + 256) * s.double()[None, None, :] + c.double()).float()
        assert torch.equal(fused.to(dtype), want)


def test_the_8_bit_switch_is_on_by_default(monkeypatch):
    monkeypatch.delenv("OCTAVO_INT_LARGE_CUDA_8BIT", raising=False)
    assert envs.int_large_cuda_8bit()
    monkeypatch.setenv("OCTAVO_INT_LARGE_CUDA_8BIT", "0")
    assert not envs.int_large_cuda_8bit()
    with pytest.raises(ValueError, match="swapab_wgmma cannot run 3-bit"):
        swapab_wgmma.swapab_wgmma(torch.zeros(2, 64, dtype=torch.bfloat16),
                                  torch.zeros(64, 64, dtype=torch.int16),
                                  torch.ones(1, 256, dtype=torch.bfloat16),
                                  torch.zeros(1, 256, dtype=torch.bfloat16), 64, 3)


@needs_gpu
@pytest.mark.gpu
@FORMS
@pytest.mark.parametrize("act", [torch.bfloat16, torch.float16])
def test_exact_on_integer_8_bit_data_gpu(bf16_math, deep, act):
    """Small activations, every byte value, zero point 128 and unit scales: every product and
    sum is exact in float32 (|sum| < 2^24), so the output is the exact result rounded once."""
    k, n, m = 1024, 4096, 256
    g = torch.Generator().manual_seed(2)
    q = torch.randint(0, 256, (k, n), generator=g)
    scales = torch.ones(k // 64, n, dtype=act)
    zeros = torch.full((k // 64, n), 128.0, dtype=act)
    x = torch.randint(-2, 3, (m, k), generator=g).to(act)
    got = swapab_wgmma.swapab_wgmma(x.cuda(), pack_swapab(q, 8).cuda(), scales.cuda(),
                                    zeros.cuda(), 64, 8, bf16_math=bf16_math, deep=deep)
    want = x.float() @ (q.float() - 128.0)
    assert torch.equal(got.float().cpu(), want.to(act).float())


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("scale_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("k,n", [(4096, 28672), (14336, 4096), (4096, 6144), (4096, 4096)])
@pytest.mark.parametrize("bf16_math", [False, True])
def test_llama_shapes_8_bit_gpu(k, n, scale_dtype, bf16_math):
    """Every batch size and K split (either split sum) on one 8-bit weight per shape, against
    x at the dequantized weight; the float and packed forms agree where the scales are the
    activations' type."""
    q, packed, scales, zeros = weights(k, n, 128, dtype=scale_dtype, device="cuda", bits=8)
    used = scales.to(torch.bfloat16) if bf16_math else scales
    w = dequant_ref(q, used, zeros, 128).float()
    errors = {}
    for m in (1, 65, 129, 200, 256, 300):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        want = x.float() @ w
        for split_k, split_sum in ((None, None), (1, None), (3, "cta"), (3, "launch")):
            got = swapab_wgmma.swapab_wgmma(x, packed, scales, zeros, 128, 8,
                                            split_k=split_k, bf16_math=bf16_math,
                                            split_sum=split_sum).float()
            errors[m, split_k, split_sum] = ((got - want).norm() / want.norm()).item()
        if scale_dtype == torch.bfloat16:  # the same weights into the same MMAs
            forms = [swapab_wgmma.swapab_wgmma(x, packed, scales, zeros, 128, 8, bf16_math=b)
                     for b in (False, True)]
            assert torch.equal(forms[0], forms[1]), m
    assert all(e < 5e-3 for e in errors.values()), errors


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("deep", [False, True])
def test_fp16_activations_8_bit_gpu(deep):
    """float16 models at 8 bits: float and half2 forms give the same bits, under graph
    replays too, close to x at the weight rounded to fp16."""
    from tests.quantization.gemm_checks import check_graph_replays

    k, n = 14336, 4096
    q, packed, scales, zeros = weights(k, n, 128, dtype=torch.float16, device="cuda", bits=8)
    w = dequant_ref(q, scales, zeros, 128, torch.float16).float()
    for m in (65, 256):
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        forms = [swapab_wgmma.swapab_wgmma(x, packed, scales, zeros, 128, 8, bf16_math=b,
                                           deep=deep) for b in (False, True)]
        assert torch.equal(forms[0], forms[1]), m
        want = x.float() @ w
        assert ((forms[0].float() - want).norm() / want.norm()) < 5e-3
    check_graph_replays(
        lambda x: swapab_wgmma.swapab_wgmma(x, packed, scales, zeros, 128, 8, split_k=4),
        lambda x: (x.float() @ w), x)


@needs_gpu
@pytest.mark.gpu
def test_8_bit_routing_waits_for_its_switch_gpu(monkeypatch):
    """OCTAVO_INT_LARGE_CUDA_8BIT (default on): 8-bit swap-AB batches of LARGE_MIN_M to
    LARGE_MAX_M rows take the kernel only where it is on (and ``worth`` says so), with the
    engine's output."""
    from octavo.kernels import int_weight_layout
    from tests.quantization.gemm_checks import record_rows

    q, packed, scales, zeros = weights(4096, 28672, 128, device="cuda", bits=8)
    w = dequant_ref(q, scales.to(torch.bfloat16), zeros, 128).float()
    calls = record_rows(monkeypatch, swapab_wgmma, "swapab_wgmma")
    for var in ("OCTAVO_INT_LARGE_MAX_M", "OCTAVO_INT_LARGE_MIN_M", "OCTAVO_INT_LARGE_CUDA"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OCTAVO_INT_LARGE_CUDA_8BIT", "0")
    x = torch.randn(200, 4096, device="cuda", dtype=torch.bfloat16)
    off = int_weight_layout.linear(x, packed, scales, zeros, 128, 8, int_weight_layout.SWAPAB)
    assert calls == []
    monkeypatch.delenv("OCTAVO_INT_LARGE_CUDA_8BIT")
    for m in (64, 65, 200, 300):
        xm = x if m == 200 else torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
        got = int_weight_layout.linear(xm, packed, scales, zeros, 128, 8,
                                       int_weight_layout.SWAPAB)
        want = xm.float() @ w
        assert ((got.float() - want).norm() / want.norm()) < 5e-3, m
    assert calls == [65, 200]
    assert ((off.float() - x.float() @ w).norm() / (x.float() @ w).norm()) < 5e-3
