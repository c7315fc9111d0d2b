"""Dequantize-then-cuBLAS in column chunks with the dequantization on a side stream
(octavo/kernels/dequant_overlap.py): the chunking, the ring's reuse and the products against
the whole weight's in Triton's interpreter on the CPU (float32: the interpreter's bf16 dot is
wrong); on the GPU at Llama-8B shapes, under CUDA-graph replay, and the engine's routing."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from octavo.kernels import dequant_overlap, int_weight_layout  # noqa: E402
from octavo.kernels.dequant_overlap import chunk_columns, dequant_gemm  # noqa: E402
from octavo.kernels.w4a16_swapab import dequantize_swapab, pack_swapab  # noqa: E402

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _weights(k, n, group, bits, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 2**bits, (k, n), generator=g)
    scales = torch.rand(k // group, n, generator=g) * 0.02 + 0.001
    zeros = torch.randint(0, 2**bits + 1, (k // group, n), generator=g).float()
    return pack_swapab(q, bits).to(device), scales.to(device), zeros.to(device)


def test_chunk_columns_are_whole_layout_blocks():
    assert chunk_columns(28672, 4, 4096) == 4096
    assert chunk_columns(28672, 4, 5000) == 4864  # 19 blocks of 256 columns
    assert chunk_columns(28672, 4, 100) == 256  # at least one block
    assert chunk_columns(28672, 8, 100) == 128  # 8-bit: 64 rows of 2 columns
    assert chunk_columns(1024, 4, 8192) == 1024  # at most the layer


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("chunk,buffers", [(256, 1), (256, 2), (512, 3), (300, 2),
                                           (4096, 2)])
def test_equals_the_whole_weight_s_product(bits, chunk, buffers, device):
    """Every chunk count (one; several, the last one short), ring sizes below and above the
    chunk count: the product of the whole dequantized weight."""
    k, n, group, m = 128, 1280 if bits == 4 else 640, 32, 5
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    q, s, z = _weights(k, n, group, bits, device)
    x = torch.randn(m, k, device=device).to(dtype)
    want = x @ dequantize_swapab(q, s, z, group, bits, dtype)
    got = dequant_gemm(x, q, s, z, group, bits, chunk, buffers)
    assert got.shape == (m, n) and got.dtype == dtype
    torch.testing.assert_close(got, want, rtol=1e-5 if dtype == torch.float32 else 1e-2,
                               atol=1e-5 if dtype == torch.float32 else 1e-2)
    again = dequant_gemm(x, q, s, z, group, bits, chunk, buffers)  # the ring reused
    assert torch.equal(again, got)


def test_a_ring_per_shape_and_reuse(device):
    dequant_overlap._RINGS.clear()
    k, n, group = 128, 1024, 32
    q, s, z = _weights(k, n, group, 4, device)
    x = torch.randn(3, k, device=device)
    dequant_gemm(x, q, s, z, group, 4, 256, 2)
    (key, ring), = dequant_overlap._RINGS.items()
    assert len(ring) == 2 and ring[0].shape == (256, k)
    ptrs = [b.data_ptr() for b in ring]
    dequant_gemm(x, q, s, z, group, 4, 256, 2)
    assert [b.data_ptr() for b in dequant_overlap._RINGS[key]] == ptrs  # no reallocation
    with pytest.raises(ValueError, match="buffers"):
        dequant_gemm(x, q, s, z, group, 4, 256, 0)


def test_out_must_fit_the_chunk():
    q, s, z = _weights(128, 256, 32, 4, "cpu")
    with pytest.raises(ValueError, match="contiguous"):
        dequantize_swapab(q, s, z, 32, 4, torch.float32, out=torch.empty(128, 256))
    with pytest.raises(ValueError, match="contiguous"):
        dequantize_swapab(q, s, z, 32, 4, torch.float32,
                          out=torch.empty(256, 128, dtype=torch.float16))


def test_the_cpu_keeps_the_whole_weight_path(monkeypatch):
    """The switch is for CUDA: on the CPU the engine's large batches stay one dequantization
    and one matmul."""
    monkeypatch.setenv("OCTAVO_INT_DEQUANT_CHUNK_COLS", "256")
    calls = []
    monkeypatch.setattr(dequant_overlap, "dequant_gemm", lambda *a, **kw: calls.append(1))
    q, s, z = _weights(128, 256, 32, 4, "cpu")
    x = torch.randn(130, 128)
    out = int_weight_layout.linear(x, q, s, z, 32, 4, int_weight_layout.SWAPAB)
    assert out.shape == (130, 256) and not calls


# --------------------------------------------------------------------------------------------
# GPU
# --------------------------------------------------------------------------------------------


@gpu
@needs_cuda
@pytest.mark.parametrize("k,n", [(4096, 28672), (14336, 4096), (4096, 6144)])
@pytest.mark.parametrize("m", [129, 256])
@pytest.mark.parametrize("chunk,buffers", [(2048, 2), (4096, 3), (8192, 2)])
def test_llama_shapes_gpu(k, n, m, chunk, buffers):
    q, s, z = _weights(k, n, 128, 4, "cuda")
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    want = x @ dequantize_swapab(q, s, z, 128, 4, x.dtype)
    got = dequant_gemm(x, q, s, z, 128, 4, chunk, buffers)
    torch.cuda.synchronize()
    # The same dequantized values and cuBLAS on column slices: equal or within an ulp.
    torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)


@gpu
@needs_cuda
def test_graph_replays_and_the_engine_routing_gpu(monkeypatch):
    """Captured in a CUDA graph (the side stream's work a branch), replayed on new inputs;
    and int_weight_layout sends batches past the Triton GEMM's rows here when switched on."""
    k, n = 4096, 6144
    q, s, z = _weights(k, n, 128, 4, "cuda")
    x = torch.randn(256, k, device="cuda", dtype=torch.bfloat16)
    out = dequant_gemm(x, q, s, z, 128, 4, 2048, 2)  # rings made outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = dequant_gemm(x, q, s, z, 128, 4, 2048, 2)
    for seed in (1, 2):
        x.copy_(torch.randn(256, k, generator=torch.Generator().manual_seed(seed)).cuda())
        graph.replay()
        torch.cuda.synchronize()
        want = x @ dequantize_swapab(q, s, z, 128, 4, x.dtype)
        torch.testing.assert_close(out, want, rtol=1e-2, atol=1e-2)

    calls = []
    real = dequant_overlap.dequant_gemm
    monkeypatch.setattr(dequant_overlap, "dequant_gemm",
                        lambda *a, **kw: calls.append(a[0].shape[0]) or real(*a, **kw))
    monkeypatch.setenv("OCTAVO_INT_DEQUANT_CHUNK_COLS", "2048")
    for m in (64, 129, 300):
        xm = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        got = int_weight_layout.linear(xm, q, s, z, 128, 4, int_weight_layout.SWAPAB)
        want = xm @ dequantize_swapab(q, s, z, 128, 4, xm.dtype)
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    assert calls == [129, 300]  # 64 rows: the swap-AB GEMM
