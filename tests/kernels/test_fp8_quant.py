"""The one-launch FP8 activation quantizer (octavo/kernels/fp8_quant.py) against the torch
expressions it replaces: equal bit for bit (fp8 bytes and float32 scales)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from octavo.kernels.fp8_quant import fp8_quant, fp8_quant_ref  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
# Triton's interpreter rounds float32 to fp8 wrongly (124.3 -> 64): on the CPU the kernel
# stores its float32 quotients and torch rounds them; on the GPU the kernel's own fp8 output.
OUT = {} if DEVICE.type == "cuda" else {"out_dtype": torch.float32}


def quant(*args, **kw):
    q, s = fp8_quant(*args, **kw, **OUT)
    return q.to(torch.float8_e4m3fn), s


def _x(m, k, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.logspace(-3, 3, m).reshape(m, 1)
    return x.to(dtype).to(DEVICE)


def _same(got, want):
    assert torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8))
    assert torch.equal(got[1], want[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m,k,block", [(1, 64, None), (5, 100, None), (3, 300, 128),
                                       (4, 33, 16)])
@pytest.mark.parametrize("small", ["clamp", "replace"])
def test_dynamic_per_token_equals_torch(dtype, m, k, block, small):
    x = _x(m, k, dtype)
    _same(quant(x, None, 1e-12, small, block=block), fp8_quant_ref(x, None, 1e-12, small))


def test_rows_of_zeros_and_saturation():
    x = torch.zeros(3, 40, device=DEVICE)
    x[1, 5] = 1e30  # one huge value: its row's scale is huge, the rest round to zero
    x[2] = torch.linspace(-2, 2, 40)
    for small, min_scale in (("clamp", 1e-12), ("replace", torch.finfo(torch.float32).eps)):
        got = quant(x, None, min_scale, small, block=16)
        _same(got, fp8_quant_ref(x, None, min_scale, small))
        assert got[1][0, 0].item() == pytest.approx(min_scale)


def test_static_scale_clamps_to_the_fp8_range():
    x = _x(6, 70, torch.bfloat16)
    scale = torch.tensor([0.01], device=DEVICE)  # small: many values saturate at +-448
    got = quant(x, scale, 1e-12, block=32)
    _same(got, fp8_quant_ref(x, scale, 1e-12))
    assert got[0].float().abs().max().item() == 448.0


def test_empty_batch():
    q, s = quant(torch.empty(0, 16, device=DEVICE), None, 1e-12)
    assert q.shape == (0, 16) and s.shape == (0, 1)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [3, 256])
@pytest.mark.parametrize("k", [4096, 14336])
def test_real_shapes_gpu(m, k):
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) * 3
    _same(fp8_quant(x, None, 1e-12), fp8_quant_ref(x, None, 1e-12))
