"""The CUDA C++ bitsandbytes 4-bit GEMV (``octavo/kernels/bnb4_cuda.py``, ``cuda/bnb4_gemv.cu``):
its source builds for sm_90 without spills (nvcc, no GPU needed); its index arithmetic,
emulated on the CPU lane by lane, gives the dequantized product; on the GPU, against that
product at small and Llama-3.1-8B shapes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from octavo.kernels import bnb4_cuda
from octavo.quantization import bnb_format as fmt
from octavo.quantization.bnb_weight import blocks_or_dense, dequantize_packed
from tests.kernels import cuda_checks

NAMES = [f"bnb4_gemv_{t}_m{m}_a{a}" for t in ("bf16", "f16") for m in (1, 2, 3, 4)
         for a in (1, 8)]


def test_the_source_builds_for_hopper_without_spills(tmp_path, monkeypatch):
    from octavo.kernels import cuda_module

    if cuda_module.nvcc_path() is None:
        pytest.skip("nvcc not found")
    spills = cuda_checks.build_once(bnb4_cuda.SOURCE, NAMES, tmp_path, monkeypatch)
    assert not any(spills.values()), spills


def _weight(n, k, blocksize, quant_type, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    packed, absmax = fmt.quantize_4bit(w, quant_type, blocksize)
    return blocks_or_dense(packed, absmax, fmt.code_table(quant_type, w.device), blocksize,
                           n, k)


def _emulate(x, q, absmax, code, bs, rows):
    """What cuda/bnb4_gemv.cu computes, in its index arithmetic: block (bx, chunk), warp w
    visiting rows w, w + 8, ...; lane l's 16-byte load of its row's bytes, little-endian
    words, byte b of word i holding weights 8i + 2b (high nibble) and 8i + 2b + 1; the lane's
    sum times absmax[r, k0 / bs]; the warp's sum added to out[m, r]."""
    m, k = x.shape
    n = q.shape[0]
    qb = q.numpy().astype(np.uint32)
    out = np.zeros((m, n))
    hits = np.zeros((m, n), int)
    chunks = -(-k // bnb4_cuda.CHUNK)
    for bx in range(-(-n // rows)):
        for chunk in range(chunks):
            for warp in range(bnb4_cuda.WARPS):
                for r in range(bx * rows + warp, min(n, bx * rows + rows), bnb4_cuda.WARPS):
                    total = np.zeros(m)
                    for lane in range(32):
                        k0 = chunk * 1024 + lane * 32
                        if k0 >= k:  # the last chunk's idle lanes
                            continue
                        raw = qb[r, k0 // 2:k0 // 2 + 16]
                        words = raw[0::4] | raw[1::4] << 8 | raw[2::4] << 16 | raw[3::4] << 24
                        s = np.zeros(m)
                        for i in range(4):
                            for b in range(4):
                                hi = code[(words[i] >> (8 * b + 4)) & 0xF]
                                lo = code[(words[i] >> (8 * b)) & 0xF]
                                s += hi * x[:, k0 + 8 * i + 2 * b] + lo * x[:, k0 + 8 * i + 2 * b + 1]
                        total += s * absmax[r, k0 // bs]
                    out[:, r] += total
                    hits[:, r] += 1
    assert (hits == chunks).all()  # every row, once per chunk
    return out


@pytest.mark.parametrize("n,k,bs,quant_type,rows", [(24, 1024, 64, "nf4", 8),
                                                    (40, 2048, 32, "fp4", 16),
                                                    (16, 1536, 64, "nf4", 8)])  # half a chunk
def test_the_index_arithmetic_gives_the_dequantized_product(n, k, bs, quant_type, rows):
    b = _weight(n, k, bs, quant_type, seed=n)
    x = torch.randn(2, k, generator=torch.Generator().manual_seed(k), dtype=torch.float64)
    got = _emulate(x.numpy(), b.packed, b.absmax.double().numpy(), b.code.double().numpy(), bs,
                   rows)
    want = x @ dequantize_packed(b.packed, b.absmax, b.code, bs, torch.float64).t()
    # the reference rounds each code * absmax to float32 first; a wrong index is O(1) off
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)


def test_the_switch(monkeypatch):
    cuda_checks.check_switch(monkeypatch, bnb4_cuda, "OCTAVO_BNB4_CUDA", default=True)


def test_supported_shapes(monkeypatch):
    monkeypatch.delenv("OCTAVO_BNB4_CUDA_MAX_M", raising=False)
    assert bnb4_cuda.supported(1, 4096, 64, torch.bfloat16)
    assert bnb4_cuda.supported(2, 14336, 64, torch.float16)
    assert bnb4_cuda.supported(8, 4096, 64, torch.bfloat16)  # two launches of 4
    assert not bnb4_cuda.supported(9, 4096, 64, torch.bfloat16)  # by default: dequantize
    monkeypatch.setenv("OCTAVO_BNB4_CUDA_MAX_M", "16")
    assert bnb4_cuda.supported(16, 4096, 64, torch.bfloat16)
    assert not bnb4_cuda.supported(17, 4096, 64, torch.bfloat16)  # dequantize, then cuBLAS
    monkeypatch.delenv("OCTAVO_BNB4_CUDA_MAX_M")
    assert not bnb4_cuda.supported(1, 4096, 64, torch.float32)  # the Triton GEMV's
    assert bnb4_cuda.supported(1, 1536, 64, torch.bfloat16)  # the last chunk half idle
    assert not bnb4_cuda.supported(1, 1000, 8, torch.bfloat16)  # K not a multiple of 32
    assert not bnb4_cuda.supported(1, 4096, 16, torch.bfloat16)  # a lane's 32 in 2 blocks


class _Recorder:
    def __init__(self):
        self.launches = []

    def launch(self, name, grid, block, args):
        self.launches.append((name, grid, block, [a.value for a in args]))


@pytest.mark.parametrize("m,names", [(1, ["m1_a1"]), (4, ["m4_a8"]), (6, ["m4_a8", "m2_a8"]),
                                     (9, ["m4_a8", "m4_a8", "m1_a1"]),
                                     (11, ["m4_a1", "m4_a1", "m3_a1"])])
def test_a_batch_takes_a_launch_per_four_rows(m, names, monkeypatch):
    """Rows 4i .. 4i + 3 of x and of the output go to launch i, each reading the whole
    weight: the kernel named for its row count, x's and out's pointers moved by 4i rows, the
    same grid and strides."""
    from octavo.kernels import cuda_module

    rec = _Recorder()
    monkeypatch.setattr(cuda_module, "loaded", lambda source, device: rec)
    monkeypatch.setenv("OCTAVO_BNB4_CUDA_MAX_M", "16")
    if m == 11:  # every launch at one row a warp in flight (OCTAVO_BNB4_CUDA_AHEAD)
        monkeypatch.setenv("OCTAVO_BNB4_CUDA_AHEAD", "1")
    n, k, bs = 48, 2048, 64
    x = torch.randn(m, k, dtype=torch.bfloat16)
    q = torch.zeros(n, k // 2, dtype=torch.uint8)
    absmax = torch.ones(n, k // bs)
    out = bnb4_cuda.bnb4_gemv_cuda(x, q, absmax, torch.zeros(16), bs, rows=16)
    assert out.shape == (m, n) and out.dtype == torch.bfloat16
    assert [name for name, *_ in rec.launches] == [f"bnb4_gemv_bf16_{s}" for s in names]
    xs = [args[3] for *_, args in rec.launches]
    outs = [args[4] for *_, args in rec.launches]
    assert all(b - a == 4 * x.stride(0) * 2 for a, b in zip(xs, xs[1:]))  # 4 bf16 rows
    assert all(b - a == 4 * n * 4 for a, b in zip(outs, outs[1:]))  # 4 float32 rows
    assert {(grid, block) for _, grid, block, _ in rec.launches} == {((3, 2, 1), 256)}
    assert {tuple(args[5:]) for *_, args in rec.launches} == {
        (n, k, k // 2, k // bs, x.stride(0), bs, 16)}


def _gpu(monkeypatch):
    monkeypatch.setenv("OCTAVO_BNB4_CUDA", "1")
    monkeypatch.setenv("OCTAVO_BNB4_CUDA_MAX_M", "16")
    if not torch.cuda.is_available() or not bnb4_cuda.available(torch.device("cuda")):
        pytest.skip("needs CUDA and nvcc")


@pytest.mark.gpu
@pytest.mark.parametrize("n,k,bs,quant_type", [(24, 1024, 64, "nf4"), (40, 2048, 32, "fp4"),
                                               (48, 1536, 64, "nf4"), (8960, 1536, 64, "nf4"),
                                               (4096, 4096, 64, "nf4"),
                                               (28672, 4096, 64, "nf4"),
                                               (4096, 14336, 64, "nf4")])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 7, 16])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gemv_on_the_gpu(n, k, bs, quant_type, m, dtype, monkeypatch):
    _gpu(monkeypatch)
    b = _weight(n, k, bs, quant_type, seed=n + m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(k)).to(dtype).cuda()
    got = bnb4_cuda.bnb4_gemv_cuda(x, b.packed.cuda(), b.absmax.float().cuda(),
                                   b.code.float().cuda(), bs)
    want = x.float() @ dequantize_packed(b.packed, b.absmax, b.code, bs,
                                         torch.float32).cuda().t()
    assert got.shape == (m, n) and got.dtype == dtype
    assert ((got.float() - want).norm() / want.norm()).item() < 1e-2
    for rows in (8, 64):  # other block sizes give the same sums up to their order
        other = bnb4_cuda.bnb4_gemv_cuda(x, b.packed.cuda(), b.absmax.float().cuda(),
                                         b.code.float().cuda(), bs, rows=rows)
        assert ((other.float() - got.float()).norm() / want.norm()).item() < 1e-2
    for ahead in ("1", "8"):  # rows a warp in flight: the same sums up to their order
        monkeypatch.setenv("OCTAVO_BNB4_CUDA_AHEAD", ahead)
        for rows in (None, 40):  # 40: 5 rows a warp, a partial group of AHEAD
            other = bnb4_cuda.bnb4_gemv_cuda(x, b.packed.cuda(), b.absmax.float().cuda(),
                                             b.code.float().cuda(), bs, rows=rows)
            assert ((other.float() - got.float()).norm() / want.norm()).item() < 1e-2
