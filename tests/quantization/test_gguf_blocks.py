"""GGUF block formats repacked into the kernels' layout: exact against gguf-py's dequantizer."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from octavo.quantization import gguf_blocks

gguf = pytest.importorskip("gguf")


def random_rows(name: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    """Random GGUF rows of format ``name`` whose fp16 scales are finite."""
    _, per_block, nbytes = gguf_blocks.FORMATS[name]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(n, k // per_block * nbytes), dtype=np.uint8)
    blocks = raw.reshape(-1, nbytes)
    n_f16 = 1 if name in ("Q4_0", "Q5_0", "Q8_0", "Q6_K") else 2  # d (and min / dmin)
    scales = (rng.normal(size=(blocks.shape[0], n_f16)) * 0.01).astype(np.float16)
    if name == "Q6_K":  # d ends the block
        blocks[:, -2:] = scales.view(np.uint8)
    else:  # d (and min / dmin) lead it
        blocks[:, :2 * n_f16] = scales.view(np.uint8)
    return raw


@pytest.mark.parametrize("name", sorted(gguf_blocks.FORMATS))
@pytest.mark.parametrize("k_blocks", [1, 3])
def test_repack_is_exact(name, k_blocks):
    per_block = gguf_blocks.FORMATS[name][1]
    k = k_blocks * per_block
    raw = random_rows(name, 5, k)
    ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(gguf_blocks.FORMATS[name][0]))
    qweight, scales, mins = gguf_blocks.repack(torch.from_numpy(raw), name, k)
    assert qweight.shape == (5, k // 2 if gguf_blocks.bits(name) == 4 else k)
    assert scales.shape == mins.shape == (5, k // gguf_blocks.group_size(name))
    w = gguf_blocks.dequantize(qweight, scales, mins, k)
    if name == "Q6_K":  # d * u + m in float32 against d * (q - 32): may differ in the last bit
        np.testing.assert_allclose(w.numpy(), ref.reshape(5, k), rtol=1e-6, atol=1e-12)
    else:
        np.testing.assert_array_equal(w.numpy(), ref.reshape(5, k).astype(np.float32))


@pytest.mark.parametrize("k", [32, 64, 96, 160])
def test_nibble_packing_round_trips(k):
    u = torch.randint(0, 16, (3, k), dtype=torch.uint8)
    assert torch.equal(gguf_blocks.unpack_nibbles(gguf_blocks.pack_nibbles(u), k), u)


def test_unsupported_types_have_no_format():
    assert gguf_blocks.format_name(int(gguf.GGMLQuantizationType.Q3_K)) is None
    assert gguf_blocks.format_name(int(gguf.GGMLQuantizationType.Q6_K)) == "Q6_K"
    assert gguf_blocks.format_name(int(gguf.GGMLQuantizationType.F32)) is None
    assert gguf_blocks.format_name(int(gguf.GGMLQuantizationType.Q4_1)) == "Q4_1"


def test_scales_float16_only_when_exact():
    """Q4_1's d and m are fp16 in the file and stay so; Q4_K's d_super * scale6 products
    generally are not, and stay float32."""
    _, s, m = gguf_blocks.repack(torch.from_numpy(random_rows("Q4_1", 3, 64)), "Q4_1", 64)
    assert s.dtype == m.dtype == torch.float16
    _, s, m = gguf_blocks.repack(torch.from_numpy(random_rows("Q4_K", 3, 256)), "Q4_K", 256)
    assert s.dtype == m.dtype == torch.float32


MIXES = [("Q5_0", "Q5_0", "Q8_0"), ("Q4_K", "Q4_K", "Q6_K"), ("Q4_0", "Q4_1"), ("Q6_K", "Q8_0"),
         ("Q4_0", "Q5_1")]


@pytest.mark.parametrize("names", MIXES, ids="+".join)
@pytest.mark.parametrize("interleaved", [False, True])
def test_repack_parts_is_exact(names, interleaved):
    """A merged layer whose parts have different formats (llama.cpp's Q4_K_M files: q, k
    Q5_0 and v Q8_0): the stacked layer's float weight is each part's own dequantization."""
    k, rows = 256, (32, 16, 16)
    raws = [random_rows(name, n, k, seed=i) for i, (name, n) in enumerate(zip(names, rows))]
    ref = np.concatenate([
        gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(gguf_blocks.FORMATS[name][0]))
        for raw, name in zip(raws, names)]).reshape(-1, k)
    q, s, m = gguf_blocks.repack_parts([(torch.from_numpy(r), n) for r, n in zip(raws, names)],
                                       k, interleaved)
    n = sum(rows[:len(names)])
    assert gguf_blocks.out_features(q) == n
    assert q.dim() == (3 if interleaved else 2)
    if interleaved:  # the widest part's bits (Q6_K + Q8_0: bytes with per-16 scales)
        store = max({"Q5_0": 5, "Q5_1": 5, "Q6_K": 6, "Q8_0": 8}.get(n_, 4) for n_ in names)
        assert gguf_blocks.stored_bits(q, k) == store
    assert m.numel() > 0  # mixed formats keep their mins
    w = gguf_blocks.dequantize(q, s, m, k).numpy()
    np.testing.assert_allclose(w, ref.astype(np.float32), rtol=1e-6, atol=1e-12)
    if not any(name == "Q6_K" for name in names):  # d * u + m is exact without Q6_K's d
        np.testing.assert_array_equal(w, ref.astype(np.float32))
