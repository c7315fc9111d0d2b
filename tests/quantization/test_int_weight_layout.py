"""Per-layer packed layouts of the integer weight-only methods (octavo/kernels/
int_weight_layout.py): the choice, the swap-AB layout's dispatch by batch size (its GEMM, or
dequantize-then-matmul) and a GPTQ layer that takes it. Kernels run in Triton's interpreter on
the CPU (float32: the interpreter's bf16 dot is wrong), at real shapes on the GPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from octavo.kernels import int_weight_layout as layout  # noqa: E402
from octavo.kernels.w4a16_gemm import dequantize_ref, pack_along_k, w4a16_gemm_ref  # noqa: E402
from octavo.kernels.w4a16_swapab import dequantize_swapab, pack_swapab  # noqa: E402
from tests.quantization.gemm_checks import rel_err  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _weights(k, n, group, bits, device=DEVICE, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 2**bits, (k, n), generator=g)
    scales = torch.rand(k // group, n, generator=g) * 0.02 + 0.001
    zeros = torch.randint(0, 2**bits + 1, (k // group, n), generator=g).float()
    return q, scales.to(device), zeros.to(device)


@pytest.mark.parametrize("k,n,group,bits", [(128, 256, 32, 4), (96, 128, 32, 8),
                                             (256, 512, 128, 4), (512, 256, 256, 8)])
def test_dequantize_swapab_equals_the_reference(k, n, group, bits):
    q, scales, zeros = _weights(k, n, group, bits)
    for dtype in (torch.float32, torch.float16):
        got = dequantize_swapab(pack_swapab(q, bits).to(DEVICE), scales, zeros, group, bits,
                                dtype)
        want = dequantize_ref(pack_along_k(q, bits).to(DEVICE), scales, zeros, group, bits,
                              dtype)
        assert got.dtype == dtype and torch.equal(got, want)


@pytest.mark.parametrize("m", [1, 5, 20, 130])  # 16-row tiles, 64-row tiles, dequantize
@pytest.mark.parametrize("bits", [4, 8])
def test_swapab_layout_linear_every_batch_size(m, bits):
    k, n, group = 128, 256, 32
    q, scales, zeros = _weights(k, n, group, bits)
    x = torch.randn(2, m, k, device=DEVICE)
    out = layout.linear(x, layout.pack(q, bits, layout.SWAPAB).to(DEVICE), scales, zeros,
                        group, bits, layout.SWAPAB)
    ref = w4a16_gemm_ref(x, pack_along_k(q, bits).to(DEVICE), scales, zeros, group, bits)
    assert out.shape == (2, m, n) and rel_err(out, ref) < 1e-5
    empty = layout.linear(x[:, :0], layout.pack(q, bits, layout.SWAPAB).to(DEVICE), scales,
                          zeros, group, bits, layout.SWAPAB)
    assert empty.shape == (2, 0, n)


@pytest.fixture
def hopper(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.delenv("OCTAVO_INT_WEIGHT_LAYOUT", raising=False)


def test_choice_by_device_size_and_shape(hopper, monkeypatch):
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(layout.swapab_mma, "available", lambda device: False)  # Triton only
    assert layout.choose(4096, 28672, 128, 4, cuda) == layout.SWAPAB  # gate_up
    assert layout.choose(14336, 4096, 128, 4, cuda) == layout.SWAPAB  # down
    assert layout.choose(4096, 6144, 128, 4, cuda) == layout.ALONG_K  # qkv: GEMV wins
    assert layout.choose(4096, 28672 + 8, 128, 4, cuda) == layout.ALONG_K  # N % 256
    assert layout.choose(4096, 28672, 128, 8, cuda) == layout.ALONG_K  # 8-bit g128
    assert layout.choose(4096, 6144, 128, 8, cuda) == layout.ALONG_K
    assert layout.choose(4096, 28672, 4096, 8, cuda) == layout.ROWS  # 8-bit per channel
    assert layout.choose(14336, 4096, 14336, 8, cuda) == layout.ROWS
    assert layout.choose(4096, 6144, 16, 8, cuda) == layout.ALONG_K  # a group under a step
    assert layout.choose(4096, 28672, 128, 4, torch.device("cpu")) == layout.ALONG_K
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert layout.choose(4096, 28672, 128, 4, cuda) == layout.ALONG_K


def test_small_4_bit_layers_take_the_swapab_layout_where_the_cuda_kernel_runs(hopper,
                                                                             monkeypatch):
    """Where the CUDA kernel runs, 4-bit layers from 2**24 weights (Llama-8B's qkv and o) take
    the swap-AB layout too (session 51: the kernel to 16 rows, then in chunks); smaller ones
    and 8-bit layers keep theirs."""
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(layout.swapab_mma, "available", lambda device: True)
    assert layout.choose(4096, 6144, 128, 4, cuda) == layout.SWAPAB  # qkv
    assert layout.choose(4096, 4096, 128, 4, cuda) == layout.SWAPAB  # o: 2**24
    assert layout.choose(4096, 4096 - 256, 128, 4, cuda) == layout.ALONG_K
    assert layout.choose(1024, 4096, 128, 4, cuda) == layout.ALONG_K  # Qwen3-0.6B's qkv
    assert layout.choose(4096, 4096, 128, 8, cuda) == layout.SWAPAB  # 8-bit g128 (session 63)
    assert layout.choose(4096, 4096, 4096, 8, cuda) == layout.ROWS  # 8-bit per channel
    assert layout.choose(4096, 28672, 128, 4, cuda) == layout.SWAPAB  # gate_up
    monkeypatch.setattr(layout.swapab_mma, "available", lambda device: False)
    assert layout.choose(4096, 4096, 128, 4, cuda) == layout.ALONG_K
    monkeypatch.setenv("OCTAVO_INT_WEIGHT_LAYOUT", "swapab")
    assert layout.choose(4096, 4096, 128, 4, cuda) == layout.SWAPAB


def test_8_bit_weights_take_the_size_rule_on_request(hopper, monkeypatch):
    """OCTAVO_INT_SWAPAB_8BIT=1: large 8-bit weights go to the swap-AB layout without the
    CUDA kernel too, small ones stay in the GEMV's (per channel too, not rows); 4-bit is
    unaffected."""
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(layout.swapab_mma, "available", lambda device: False)
    monkeypatch.setenv("OCTAVO_INT_SWAPAB_8BIT", "1")
    assert layout.choose(4096, 28672, 128, 8, cuda) == layout.SWAPAB  # gate_up
    assert layout.choose(14336, 4096, 128, 8, cuda) == layout.SWAPAB  # down
    assert layout.choose(4096, 6144, 128, 8, cuda) == layout.ALONG_K  # qkv
    assert layout.choose(4096, 6144, 128, 4, cuda) == layout.ALONG_K  # 4-bit qkv: no kernel
    assert layout.choose(4096, 28672, 128, 4, cuda) == layout.SWAPAB
    assert layout.choose(4096, 28672, 4096, 8, cuda) == layout.SWAPAB  # not rows
    monkeypatch.setenv("OCTAVO_INT_SWAPAB_8BIT", "0")
    assert layout.choose(4096, 28672, 128, 8, cuda) == layout.ALONG_K


def test_8_bit_weights_take_the_swapab_layout_where_the_cuda_kernel_runs(hopper, monkeypatch):
    """8-bit layers of at least 2**24 weights take the swap-AB layout on Hopper where the CUDA
    kernel runs (H100, session 63, W8A16 every layer swap-AB against the GEMV layout, ms per
    token: batch 1 3.509 / 3.807, 48 6.711 / 6.645, 128 10.770 / 11.364, W2 6,851 / 6,503
    tok/s); small layers, per-channel weights (rows), and GPUs without the kernel or not
    Hopper keep theirs; 4-bit keeps its size rule."""
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(layout.swapab_mma, "available", lambda device: True)
    assert layout.choose(4096, 28672, 128, 8, cuda) == layout.SWAPAB  # gate_up
    assert layout.choose(14336, 4096, 128, 8, cuda) == layout.SWAPAB  # down
    assert layout.choose(4096, 6144, 128, 8, cuda) == layout.SWAPAB  # qkv
    assert layout.choose(4096, 4096, 128, 8, cuda) == layout.SWAPAB  # o: 2**24
    assert layout.choose(4096, 4096 - 256, 128, 8, cuda) == layout.ALONG_K
    assert layout.choose(1024, 2048, 128, 8, cuda) == layout.ALONG_K  # small
    assert layout.choose(4096, 28672, 4096, 8, cuda) == layout.ROWS  # per channel
    assert layout.choose(4096, 6144, 128, 4, cuda) == layout.SWAPAB
    assert layout.choose(1024, 2048, 128, 4, cuda) == layout.ALONG_K
    monkeypatch.setattr(layout.swapab_mma, "available", lambda device: False)
    assert layout.choose(4096, 28672, 128, 8, cuda) == layout.ALONG_K
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(layout.swapab_mma, "available", lambda device: True)
    assert layout.choose(4096, 28672, 128, 8, cuda) == layout.ALONG_K


def _routed_rows(monkeypatch):
    """A small 4-bit layer in the swap-AB layout (K 256, N 256: 4 columns per int16 row)
    whose kernels only note which one a batch reached: (run(*batch sizes), calls)."""
    calls = []
    monkeypatch.setattr(layout.swapab_mma, "available", lambda device: True)
    monkeypatch.setattr(layout.swapab_mma, "swapab_mma",
                        lambda x2, *a, **k: calls.append(("cuda", x2.shape[0])) or "cuda")
    monkeypatch.setattr(layout.swapab, "w4a16_swapab",
                        lambda x2, *a, **k: calls.append(("triton", x2.shape[0])) or "triton")
    q = torch.zeros(64, 256, dtype=torch.int16)
    s = torch.ones(2, 256, dtype=torch.bfloat16)

    def run(*ms):
        for m in ms:
            layout._swapab_rows(torch.zeros(m, 256, dtype=torch.bfloat16), q, s, s, 128, 4)

    return run, calls


def test_cuda_kernel_rows_capped_by_env(monkeypatch):
    """A large layer: batches above 16 rows (OCTAVO_CUDA_KERNELS_MAX_M) take the Triton
    swap-AB GEMM, and chunks only with OCTAVO_SWAPAB_CUDA_CHUNKED_LARGE_MAX_M."""
    monkeypatch.setattr(layout, "SMALL_WEIGHTS", 1)  # the test's layer counts as large
    run, calls = _routed_rows(monkeypatch)
    run(1, 8, 9, 16, 17, 40)
    monkeypatch.setenv("OCTAVO_CUDA_KERNELS_MAX_M", "8")
    run(1, 8, 9, 16, 40)
    monkeypatch.delenv("OCTAVO_CUDA_KERNELS_MAX_M")
    monkeypatch.setenv("OCTAVO_SWAPAB_CUDA_CHUNKED_LARGE_MAX_M", "32")  # chunks on request
    run(17, 32, 33)
    assert calls == [("cuda", 1), ("cuda", 8), ("cuda", 9), ("cuda", 16), ("triton", 17),
                     ("triton", 40),
                     ("cuda", 1), ("cuda", 8), ("triton", 9), ("triton", 16), ("triton", 40),
                     ("cuda", 17), ("cuda", 32), ("triton", 33)]


def test_small_layers_run_the_cuda_kernel_in_16_row_chunks(monkeypatch):
    """A small layer in the swap-AB layout runs the CUDA kernel to 16 rows, then in 16-row
    chunks of one launch up to 64 rows (OCTAVO_SWAPAB_CUDA_CHUNKED_MAX_M, at most 128); past
    it, or where OCTAVO_CUDA_KERNELS_SMALL_MAX_M stops the kernel short of 16 rows, the
    Triton GEMM."""
    run, calls = _routed_rows(monkeypatch)
    run(1, 16, 17, 40, 64, 65)
    monkeypatch.setenv("OCTAVO_CUDA_KERNELS_SMALL_MAX_M", "8")  # no chunks then
    run(8, 9, 40)
    monkeypatch.delenv("OCTAVO_CUDA_KERNELS_SMALL_MAX_M")
    monkeypatch.setenv("OCTAVO_SWAPAB_CUDA_CHUNKED_MAX_M", "1000")  # capped at 128
    run(128)
    monkeypatch.setenv("OCTAVO_INT_SWAPAB_MAX_M", "256")  # the Triton GEMM past the cap
    run(129)
    monkeypatch.setenv("OCTAVO_SWAPAB_CUDA_CHUNKED_MAX_M", "0")
    run(17)
    assert calls == [("cuda", 1), ("cuda", 16), ("cuda", 17), ("cuda", 40), ("cuda", 64),
                     ("triton", 65), ("cuda", 8), ("triton", 9), ("triton", 40),
                     ("cuda", 128), ("triton", 129), ("triton", 17)]


def test_triton_swapab_tiles_by_batch(monkeypatch):
    """Up to 16 rows 16-row tiles at eight programs' worth per SM; past 16, two."""
    tiles = []
    monkeypatch.setattr(layout.swapab_mma, "available", lambda device: False)
    monkeypatch.setattr(layout.swapab, "w4a16_swapab", lambda x2, *a, **k: tiles.append(k))
    q = torch.zeros(64, 256, dtype=torch.int16)
    s = torch.ones(2, 256, dtype=torch.bfloat16)
    for m in (1, 16, 17, 128):
        layout._swapab_rows(torch.zeros(m, 256, dtype=torch.bfloat16), q, s, s, 128, 4)
    assert tiles == [{"block_r": 16, "waves": 8}] * 2 + [{"waves": 2}] * 2


def test_8_bit_triton_swapab_tiles_where_the_tiles_fill_the_sms(monkeypatch):
    """8-bit layers past 32 rows whose 128-column tiles fill the SMs (gate_up) take 64-row
    batch tiles with 3 stages; fewer tiles (down), fewer rows, or 4 bits keep the rule."""
    tiles = []
    monkeypatch.setattr(layout.swapab_mma, "available", lambda device: False)
    monkeypatch.setattr(layout.swapab_large, "num_compute_units", lambda device: 4)
    monkeypatch.setattr(layout.swapab, "w4a16_swapab", lambda x2, *a, **k: tiles.append(k))
    s = torch.ones(2, 512, dtype=torch.bfloat16)
    wide = torch.zeros(256, 256, dtype=torch.int16)  # 8-bit, N = 512: 4 tiles of 128
    narrow = torch.zeros(192, 256, dtype=torch.int16)  # N = 384: 3 tiles
    for m in (32, 33, 128):
        layout._swapab_rows(torch.zeros(m, 256, dtype=torch.bfloat16), wide, s, s, 128, 8)
    layout._swapab_rows(torch.zeros(33, 256, dtype=torch.bfloat16), narrow, s[:, :384],
                        s[:, :384], 128, 8)
    four = torch.zeros(128, 256, dtype=torch.int16)  # 4-bit, N = 512: 2 tiles of 256
    monkeypatch.setattr(layout.swapab_large, "num_compute_units", lambda device: 2)
    layout._swapab_rows(torch.zeros(33, 256, dtype=torch.bfloat16), four, s, s, 128, 4)
    wide_tiles = {"block_m": 64, "num_stages": 3}
    assert tiles == [{"waves": 2}, wide_tiles, wide_tiles, {"waves": 2}, {"waves": 2}]


def test_8_bit_small_layers_chunk_to_32_rows_only(monkeypatch):
    """8-bit small layers (qkv, o) run the CUDA kernel's 16-row chunks to 32 rows, then the
    Triton GEMM (4-bit ones to 64: test_small_layers_run_the_cuda_kernel_in_16_row_chunks)."""
    calls = []
    monkeypatch.setattr(layout.swapab_mma, "available", lambda device: True)
    monkeypatch.setattr(layout.swapab_mma, "swapab_mma",
                        lambda x2, *a, **k: calls.append(("cuda", x2.shape[0])))
    monkeypatch.setattr(layout.swapab, "w4a16_swapab",
                        lambda x2, *a, **k: calls.append(("triton", x2.shape[0])))
    q = torch.zeros(128, 256, dtype=torch.int16)  # 8-bit, N = 256
    s = torch.ones(2, 256, dtype=torch.bfloat16)
    for m in (16, 32, 33, 64):
        layout._swapab_rows(torch.zeros(m, 256, dtype=torch.bfloat16), q, s, s, 128, 8)
    assert calls == [("cuda", 16), ("cuda", 32), ("triton", 33), ("triton", 64)]


def test_env_overrides_the_size_rule_not_the_shape(hopper, monkeypatch):
    cuda = torch.device("cuda", 0)
    monkeypatch.setenv("OCTAVO_INT_WEIGHT_LAYOUT", "swapab")
    assert layout.choose(4096, 4096, 128, 4, cuda) == layout.SWAPAB
    assert layout.choose(4096, 4096, 128, 8, cuda) == layout.SWAPAB
    assert layout.choose(4096, 4104, 128, 4, cuda) == layout.ALONG_K  # cannot hold it
    monkeypatch.setenv("OCTAVO_INT_WEIGHT_LAYOUT", "along_k")
    assert layout.choose(4096, 28672, 128, 4, cuda) == layout.ALONG_K
    assert layout.choose(4096, 28672, 128, 8, cuda) == layout.ALONG_K
    monkeypatch.setenv("OCTAVO_INT_WEIGHT_LAYOUT", "rows")  # 8-bit only, any group it holds
    assert layout.choose(4096, 4096, 128, 8, cuda) == layout.ROWS
    assert layout.choose(4096, 28672, 4096, 8, cuda) == layout.ROWS
    assert layout.choose(4096, 4096, 16, 8, cuda) == layout.ALONG_K  # a group under a step
    assert layout.choose(4096, 4096, 128, 4, cuda) == layout.ALONG_K
    monkeypatch.setenv("OCTAVO_INT_WEIGHT_LAYOUT", "marlin")
    with pytest.raises(ValueError, match="OCTAVO_INT_WEIGHT_LAYOUT.*marlin"):
        layout.choose(4096, 28672, 128, 4, cuda)


@pytest.mark.parametrize("bits,desc_act,chosen", [(4, True, layout.SWAPAB),
                                                  (8, False, layout.SWAPAB),
                                                  (8, True, layout.ROWS)])
def test_gptq_layer_in_the_chosen_layout(bits, desc_act, chosen, monkeypatch):
    """The method packs the layer in the chosen layout (act-order rows sorted first) and runs
    it through that layout's kernels."""
    from octavo.layers.linear import RowParallelLinear
    from octavo.quantization import int_weight
    from octavo.quantization.gptq import GPTQConfig
    from tests.quantization.packers import gptq_tensors, quantize

    if DEVICE.type == "cpu":  # the CUDA path forced onto CPU tensors (the interpreter runs it)
        monkeypatch.setattr(int_weight, "use_kernel", lambda device, k, g, b: True)
    monkeypatch.setattr(layout, "choose", lambda k, n, g, b, device: chosen)
    torch.manual_seed(0)
    w = torch.randn(256, 128)
    qz = quantize(w, bits, 32, False, act_order=desc_act)
    cfg = GPTQConfig(bits=bits, group_size=32, desc_act=desc_act, sym=False)
    layer = RowParallelLinear(128, 256, quant_config=cfg, prefix="model.layers.0.mlp.down_proj")
    layer.to(DEVICE)
    for name, t in gptq_tensors(qz, bits).items():
        param = getattr(layer, name)
        param.weight_loader(param, t.to(DEVICE))
    layer.process_weights_after_loading()
    assert layer.kernel_layout == chosen
    # The rotating store: rows only, on the FP8 GEMV's own K steps (not 32-wide groups).
    assert not layer.quant_method.has_qkv_rope
    assert layout.int8_gemv.runs_full_steps(256, 128, 128)  # one group per row would claim it
    assert layer.qweight_kernel.dtype == (torch.int16 if chosen == layout.SWAPAB else torch.uint8)
    for m in (1, 2, 130):
        x = torch.randn(m, 128, device=DEVICE)
        torch.testing.assert_close(layer(x), F.linear(x, qz.dequantize().to(DEVICE)),
                                   atol=1e-4, rtol=1e-4)


def _check_real_shape_gpu(k: int, n: int, bits: int, m: int, group: int = 128) -> None:
    """``linear`` on a [K, N] weight in the swap-AB layout against the reference, M rows."""
    q, scales, zeros = _weights(k, n, group, bits, device=torch.device("cuda"))
    scales, zeros = scales.bfloat16(), zeros.bfloat16()
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    out = layout.linear(x, layout.pack(q, bits, layout.SWAPAB).cuda(), scales, zeros, group,
                        bits, layout.SWAPAB)
    ref = w4a16_gemm_ref(x, pack_along_k(q, bits).cuda(), scales, zeros, group, bits)
    assert out.shape == (m, n) and rel_err(out, ref) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 3, 16, 32, 33, 128, 256])
@pytest.mark.parametrize("bits", [4, 8])
def test_real_shape_every_batch_size_gpu(m, bits):
    _check_real_shape_gpu(14336, 4096, bits, m)  # down's shape


@pytest.mark.gpu
@pytest.mark.parametrize("m", [33, 48, 128])
def test_8_bit_wide_tiles_real_shape_gpu(m):
    """gate_up's shape at 8 bits past 32 rows (64-row batch tiles, 3 stages)."""
    _check_real_shape_gpu(4096, 28672, 8, m)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [17, 40, 64, 65])
def test_small_layer_in_16_row_launches_gpu(m):
    """The default chunks (to 64 rows) with the kernel at 16 rows on small layers: qkv's
    shape in the swap-AB layout, past and within the chunked rows."""
    _check_real_shape_gpu(4096, 6144, 4, m)
