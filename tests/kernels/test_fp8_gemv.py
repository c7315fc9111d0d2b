"""The FP8-weight GEMV (octavo/kernels/fp8_gemv.py) against its float32 reference: small shapes
through the Triton interpreter on the CPU, Llama-8B shapes on the GPU. Its two e4m3 -> float32
conversions against torch's for every code: the bit placement everywhere (the interpreter on
the CPU), the hardware cvt (inline assembly) on the GPU only."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from octavo.kernels.fp8_gemv import (  # noqa: E402
    _e4m3x4_bits,
    _e4m3x4_cvt,
    fp8_gemv,
    fp8_gemv_ref,
)
from octavo.kernels.triton_utils import tl, triton  # noqa: E402

FP8 = torch.float8_e4m3fn
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
# bit placement runs everywhere; the hardware cvt only compiled for a GPU
CONVERSIONS = [True, pytest.param(False, marks=pytest.mark.gpu)]


def _case(m, k, n, dtype, device=DEVICE, seed=0):
    g = torch.Generator().manual_seed(seed)
    weight = (torch.randn(n, k, generator=g) * 100).clamp(-448, 448).to(FP8)
    scale = torch.rand(n, generator=g) * 0.01 + 1e-4
    x = torch.randn(m, k, generator=g).to(dtype)
    return x.to(device), weight.to(device), scale.to(device)


def _rel_err(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp(min=1e-12)).item()


def _skip_cvt_off_gpu(bits):
    if not bits and DEVICE.type != "cuda":
        pytest.skip("the hardware cvt is inline assembly: GPU only")


@pytest.mark.parametrize("bits", CONVERSIONS)
@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("k,n,tuning", [
    (64, 40, {}),                                   # N not a multiple of the tile
    (100, 24, {"block_k": 32, "split_k": 2}),       # K tail masked, two splits
    (96, 16, {"block_k": 16, "block_n": 16, "split_k": 5}),
    (48, 8, {"block_k": 64, "split_k": 1}),          # one step, larger than K
    (160, 8, {"block_k": 16, "split_k": 1}),         # 10 steps: the unrolled loop's odd tail
    (160, 8, {"block_k": 16, "split_k": 1, "stages": 3}),  # two steps ahead
    (100, 24, {"block_k": 32, "split_k": 2, "stages": 3}),  # a split of 2 steps: 1 ahead
    (48, 8, {"block_k": 64, "split_k": 1, "stages": 3}),    # one step: nothing ahead
])
def test_matches_reference(m, k, n, tuning, bits):
    _skip_cvt_off_gpu(bits)
    x, weight, scale = _case(m, k, n, torch.float32)
    out = fp8_gemv(x, weight, scale, bits=bits, **tuning)
    assert out.shape == (m, n) and out.dtype == x.dtype
    assert _rel_err(out, fp8_gemv_ref(x, weight, scale)) < 1e-5


@triton.jit
def _convert_kernel(w_ptr, out_ptr, WORDS: tl.constexpr, BITS: tl.constexpr):
    offs = tl.arange(0, WORDS)
    w = tl.load(w_ptr + offs)
    if BITS:
        f = _e4m3x4_bits(w)
    else:
        f = _e4m3x4_cvt(w)
    for i in tl.static_range(4):
        tl.store(out_ptr + offs * 4 + i, f[i])


def _bits_torch(words: torch.Tensor) -> torch.Tensor:
    """_e4m3x4_bits's integer ops on an int32 tensor, bytes in memory order."""
    planes = [(((words << s) >> 4) & -0x78100000).view(torch.float32) for s in (24, 16, 8, 0)]
    return torch.stack(planes, dim=-1).reshape(-1)


@pytest.mark.parametrize("bits", CONVERSIONS)
def test_conversion_exact_for_every_code(bits):
    """Every e4m3 code but the two NaNs (zeros, subnormals down to 2**-9, +-448) converts
    bit for bit to torch's float32 value (times 2**-120 by bit placement)."""
    _skip_cvt_off_gpu(bits)
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    words = codes.view(torch.int32)  # byte i of word j: code 4j + i
    expect = codes.view(FP8).to(torch.float32) * (2.0**-120 if bits else 1.0)
    got = torch.empty(256, dtype=torch.float32, device=DEVICE)
    _convert_kernel[(1,)](words.to(DEVICE), got, WORDS=64, BITS=bits)
    got = got.cpu()
    if bits:
        assert torch.equal(_bits_torch(words).view(torch.int32), got.view(torch.int32))
    finite = (codes & 0x7F) != 0x7F
    assert torch.equal(got[finite].view(torch.int32), expect[finite].view(torch.int32))
    assert got[0x80].view(torch.int32) == -2**31  # negative zero keeps its sign
    assert expect[0x01] > 0 and got[0x01] > 0  # the smallest subnormal is not flushed
    if bits:  # the NaN codes (absent from checkpoint weights) become finite: +-480 * 2**-120
        assert got[0x7F] == 480 * 2.0**-120 and got[0xFF] == -480 * 2.0**-120


@pytest.mark.parametrize("bits", CONVERSIONS)
@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("k,n,tuning", [
    (64, 40, {}),
    (100, 24, {"block_k": 32, "split_k": 2}),       # K tail: the int64 words masked too
    (160, 8, {"block_k": 16, "split_k": 1}),
])
def test_bf16_activations_each_way_of_reading_them(m, k, n, tuning, bits):
    """bf16 x read as a split tile (0), four strided planes (1) or int64 words split by bit
    placement (2): the same float32 products summed in the same order, so the same bits, and
    the reference's result up to the final rounding to bf16 (the interpreter truncates)."""
    _skip_cvt_off_gpu(bits)
    x, weight, scale = _case(m, k, n, torch.bfloat16)
    outs = [fp8_gemv(x, weight, scale, bits=bits, x_load=v, **tuning) for v in (0, 1, 2)]
    assert all(o.dtype == torch.bfloat16 for o in outs)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    exact = fp8_gemv_ref(x.float(), weight, scale)  # float32, unrounded
    assert _rel_err(outs[2], exact) < 2.0**-7


@pytest.mark.parametrize("offset", [0, 1, 3])
def test_word_reads_fall_back_where_x_is_not_word_aligned(offset):
    """x_load=2 views x as int64: a row that does not start on 8 bytes (a slice of a wider
    tensor) is read by the strided planes instead, with the same result."""
    k, n = 64, 16
    _, weight, scale = _case(2, k, n, torch.bfloat16)
    wide = torch.randn(2, k + 8, generator=torch.Generator().manual_seed(1))
    x = wide.to(torch.bfloat16).to(DEVICE)[:, offset:offset + k]
    out = fp8_gemv(x, weight, scale, x_load=2)
    ref = fp8_gemv(x.contiguous(), weight, scale, x_load=1)
    assert torch.equal(out, ref)


@pytest.mark.parametrize("bits", CONVERSIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_extremes(bits, dtype):
    """The scale factors of bit placement (x * 2**64, the row scale * 2**56) keep every
    product in float32's normal range: |x| up to 1e4 against +-448, x of 1e-3 against the
    smallest subnormal weights, zeros and negative zeros."""
    _skip_cvt_off_gpu(bits)
    k, n = 64, 8
    codes = torch.tensor([0x7E, 0xFE, 0x01, 0x81, 0x00, 0x80, 0x07, 0x87], dtype=torch.uint8)
    weight = codes.repeat(n * k // 8).reshape(n, k).view(FP8)  # 448, -448, +-2**-9, +-0, ...
    weight[1::2] = weight[1::2].roll(3, dims=1)
    scale = torch.tensor([1.0, 1e-4, 3e3, 1.0, 0.5, 2.0, 1e-2, 7.0])
    if dtype == torch.float16:  # outputs within float16's range (up to 3e4)
        scale /= 1000
    x = torch.full((2, k), 1e-3)
    x[0, ::3] = 1e4
    x[0, 1::5] = -1e4
    x[1, 5::7] = 0.0
    x[1, 6::7] = -0.0
    x, weight, scale = x.to(dtype).to(DEVICE), weight.to(DEVICE), scale.to(DEVICE)
    w64 = weight.cpu().to(torch.float64) * scale.cpu().to(torch.float64)[:, None]
    for m in (1, 2):
        out = fp8_gemv(x[:m], weight, scale, bits=bits, block_k=32).cpu().double()
        exact = x[:m].cpu().double() @ w64.t()
        # float32 sums of 64 terms: within 64 * 2**-24 of the sum of |terms| (a
        # cancellation-proof bound), float16 out: plus one rounding
        bound = 64 * 2.0**-24 * (x[:m].cpu().double().abs() @ w64.abs().t())
        if dtype == torch.float16:
            bound += exact.abs() * 2.0**-11
        assert ((out - exact).abs() <= bound).all()
    tiny = torch.full((1, k), 1e-3, dtype=dtype, device=DEVICE)
    sub = torch.full((n, k), 0x01, dtype=torch.uint8).view(FP8).to(DEVICE)  # 2**-9 each
    out = fp8_gemv(tiny, sub, torch.ones(n, device=DEVICE), bits=bits)
    assert torch.allclose(out.float(), fp8_gemv_ref(tiny, sub, torch.ones(n, device=DEVICE))
                          .float(), rtol=1e-6 if dtype == torch.float32 else 1e-3, atol=0)
    zero = torch.full((n, k), 0x80, dtype=torch.uint8).view(FP8).to(DEVICE)  # -0 everywhere
    assert not fp8_gemv(x[:1], zero, scale, bits=bits).any()


def test_split_k_is_deterministic_and_leaves_counters_zeroed():
    from octavo.kernels import split_k

    x, weight, scale = _case(2, 128, 32, torch.float32)
    first = fp8_gemv(x, weight, scale, block_k=16, split_k=4)
    assert torch.equal(first, fp8_gemv(x, weight, scale, block_k=16, split_k=4))
    assert not split_k.counters(DEVICE, 1).any()


def test_scale_must_be_one_per_row():
    x, weight, scale = _case(1, 32, 8, torch.float32)
    with pytest.raises(AssertionError):
        fp8_gemv(x, weight, scale[:4])


@pytest.mark.gpu
@pytest.mark.parametrize("bits", [False, True])
@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("k,n", [(4096, 6144), (14336, 4096), (4096, 28672)])
def test_real_shapes_gpu(m, k, n, bits):
    x, weight, scale = _case(m, k, n, torch.bfloat16, device=torch.device("cuda"))
    out = fp8_gemv(x, weight, scale, bits=bits)
    assert _rel_err(out, fp8_gemv_ref(x, weight, scale)) < 1e-2


@pytest.mark.parametrize("bits", CONVERSIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("k,inter,tuning", [
    (64, 20, {}),                                   # I not a multiple of the half tile
    (100, 12, {"block_k": 32, "split_k": 2}),       # two splits: the last program's store
    (96, 24, {"block_k": 16, "block_n": 16, "split_k": 5}),
    (48, 4, {"block_k": 64, "split_k": 1}),
])
def test_glu_is_the_unfused_projection_then_silu_and_mul(m, k, inter, tuning, dtype, bits):
    """glu=True on an MLP's [gate | up] weight gives, bit for bit, the plain GEMV's output
    followed by the activation's own kernel (both rounded as stored, the same formula), with
    or without split-K; the gate and up halves carry different row scales."""
    from octavo.kernels.activation import silu_and_mul

    _skip_cvt_off_gpu(bits)
    x, weight, scale = _case(m, k, 2 * inter, dtype)
    fused = fp8_gemv(x, weight, scale, bits=bits, glu=True, **tuning)
    assert fused.shape == (m, inter) and fused.dtype == dtype
    plain = fp8_gemv(x, weight, scale, bits=bits, **tuning)
    assert torch.equal(fused, silu_and_mul(plain))
    # and against the float32 reference (not the same rounding)
    ref = fp8_gemv_ref(x.float(), weight, scale)
    expect = torch.nn.functional.silu(ref[:, :inter]) * ref[:, inter:]
    assert _rel_err(fused, expect) < (1e-5 if dtype == torch.float32 else 2.0**-6)


def test_glu_split_counters_back_at_zero():
    """A split GLU call leaves the split-K counters zeroed (the next call's tickets)."""
    from octavo.kernels.split_k import counters

    x, weight, scale = _case(1, 128, 32, torch.float32)
    a = fp8_gemv(x, weight, scale, block_k=16, block_n=16, split_k=4, glu=True)
    assert int(counters(x.device, 1).abs().sum()) == 0
    b = fp8_gemv(x, weight, scale, block_k=16, block_n=16, split_k=4, glu=True)
    assert torch.equal(a, b)

