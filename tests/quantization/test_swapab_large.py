"""The large-batch integer GEMM on the swap-AB layout (octavo/kernels/swapab_large.py) against
the dequantize-then-matmul path it replaces: small shapes through the interpreter on the CPU,
Llama-8B shapes and CUDA graphs on the GPU."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from octavo.kernels.swapab_large import supports, swapab_large  # noqa: E402
from octavo.kernels.w4a16_swapab import dequantize_swapab, pack_swapab  # noqa: E402
from tests.quantization.gemm_checks import check_graph_replays, record_rows, rel_err  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _weights(k, n, group, bits, device=DEVICE, seed=0, dtype=torch.float16):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 2**bits, (k, n), generator=g)
    scales = (torch.rand(k // group, n, generator=g) * 0.02 + 0.001).to(dtype)
    zeros = torch.randint(0, 2**bits + 1, (k // group, n), generator=g).to(dtype)
    return pack_swapab(q, bits).to(device), scales.to(device), zeros.to(device)


def _ref(x, packed, scales, zeros, group, bits):
    """The engine's path past 128 rows: the whole weight dequantized (rounded once to x's
    dtype), then one matmul in float32."""
    w = dequantize_swapab(packed, scales, zeros, group, bits, x.dtype)
    return (x.float() @ w.float()).to(x.dtype)


def test_supports():
    assert supports(4096, 28672, 128, 4) and supports(14336, 4096, 128, 4)
    assert supports(4096, 128, 4096, 8)  # one group over K
    assert not supports(4096, 128, 128, 4)  # 4-bit layout blocks are 256 columns
    assert not supports(4096, 4096, 8, 4) and not supports(4096, 4096, 128, 3)


def test_rejects_a_tile_the_group_cannot_hold():
    packed, s, z = _weights(64, 256, 32, 4)
    x = torch.randn(4, 64, device=DEVICE).half()
    with pytest.raises(ValueError, match="block_k=64"):
        swapab_large(x, packed, s, z, 32, 4, block_k=64)
    with pytest.raises(ValueError, match="cols=3"):
        swapab_large(x, packed, s, z, 32, 4, cols=3, block_k=32)


@pytest.mark.parametrize("m,k,group,bits,tuning", [
    (5, 64, 32, 4, {"block_m": 16, "block_k": 32}),  # cols 2: two programs per layout block
    (20, 128, 64, 4, {"block_m": 16, "block_k": 32, "cols": 4}),  # two batch tiles
    (9, 128, 64, 4, {"block_m": 16, "block_k": 16, "cols": 1}),
    (7, 128, 128, 8, {"block_m": 16, "block_k": 64}),  # 8-bit: cols 2 is the whole int16
    (3, 64, 16, 8, {"block_m": 16, "block_k": 16, "cols": 1}),
    (33, 128, 128, 4, {"block_m": 64, "block_k": 64}),  # one group over K
])
def test_float32_equals_the_dequantized_product(m, k, group, bits, tuning):
    """In float32 the kernel's products are the dequantized weights' (exact in the tile's
    float32 arithmetic): equal to the reference but for the order of the sums."""
    n = 64 * 16 // bits
    packed, s, z = _weights(k, n, group, bits, dtype=torch.float32)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(DEVICE)
    out = swapab_large(x, packed, s, z, group, bits, num_warps=4, num_stages=2, **tuning)
    assert out.shape == (m, n) and out.dtype == torch.float32
    # Two float32 sums of the same K products in different orders differ by at most about
    # K * 2^-24 * sum |product| (a fixed atol failed about one run in ten at K = 128).
    w = dequantize_swapab(packed, s, z, group, bits, torch.float32)
    bound = k * 2.0**-24 * (x.abs() @ w.abs()) + 1e-7
    assert ((out - _ref(x, packed, s, z, group, bits)).abs() <= bound).all()


@pytest.mark.parametrize("bits,cols", [(4, 1), (4, 2), (4, 4), (8, 2)])
def test_float16_columns_of_every_value(bits, cols):
    """Each output column block comes from its own value of the int16s: a weight with one
    nonzero value per block puts its product in that block only."""
    k, n, group = 64, 2 * 64 * 16 // bits, 32
    q = torch.zeros(k, n, dtype=torch.int64)
    for b in range(n // 64):  # block b: a distinct row of K for each column block
        q[b, b * 64:(b + 1) * 64] = 1 + b % (2**bits - 1)
    packed = pack_swapab(q, bits).to(DEVICE)
    s = torch.ones(k // group, n, device=DEVICE).half()
    z = torch.zeros(k // group, n, device=DEVICE).half()
    x = torch.randn(4, k, device=DEVICE).half()
    out = swapab_large(x, packed, s, z, group, bits, block_m=16, block_k=32, cols=cols,
                       num_warps=4, num_stages=2)
    want = torch.stack([x[:, b].float() * (1 + b % (2**bits - 1))
                        for b in range(n // 64)], 1).repeat_interleave(64, 1)
    torch.testing.assert_close(out.float(), want, rtol=1e-3, atol=1e-3)


def test_scales_in_another_dtype_than_the_activations():
    """Checkpoints keep fp16 scales under bf16 (or float32) activations: the tile takes the
    activations' dtype. (The interpreter promotes mixed operands where the GPU compiler
    refused them: the engine's first GPU run, bf16 activations and fp16 scales, failed in
    tl.dot; test_engine_routing_gpu runs that case.)"""
    packed, s, z = _weights(128, 256, 64, 4, dtype=torch.bfloat16)
    x = torch.randn(6, 128, device=DEVICE)
    out = swapab_large(x, packed, s, z, 64, 4, block_m=16, block_k=32, num_warps=4,
                       num_stages=2)
    ref = x @ dequantize_swapab(packed, s.float(), z.float(), 64, 4, torch.float32)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    x16 = x.half()
    out16 = swapab_large(x16, packed, s, z, 64, 4, block_m=16, block_k=32, num_warps=4,
                         num_stages=2)
    assert out16.dtype == torch.float16
    assert rel_err(out16, _ref(x16, packed, s.half(), z.half(), 64, 4)) < 2e-3


def test_fills():
    from octavo.kernels.swapab_large import fills

    dev = torch.device("cpu")
    sms = __import__("octavo.kernels.triton_utils", fromlist=["x"]).num_compute_units(dev)
    assert fills(128 * sms, dev) and not fills(128 * sms - 128, dev)
    assert fills(64 * sms, dev, cols=1)


def test_float16_against_the_reference():
    packed, s, z = _weights(256, 512, 64, 4)
    x = torch.randn(40, 256, device=DEVICE).half()
    out = swapab_large(x, packed, s, z, 64, 4, block_m=32, block_k=64, num_warps=4,
                       num_stages=2)
    assert out.dtype == torch.float16 and rel_err(out, _ref(x, packed, s, z, 64, 4)) < 2e-3


def test_plan_switch(monkeypatch):
    from octavo import envs

    monkeypatch.delenv("OCTAVO_INT_LARGE_PLAN", raising=False)
    assert envs.int_large_plan() == {}
    monkeypatch.setenv("OCTAVO_INT_LARGE_PLAN", "128,4,8,64,3")
    assert envs.int_large_plan() == {"block_m": 128, "cols": 4, "num_warps": 8, "block_k": 64,
                                     "num_stages": 3}
    for bad in ("128,4,8", "a,b,c,d,e"):
        monkeypatch.setenv("OCTAVO_INT_LARGE_PLAN", bad)
        with pytest.raises(ValueError, match="OCTAVO_INT_LARGE_PLAN"):
            envs.int_large_plan()


GPU_SHAPES = [(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096)]  # Llama-8B qkv o gate_up down


@pytest.mark.gpu
@pytest.mark.parametrize("tuning", [{}, {"cols": 1}, {"cols": 4, "block_m": 128, "num_warps": 4},
                                    {"block_k": 64, "num_stages": 3}, {"block_m": 128}],
                         ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()) or "default")
@pytest.mark.parametrize("m", [129, 200, 256, 300])
@pytest.mark.parametrize("k,n", GPU_SHAPES)
def test_llama_shapes_gpu(k, n, m, tuning):
    packed, s, z = _weights(k, n, 128, 4, device=torch.device("cuda"), dtype=torch.bfloat16)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    out = swapab_large(x, packed, s, z, 128, 4, **tuning)
    assert rel_err(out, _ref(x, packed, s, z, 128, 4)) < 5e-3


@pytest.mark.gpu
@pytest.mark.parametrize("bits,dtype", [(8, torch.bfloat16), (4, torch.float16),
                                        (8, torch.float16)])
def test_bits_and_dtypes_gpu(bits, dtype):
    packed, s, z = _weights(4096, 4096, 128, bits, device=torch.device("cuda"), dtype=dtype)
    x = torch.randn(256, 4096, device="cuda", dtype=dtype)
    assert rel_err(swapab_large(x, packed, s, z, 128, bits), _ref(x, packed, s, z, 128, bits)) \
        < 5e-3


@pytest.mark.gpu
def test_inside_a_cuda_graph_gpu():
    packed, s, z = _weights(4096, 28672, 128, 4, device=torch.device("cuda"),
                            dtype=torch.bfloat16)
    x = torch.randn(256, 4096, device="cuda", dtype=torch.bfloat16)
    check_graph_replays(lambda x: swapab_large(x, packed, s, z, 128, 4),
                        lambda x: _ref(x, packed, s, z, 128, 4), x)

@pytest.mark.gpu
def test_engine_routing_gpu(monkeypatch):
    """int_weight_layout sends swap-AB batches past the swap-AB GEMM's rows, up to
    OCTAVO_INT_LARGE_MAX_M, here on layers whose tiles fill the SMs; past it (while it is 0,
    and on narrower layers) to dequantize-then-cuBLAS."""
    from octavo.kernels import int_weight_layout
    from octavo.kernels import swapab_large as module

    packed, s, z = _weights(1024, 28672, 128, 4, device=torch.device("cuda"),
                            dtype=torch.float16)  # fp16 scales under bf16 activations
    small = _weights(1024, 4096, 128, 4, device=torch.device("cuda"), dtype=torch.bfloat16)
    calls = record_rows(monkeypatch, module, "swapab_large")
    monkeypatch.delenv("OCTAVO_INT_LARGE_MAX_M", raising=False)  # the default: 256 rows
    monkeypatch.setenv("OCTAVO_INT_LARGE_CUDA", "0")  # the Triton kernel, not the CUDA one
    monkeypatch.delenv("OCTAVO_INT_LARGE_PLAN", raising=False)  # the default tile
    for m in (64, 129, 256, 300):
        x = torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16)
        got = int_weight_layout.linear(x, packed, s, z, 128, 4, int_weight_layout.SWAPAB)
        assert rel_err(got, x @ dequantize_swapab(packed, s, z, 128, 4, x.dtype)) < 1e-2
    assert calls == [129, 256]
    x = torch.randn(200, 1024, device="cuda", dtype=torch.bfloat16)
    got = int_weight_layout.linear(x, *small, 128, 4, int_weight_layout.SWAPAB)
    assert rel_err(got, _ref(x, *small, 128, 4)) < 1e-2 and calls == [129, 256]  # too few tiles
    monkeypatch.setenv("OCTAVO_INT_LARGE_MAX_M", "0")  # off
    int_weight_layout.linear(x, packed, s, z, 128, 4, int_weight_layout.SWAPAB)
    assert calls == [129, 256]
