"""The FP8 GEMV whose last program adds the residual and norms (``fp8_gemv_add_norm``: a
decoder layer's o_proj with its post-attention RMSNorm) against the two launches it replaces
(``fp8_gemv``, then ``fused_add_rms_norm``), bit for bit, and against float32; small shapes
through the Triton interpreter on the CPU."""

from __future__ import annotations

import types

import pytest
import torch

pytest.importorskip("triton")

from octavo.kernels.fp8_gemv import fp8_gemv, fp8_gemv_add_norm  # noqa: E402
from octavo.kernels.rms_norm import fused_add_rms_norm, fused_add_rms_norm_ref  # noqa: E402

FP8 = torch.float8_e4m3fn
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
CONVERSIONS = [True, pytest.param(False, marks=pytest.mark.gpu)]


def _case(m, n, k, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    weight = (torch.randn(n, k, generator=g) * 100).clamp(-448, 448).to(FP8)
    scale = torch.rand(n, generator=g) * 0.01 + 1e-4
    x = torch.randn(m, k, generator=g).to(dtype)
    residual = (torch.randn(m, n, generator=g) * 3).to(dtype)
    norm_weight = (torch.rand(n, generator=g) + 0.5).to(dtype)
    return [t.to(DEVICE) for t in (x, weight, scale, residual, norm_weight)]


@pytest.mark.parametrize("bits", CONVERSIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("n,k,tuning", [
    (64, 64, {"block_n": 8, "block_k": 32}),                    # 8 tiles, 2 K steps
    (40, 96, {"block_n": 16, "block_k": 32}),                   # a ragged last tile; N not 2^k
    (64, 128, {"block_n": 16, "block_k": 32, "split_k": 2}),    # split K: reduce, then norm
    (64, 256, {"block_n": 32, "block_k": 16, "split_k": 4, "stages": 3}),
])
def test_fused_is_the_gemv_then_the_norm(n, k, tuning, m, dtype, bits):
    """Normed sum and new residual are, bit for bit, those of the plain GEMV (same tile)
    followed by the add + RMSNorm kernel; the residual given is not modified."""
    if not bits and DEVICE.type != "cuda":
        pytest.skip("the hardware cvt is inline assembly: GPU only")
    x, weight, scale, residual, norm_weight = _case(m, n, k, dtype)
    before = residual.clone()
    tuning = dict(tuning, bits=bits)
    y = fp8_gemv(x, weight, scale, **tuning)
    want_x, want_res = fused_add_rms_norm(y, residual, norm_weight, 1e-6)
    got = fp8_gemv_add_norm(x, weight, scale, residual, norm_weight, 1e-6, **tuning)
    assert got is not None
    got_x, got_res = got
    assert torch.equal(got_res, want_res)
    assert torch.equal(got_x, want_x)
    assert torch.equal(residual, before)
    # And against float32: the projection rounded once, then the reference norm; a sum
    # that cancels keeps the rounding of its larger terms, so the bound is on their scale.
    ref_y = (x.float() @ (weight.float() * scale[:, None]).t()).to(dtype)
    ref_x, ref_res = fused_add_rms_norm_ref(ref_y, residual, norm_weight, 1e-6)
    scale_res = float(ref_y.abs().max() + residual.abs().max())
    torch.testing.assert_close(got_res, ref_res, rtol=0, atol=1e-2 * scale_res)
    torch.testing.assert_close(got_x, ref_x, rtol=0, atol=3e-2 * float(ref_x.abs().max()))


def test_counter_is_left_zeroed_for_the_next_launch():
    """Twice in a row with different inputs: the launch's ticket counter was reset by its
    last program, so the second call norms too (a stale counter would skip it)."""
    for seed in (1, 2):
        x, weight, scale, residual, norm_weight = _case(1, 64, 64, torch.bfloat16, seed)
        y = fp8_gemv(x, weight, scale, block_n=8, block_k=32, bits=True)
        want = fused_add_rms_norm(y, residual, norm_weight, 1e-5)
        got = fp8_gemv_add_norm(x, weight, scale, residual, norm_weight, 1e-5, block_n=8,
                                block_k=32, bits=True)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_refuses_what_it_cannot_hold():
    """None, nothing launched: a residual of another shape, dtype or layout; more rows than
    the GEMV takes."""
    x, weight, scale, residual, norm_weight = _case(1, 64, 64, torch.bfloat16)
    call = fp8_gemv_add_norm
    assert call(x, weight, scale, residual.float(), norm_weight, 1e-6, block_n=8) is None
    assert call(x, weight, scale, residual[:, :32], norm_weight, 1e-6, block_n=8) is None
    wide = torch.zeros(1, 128, dtype=residual.dtype, device=DEVICE)[:, ::2]
    assert call(x, weight, scale, wide, norm_weight, 1e-6, block_n=8) is None
    x3 = torch.cat([x, x, x])
    res3 = torch.cat([residual] * 3)
    assert call(x3, weight, scale, res3, norm_weight, 1e-6, block_n=8) is None


def _layer():
    return types.SimpleNamespace(fp8_gemv=True)


def test_linear_method_conditions(monkeypatch):
    """``fp8_linear.add_norm_gemv`` (the FP8 methods' apply_add_norm): under
    OCTAVO_FUSED_ADD_NORM (on by default), where the one-row GEMV runs (here forced: it
    applies on CUDA only) and not the CUDA float8 kernel; the kernel's result."""
    from octavo.quantization import fp8_linear

    x, weight, scale, residual, norm_weight = _case(1, 64, 64, torch.bfloat16)
    monkeypatch.setattr(fp8_linear, "gemv_applies", lambda layer, x2: True)
    monkeypatch.setattr(fp8_linear, "cuda_mma_takes", lambda *a: False)
    from octavo.kernels import fp8_gemv as kernel

    real = kernel.fp8_gemv_add_norm
    monkeypatch.setattr(kernel, "fp8_gemv_add_norm", lambda *a: real(*a, block_n=8, bits=True))

    def call():
        return fp8_linear.add_norm_gemv(_layer(), x, weight, scale, residual, norm_weight,
                                        1e-6)

    monkeypatch.setenv("OCTAVO_FUSED_ADD_NORM", "0")
    assert call() is None
    monkeypatch.delenv("OCTAVO_FUSED_ADD_NORM")
    monkeypatch.setattr(fp8_linear, "cuda_mma_takes", lambda *a: True)
    assert call() is None
    monkeypatch.setattr(fp8_linear, "cuda_mma_takes", lambda *a: False)
    got = call()
    y = fp8_gemv(x, weight, scale, block_n=8, bits=True)
    want = fused_add_rms_norm(y, residual, norm_weight, 1e-6)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_row_parallel_linear_refuses_bias_and_ranks():
    """``RowParallelLinear.forward_add_norm``: None with a bias (added after the
    projection) or under tensor parallelism (an all-reduce comes first); the unquantized
    method has no such kernel."""
    from octavo.layers.linear import RowParallelLinear
    from octavo.layers.norm import RMSNorm

    norm = RMSNorm(16)
    x = torch.randn(1, 8)
    res = torch.randn(1, 16)
    assert RowParallelLinear(8, 16, bias=False).forward_add_norm(x, res, norm) is None
    layer = RowParallelLinear(8, 16, bias=True)
    calls = []
    layer.quant_method.apply_add_norm = lambda *a: calls.append(a) or ("fused",)
    assert layer.forward_add_norm(x, res, norm) is None and not calls


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("m", [1, 2])
def test_real_shape_is_the_gemv_then_the_norm_gpu(m):
    """Llama-3.1-8B's o_proj (4,096 x 4,096, the plan's tile at the norm's 8 warps) and its
    post-attention norm: the same bits as the two launches, twice over (the counter
    reset)."""
    for seed in (0, 1):
        x, weight, scale, residual, norm_weight = _case(m, 4096, 4096, torch.bfloat16, seed)
        y = fp8_gemv(x, weight, scale)
        want = fused_add_rms_norm(y, residual, norm_weight, 1e-5)
        got = fp8_gemv_add_norm(x, weight, scale, residual, norm_weight, 1e-5)
        assert got is not None
        assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])
