"""Quantized CPU linear kernels (quant_gemm.cpp) against dequantize-then-matmul in torch: every
GGUF block format with a kernel layout, odd shapes, each instruction set built on this CPU."""

from __future__ import annotations

import pytest
import torch

from octavo.kernels import cpu as cpu_kernels
from octavo.quantization import gguf_blocks
from octavo.quantization.gguf import ISA_CODES
from tests.quantization.test_gguf_blocks import random_rows

ops = cpu_kernels.load()
pytestmark = pytest.mark.skipif(ops is None or not hasattr(ops, "gguf_linear"),
                                reason="CPU kernels not built")
ISA_NAMES = {v: k for k, v in ISA_CODES.items()}
ISAS = ops.quant_isas() if ops is not None else []


def weights(name: str, n: int, k: int, seed: int = 0, interleaved: bool = False):
    raw = torch.from_numpy(random_rows(name, n, k, seed))
    out = gguf_blocks.repack(raw, name, k, interleaved)
    assert (out[0].dim() == 3) == (interleaved and gguf_blocks.can_interleave(n, k))
    return out


def quantized_acts(x: torch.Tensor) -> torch.Tensor:
    """x after the kernels' int16 rounding per 32-block (amax / 32639 scales, ties to even)."""
    xb = x.double().view(x.shape[0], -1, 32)
    d = xb.abs().amax(-1, keepdim=True) / 32639
    q = torch.where(d > 0, torch.round(xb / torch.where(d > 0, d, 1)), 0)
    return (q * d).view(x.shape)


def reference(x: torch.Tensor, qweight, scales, mins, k: int) -> torch.Tensor:
    """The kernels' arithmetic in float64: the d * u part of the weight times the rounded
    activations, plus the m part times the exact ones."""
    qweight, scales, mins = gguf_blocks.deinterleave(qweight, scales, mins, k)  # mins explicit
    du = gguf_blocks.dequantize(qweight, scales, torch.zeros_like(mins), k).double()
    m = gguf_blocks.dequantize(torch.zeros_like(qweight), torch.zeros_like(scales), mins,
                               k).double()
    return quantized_acts(x) @ du.T + x.double() @ m.T


def k_values(name: str) -> list[int]:
    per_block = gguf_blocks.FORMATS[name][1]
    return [256, 768] if per_block == 256 else [32, 96, 160, 576]


CASES = [(name, k) for name in sorted(gguf_blocks.FORMATS) for k in k_values(name)]


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: ISA_NAMES[i])
@pytest.mark.parametrize("name,k", CASES)
@pytest.mark.parametrize("m", [1, 3, 17, 64])
@pytest.mark.parametrize("n,interleaved", [(37, False), (48, True)], ids=["rows", "interleaved"])
def test_gguf_linear_matches_reference(isa, name, k, m, n, interleaved):
    qweight, scales, mins = weights(name, n, k, seed=k + m, interleaved=interleaved)
    w = gguf_blocks.dequantize(qweight, scales, mins, k).double()
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    y = ops.gguf_linear(x, qweight, scales, mins, k, isa)
    assert y.shape == (m, n) and y.dtype == torch.float32
    # Exact up to float summation order against the same int16 activations ...
    ref = reference(x, qweight, scales, mins, k)
    scale = (x.double().abs() @ w.abs().T).clamp_min(1e-6)
    assert ((y.double() - ref).abs() / scale).max() < 1e-5
    # ... and close to the float product (int16 activations: ~1/65534 of each block's max).
    exact = x.double() @ w.T
    assert ((y.double() - exact).abs() / scale).max() < 1e-4


@pytest.mark.parametrize("name,k", [("Q4_1", 96), ("Q8_0", 160), ("Q6_K", 256), ("Q5_K", 512),
                                    ("Q4_1", 128)])
@pytest.mark.parametrize("m", [1, 8, 17, 64])
@pytest.mark.parametrize("interleaved", [False, True])
def test_dense_path_matches_float_product(name, k, m, interleaved):
    """gguf_linear_dense (64 weight rows dequantized at a time, then BLAS): float32-exact."""
    n = 160  # three chunks, the last one partial
    qweight, scales, mins = weights(name, n, k, seed=m, interleaved=interleaved)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    w = gguf_blocks.dequantize(qweight, scales, mins, k).double()
    y = ops.gguf_linear_dense(x, qweight, scales, mins, k)
    assert y.shape == (m, n) and y.dtype == torch.float32
    scale = (x.double().abs() @ w.abs().T).clamp_min(1e-6)
    assert ((y.double() - x.double() @ w.T).abs() / scale).max() < 1e-6
    yb = ops.gguf_linear_dense(x.to(torch.bfloat16), qweight, scales, mins, k)
    assert yb.dtype == torch.bfloat16
    with torch.inference_mode():  # as the engine runs it: chunks on the pool's other threads
        torch.testing.assert_close(ops.gguf_linear_dense(x, qweight, scales, mins, k), y)


@pytest.mark.parametrize("name", ["Q4_1", "Q8_0"])
def test_bf16_activations(name):
    k, n = 160, 19
    qweight, scales, mins = weights(name, n, k)
    x = torch.randn(5, k).to(torch.bfloat16)
    y = ops.gguf_linear(x, qweight, scales, mins, k, 0)
    assert y.dtype == torch.bfloat16
    ref = ops.gguf_linear(x.float(), qweight, scales, mins, k, 0)
    torch.testing.assert_close(y.float(), ref, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("isa_name", ["scalar", "avx2", "avx512"])
@pytest.mark.parametrize("name", ["Q6_K", "Q4_1"])
@pytest.mark.parametrize("interleaved", [False, True])
def test_isa_env_switch(isa_name, name, interleaved, monkeypatch):
    """OCTAVO_CPU_QUANT_ISA picks the path the layers run (the portable ones on any CPU)."""
    if ISA_CODES[isa_name] not in ISAS:
        pytest.skip(f"{isa_name} not built on this CPU")
    from octavo.quantization import gguf

    k = 256
    qweight, scales, mins = weights(name, 16, k, interleaved=interleaved)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(1))
    monkeypatch.setenv("OCTAVO_CPU_QUANT_ISA", isa_name)
    y = gguf.gguf_matmul(x, qweight, scales, mins, k)
    assert torch.equal(y, ops.gguf_linear(x, qweight, scales, mins, k, ISA_CODES[isa_name]))
    w = gguf_blocks.dequantize(qweight, scales, mins, k).double()
    scale = (x.double().abs() @ w.abs().T).clamp_min(1e-6)
    assert ((y.double() - reference(x, qweight, scales, mins, k)).abs() / scale).max() < 1e-5


@pytest.mark.parametrize("name,k", [("Q4_0", 96), ("Q4_K", 256), ("Q8_0", 32), ("Q6_K", 256)])
@pytest.mark.parametrize("interleaved", [False, True])
def test_dequantize_kernel(name, k, interleaved):
    qweight, scales, mins = weights(name, 32 if interleaved else 11, k, interleaved=interleaved)
    torch.testing.assert_close(ops.gguf_dequantize(qweight, scales, mins, k),
                               gguf_blocks.dequantize(qweight, scales, mins, k),
                               rtol=0, atol=0)


@pytest.mark.parametrize("name,k", [("Q4_1", 96), ("Q4_K", 256), ("Q5_K", 512), ("Q8_0", 32),
                                    ("Q6_K", 256), ("Q5_0", 64)])
@pytest.mark.parametrize("interleaved", [False, True])
def test_dequantize_rows_kernel(name, k, interleaved):
    """The embedding lookup's op: the rows asked for, in their order (repeats included), equal
    to the torch reference's."""
    n = 48 if interleaved else 37
    qweight, scales, mins = weights(name, n, k, seed=3, interleaved=interleaved)
    ids = torch.tensor([5, 0, n - 1, 17, 5, 33])
    got = ops.gguf_dequantize_rows(qweight, scales, mins, ids, k)
    want = gguf_blocks.dequantize_rows(qweight, scales, mins, ids, k, torch.float32)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert ops.gguf_dequantize_rows(qweight, scales, mins, ids[:0], k).shape == (0, k)


@pytest.mark.parametrize("bad", [-1, 48, 2**62])
def test_dequantize_rows_rejects_ids_outside_the_table(bad):
    qweight, scales, mins = weights("Q4_K", 48, 256, interleaved=True)
    with pytest.raises(RuntimeError, match=rf"ids\[1\] = {bad} is outside \[0, 48\)"):
        ops.gguf_dequantize_rows(qweight, scales, mins, torch.tensor([0, bad]), 256)
    with pytest.raises(RuntimeError, match="1-D int64"):
        ops.gguf_dequantize_rows(qweight, scales, mins, torch.tensor([0], dtype=torch.int32), 256)


def test_rejects_bad_shapes():
    qweight, scales, mins = weights("Q4_1", 4, 64)
    with pytest.raises(RuntimeError, match="x must be"):
        ops.gguf_linear(torch.randn(2, 96), qweight, scales, mins, 64, 0)
    with pytest.raises(RuntimeError, match="scales and mins"):
        ops.gguf_linear(torch.randn(2, 64), qweight, scales[:, :1].contiguous(), mins, 64, 0)


def test_rejects_bad_compact_layouts():
    """The interleaved compact forms are checked before any read: K-quant integer scales
    with the wrong rows, mins or layout, left-out mins on row-major weights, odd row bytes."""
    x = torch.randn(1, 256)
    q, s, m = weights("Q4_K", 16, 256, interleaved=True)
    assert s.dtype == torch.uint8 and m.dtype == torch.uint8
    with pytest.raises(RuntimeError, match="two-level"):
        ops.gguf_linear(x, q, s[:, :-1].contiguous(), m, 256, 0)  # a super-block row short
    with pytest.raises(RuntimeError, match="uint8 scales take uint8 mins"):
        ops.gguf_linear(x, q, s, m[:0], 256, 0)
    q6, s6, m6 = weights("Q6_K", 16, 256, interleaved=True)
    assert s6.dtype == torch.int8 and m6.numel() == 0
    with pytest.raises(RuntimeError, match="int8 ones none"):
        ops.gguf_linear(x, q6, s6, m, 256, 0)
    rq, rs, rm = weights("Q4_0", 5, 256)
    with pytest.raises(RuntimeError, match="only interleaved weights may leave out"):
        ops.gguf_linear(x, rq, rs, rm[:0], 256, 0)
    with pytest.raises(RuntimeError, match="bytes per row"):
        ops.gguf_linear(x, q6[:, :-1].contiguous(), s6, m6, 256, 0)


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: ISA_NAMES[i])
@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q5_1", "Q8_0"])
def test_float16_scales_match_float32(isa, name):
    """Formats whose d and m are the file's fp16 keep them as float16 (fewer bytes per step);
    the product is the same as through their float32 copies, bit for bit."""
    k = 576
    qweight, scales, mins = weights(name, 32, k, interleaved=True)
    assert scales.dtype == mins.dtype == torch.float16
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(2))
    y = ops.gguf_linear(x, qweight, scales, mins, k, isa)
    assert torch.equal(y, ops.gguf_linear(x, qweight, scales.float(), mins.float(), k, isa))
    assert torch.equal(ops.gguf_dequantize(qweight, scales, mins, k),
                       gguf_blocks.dequantize(qweight, scales.float(), mins.float(), k))
    torch.testing.assert_close(ops.gguf_linear_dense(x, qweight, scales, mins, k),
                               ops.gguf_linear_dense(x, qweight, scales.float(), mins.float(),
                                                     k), rtol=0, atol=0)


@pytest.mark.parametrize("name", sorted(gguf_blocks.FORMATS))
def test_interleaved_layout_round_trips(name):
    """16-row interleaving regroups bytes and scales (5 and 6 bits as nibbles plus high
    planes, the formats whose m is -2^(bits-1) d without mins): the float weight is unchanged,
    and an embedding's row lookup reads the same rows."""
    k = 256
    rows = weights(name, 48, k)
    inter = weights(name, 48, k, interleaved=True)
    store = {"Q5_0": 5, "Q5_1": 5, "Q5_K": 5, "Q6_K": 6}.get(name, gguf_blocks.bits(name))
    assert inter[0].shape == (3, k * store // 32, 64)  # the file's bits a weight
    assert (inter[2].numel() == 0) == (name in ("Q4_0", "Q5_0", "Q8_0", "Q6_K"))
    for a, b in zip(gguf_blocks.deinterleave(*inter, k), rows):
        assert torch.equal(a, b)
    ids = torch.tensor([0, 17, 47, 17])
    assert torch.equal(gguf_blocks.dequantize_rows(*inter, ids, k, torch.float32),
                       gguf_blocks.dequantize(*rows, k)[ids])


@pytest.mark.parametrize("name", ["Q4_1", "Q8_0", "Q6_K"])
@pytest.mark.parametrize("m", [3, 17])
def test_large_output_streamed(name, m):
    """Outputs of 1 MiB and more (an LM head's logits) leave the VNNI kernel through
    non-temporal stores, with the next 16-row group's weights prefetched: same values."""
    k = 256
    n = 16 * ((1 << 20) // (4 * m * 16) + 1)
    qweight, scales, mins = weights(name, n, k, seed=m, interleaved=True)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    y = ops.gguf_linear(x, qweight, scales, mins, k, 0)
    w = gguf_blocks.dequantize(qweight, scales, mins, k).double()
    scale = (x.double().abs() @ w.abs().T).clamp_min(1e-6)
    assert ((y.double() - reference(x, qweight, scales, mins, k)).abs() / scale).max() < 1e-5


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: ISA_NAMES[i])
@pytest.mark.parametrize("names", [("Q5_0", "Q5_0", "Q8_0"), ("Q4_K", "Q4_K", "Q6_K"),
                                   ("Q4_0", "Q4_1"), ("Q6_K", "Q8_0")], ids="+".join)
@pytest.mark.parametrize("m", [1, 5])
def test_mixed_parts_match_reference(isa, names, m):
    """A merged layer of parts in different formats (gguf_blocks.repack_parts), interleaved,
    through every path: the same arithmetic as the reference on its dequantized weight."""
    k, rows = 256, (32, 16, 16)
    parts = [(torch.from_numpy(random_rows(name, n, k, seed=i)), name)
             for i, (name, n) in enumerate(zip(names, rows))]
    qweight, scales, mins = gguf_blocks.repack_parts(parts, k, interleaved=True)
    assert qweight.dim() == 3
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    y = ops.gguf_linear(x, qweight, scales, mins, k, isa)
    w = gguf_blocks.dequantize(qweight, scales, mins, k).double()
    scale = (x.double().abs() @ w.abs().T).clamp_min(1e-6)
    ref = reference(x, qweight, scales, mins, k)
    assert ((y.double() - ref).abs() / scale).max() < 1e-5
    dense = ops.gguf_linear_dense(x, qweight, scales, mins, k)
    assert ((dense.double() - x.double() @ w.T).abs() / scale).max() < 1e-5
