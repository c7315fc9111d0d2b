"""The CUDA-core GEMV and the dequantize kernel on the swap-AB packed layout
(octavo/kernels/w4a16_swapab_gemv.py) against the dequantize-then-matmul reference on the
unpacked values: small shapes through the interpreter on the CPU, real shapes on the GPU."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from octavo.kernels.w4a16_gemm import (  # noqa: E402
    dequantize_ref,
    pack_along_k,
    w4a16_gemm,
    w4a16_gemm_ref,
)
from octavo.kernels.w4a16_swapab import pack_swapab  # noqa: E402
from octavo.kernels.w4a16_swapab_gemv import dequantize_swapab, supports  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _weights(k, n, group, bits, dtype, device=DEVICE, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 2**bits, (k, n), generator=g)
    scales = (torch.rand(k // group, n, generator=g) * 0.02 + 0.001).to(dtype)
    # Zeros up to 2**bits: GPTQ v1 checkpoints can hold one past the largest value.
    zeros = torch.randint(0, 2**bits + 1, (k // group, n), generator=g).to(dtype)
    return q, scales.to(device), zeros.to(device)


def _rel_err(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp(min=1e-12)).item()


def _tolerance(dtype):
    if dtype == torch.float32:
        return 1e-5
    if dtype == torch.bfloat16 and DEVICE.type == "cpu":
        # The interpreter truncates float32 -> bf16 (the GPU rounds to nearest): up to one
        # bf16 step of the output, not the kernel's arithmetic (fp16 checks that at 5e-4).
        return 6e-3
    return 5e-3 if dtype == torch.bfloat16 else 1e-3


def _check(m, k, n, group, bits, dtype, seed=0, **tuning):
    q, scales, zeros = _weights(k, n, group, bits, dtype, seed=seed)
    q = q.to(DEVICE)  # packed where the kernel runs (real shapes: fast on the GPU)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(m, k, generator=g).to(dtype).to(DEVICE)
    out = w4a16_gemm(x, pack_swapab(q, bits), scales, zeros, group, bits,
                     path="swapab_gemv", **tuning)
    ref = w4a16_gemm_ref(x.float(), pack_along_k(q, bits), scales.float(), zeros.float(),
                         group, bits)
    assert out.shape == (m, n) and out.dtype == dtype
    err = _rel_err(out, ref)
    assert err < _tolerance(dtype), err


def test_supports():
    assert supports(1, 4096, 4096, 128, 4) and supports(2, 4096, 128, 32, 8)
    assert not supports(3, 4096, 4096, 128, 4)  # M <= 2
    assert not supports(1, 4096, 128, 128, 4)  # 4-bit tiles are 256 columns
    assert not supports(1, 4096, 4096, 4, 4)  # groups of 8 or more
    assert supports(1, 96, 256, 96, 4)  # one group over all of K


SMALL = [  # m, k, n, group, bits
    (1, 64, 256, 32, 4), (2, 128, 256, 64, 4), (1, 256, 512, 128, 4), (2, 96, 256, 96, 4),
    (1, 64, 128, 32, 8), (2, 128, 128, 64, 8), (1, 256, 256, 128, 8), (2, 96, 128, 96, 8),
]


@pytest.mark.parametrize("m,k,n,group,bits", SMALL)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_matches_reference(m, k, n, group, bits, dtype):
    _check(m, k, n, group, bits, dtype)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("m", [1, 2])
def test_float32_activations(m, bits):
    """Float32 activations keep every value at the top of the mantissa (PRECISE)."""
    _check(m, 128, 64 * 16 // bits, 64, bits, torch.float32)


@pytest.mark.parametrize("m,k,group,bits,tuning", [
    # Ragged K splits: 5 chunks of 32 over 2 splits of 3 and 2 chunks.
    (1, 160, 32, 4, {"split_k": 2, "threads_k": 1}),
    # 4 threads per row, 5 chunks in a split: the last round's threads past the end idle.
    (2, 160, 32, 4, {"split_k": 1, "threads_k": 4}),
    (1, 320, 64, 8, {"split_k": 3, "threads_k": 2, "flush": 32}),  # folds inside groups
    (2, 512, 512, 4, {"split_k": 2}),  # one group over all of K, folded in parts
    (1, 256, 128, 4, {"rows_per_thread": 2, "num_warps": 1, "threads_k": 1}),
    (2, 256, 128, 8, {"rows_per_thread": 1, "num_warps": 2, "threads_k": 8}),
    (2, 256, 64, 4, {"early_scales": True, "split_k": 2}),  # s and z loaded before the loop
    (1, 256, 64, 8, {"early_scales": True}),
])
def test_splits_chunks_and_tiles(m, k, group, bits, tuning):
    _check(m, k, 2 * 64 * 16 // bits, group, bits, torch.float16, **tuning)


def test_leading_dims_and_empty_batch():
    q, scales, zeros = _weights(64, 256, 32, 4, torch.float16)
    packed = pack_swapab(q, 4).to(DEVICE)
    x = torch.randn(2, 1, 64, device=DEVICE).half()
    out = w4a16_gemm(x, packed, scales, zeros, 32, 4, path="swapab_gemv")
    assert out.shape == (2, 1, 256)
    ref = w4a16_gemm_ref(x.float(), pack_along_k(q, 4).to(DEVICE), scales, zeros, 32, 4)
    assert _rel_err(out, ref) < 1e-3
    empty = w4a16_gemm(torch.empty(0, 64, device=DEVICE).half(), packed, scales, zeros, 32, 4,
                       path="swapab_gemv")
    assert empty.shape == (0, 256)


def test_refuses_large_batches():
    q, scales, zeros = _weights(64, 256, 32, 4, torch.float16)
    with pytest.raises(ValueError):
        w4a16_gemm(torch.randn(3, 64, device=DEVICE).half(), pack_swapab(q, 4).to(DEVICE),
                   scales, zeros, 32, 4, path="swapab_gemv")


@pytest.mark.parametrize("k,n,group,bits,dtype", [
    (64, 256, 32, 4, torch.float16), (128, 128, 128, 8, torch.float32),
    (96, 512, 96, 4, torch.bfloat16), (256, 256, 64, 8, torch.float16),
])
def test_dequantize_is_exact(k, n, group, bits, dtype):
    q, scales, zeros = _weights(k, n, group, bits, torch.float16)
    w = dequantize_swapab(pack_swapab(q, bits).to(DEVICE), scales, zeros, group, bits, dtype)
    ref = dequantize_ref(pack_along_k(q, bits).to(DEVICE), scales, zeros, group, bits, dtype)
    if dtype == torch.bfloat16 and DEVICE.type == "cpu":  # truncated there, see _tolerance
        assert _rel_err(w, ref) < 6e-3
    else:
        assert torch.equal(w, ref)


def test_dequant_path():
    q, scales, zeros = _weights(128, 256, 64, 4, torch.float16)
    x = torch.randn(5, 128, device=DEVICE).half()
    out = w4a16_gemm(x, pack_swapab(q, 4).to(DEVICE), scales, zeros, 64, 4,
                     path="swapab_dequant")
    ref = w4a16_gemm_ref(x.float(), pack_along_k(q, 4).to(DEVICE), scales, zeros, 64, 4)
    assert out.shape == (5, 256) and _rel_err(out, ref) < 1e-3


def _prmt(code: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """PTX ``prmt.b32 d, a, b, sel`` (default mode, no sign replication) on int64 holding
    uint32: result byte i is byte ``sel[i]`` of the 8 bytes {b, a} (a: 0-3, b: 4-7)."""
    sel = int(code.strip().rstrip(";").split(",")[-1], 0)
    src = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    out = torch.zeros_like(a)
    for i in range(4):
        nib = (sel >> (4 * i)) & 0xF
        assert nib < 8, "sign replication is not used"
        out |= src[nib] << (8 * i)
    return out


def test_prmt_codes():
    """The byte permutes (inline PTX, not run by the interpreter) against what the
    interpreter's shifts compute."""
    from octavo.kernels import w4a16_swapab_gemv as sgv

    value = lambda c: getattr(c, "value", c)  # noqa: E731
    w = torch.randint(-2**31, 2**31, (4096,), dtype=torch.int64) & 0xFFFFFFFF
    # 4-bit: bytes 3 and 1 to bytes 1 and 2 (the other bytes are masked off).
    t = _prmt(value(sgv.PRMT_3120), w, torch.zeros_like(w))
    assert torch.equal(t & 0x00FFFF00, ((w >> 16) & 0xFF00) | ((w << 8) & 0xFF0000))
    # 8-bit: byte c under the bytes of 1.0f is 1 + q 2**-15.
    one = torch.full_like(w, sgv.ONE)
    for c, code in enumerate(sgv.PRMT_BYTE):
        t = _prmt(value(code), w, one)
        assert torch.equal(t, (((w >> (8 * c)) & 0xFF) << 8) | sgv.ONE)
        q = ((w >> (8 * c)) & 0xFF).float()
        f = t.to(torch.int32).view(torch.float32)
        assert torch.equal(f, 1 + q * 2.0**-15)


@pytest.mark.gpu
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("k,n", [(4096, 6144), (4096, 28672), (14336, 4096)])
def test_real_shapes_gpu(m, dtype, bits, k, n):
    """On the GPU the inline-PTX byte permute runs (the interpreter runs the shifts)."""
    _check(m, k, n, 128, bits, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("tuning", [{"threads_k": 1, "num_warps": 1},
                                    {"threads_k": 2, "rows_per_thread": 2},
                                    {"threads_k": 8, "num_warps": 8}, {"split_k": 1},
                                    {"early_scales": True, "maxnreg": 128}],
                         ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
@pytest.mark.parametrize("bits", [4, 8])
def test_tunings_gpu(bits, tuning):
    _check(1, 4096, 4096, 128, bits, torch.bfloat16, **tuning)


@pytest.mark.gpu
def test_group_of_all_k_and_float32_gpu():
    _check(1, 4096, 1024, 4096, 4, torch.float16)
    _check(2, 4096, 1024, 128, 4, torch.float32)


@pytest.mark.gpu
def test_dequantize_real_shape_gpu():
    q, scales, zeros = _weights(4096, 6144, 128, 4, torch.bfloat16,
                                device=torch.device("cuda"))
    w = dequantize_swapab(pack_swapab(q, 4).cuda(), scales, zeros, 128, 4, torch.bfloat16)
    ref = dequantize_ref(pack_along_k(q, 4).cuda(), scales, zeros, 128, 4, torch.bfloat16)
    assert torch.equal(w, ref)


@pytest.mark.gpu
def test_inside_a_cuda_graph_gpu():
    """Split-K counters come back to zero inside a graph, replay after replay."""
    from octavo.kernels import split_k

    q, scales, zeros = _weights(4096, 1024, 128, 4, torch.bfloat16, device=torch.device("cuda"))
    packed = pack_swapab(q, 4).cuda()
    ref_w = pack_along_k(q, 4).cuda()
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    w4a16_gemm(x, packed, scales, zeros, 128, 4, path="swapab_gemv")  # compile first
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = w4a16_gemm(x, packed, scales, zeros, 128, 4, path="swapab_gemv")
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        assert _rel_err(out, w4a16_gemm_ref(x, ref_w, scales, zeros, 128, 4)) < 1e-2
        assert not split_k.counters(x.device, 1).any()


def test_strided_activations():
    """Rows of x at an odd stride are copied (the kernel reads x in int32 pairs)."""
    q, scales, zeros = _weights(64, 256, 32, 4, torch.float16)
    x = torch.randn(2, 65, device=DEVICE).half()[:, 1:]
    out = w4a16_gemm(x, pack_swapab(q, 4).to(DEVICE), scales, zeros, 32, 4, path="swapab_gemv")
    ref = w4a16_gemm_ref(x.float(), pack_along_k(q, 4).to(DEVICE), scales, zeros, 32, 4)
    assert _rel_err(out, ref) < 1e-3
