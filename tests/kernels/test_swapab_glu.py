"""The MLP's activation in the CUDA 4- and 8-bit decode kernel's store (``swapab_mma(glu=True)``,
``OCTAVO_SWAPAB_GLU``): the [gate | up] weight's columns in ``glu_blocked`` order, the
kernel's gated store mapping, the blocked activation of larger batches, and on the GPU the
same outputs as the plain store followed by ``silu_and_mul``."""

from __future__ import annotations

import pytest
import torch

from octavo.kernels import int_weight_layout, swapab_mma
from octavo.kernels.activation import silu_and_mul_ref
from octavo.kernels.w4a16_swapab import glu_blocked
from tests.kernels import cuda_checks


@pytest.mark.parametrize("n,block", [(256, 128), (1024, 128), (28672, 128), (96, 16)])
def test_blocked_order_is_gate_then_up_in_turn_and_undone(n, block):
    cols = glu_blocked(n, block)
    inter = n // 2
    assert sorted(cols.tolist()) == list(range(n))
    for b in range(inter // block):
        assert cols[2 * b * block:(2 * b + 1) * block].tolist() == list(
            range(b * block, (b + 1) * block))
        assert cols[(2 * b + 1) * block:(2 * b + 2) * block].tolist() == list(
            range(inter + b * block, inter + (b + 1) * block))
    y = torch.randn(3, n)
    assert torch.equal(int_weight_layout.glu_unblocked(y[:, cols], block), y)
    assert torch.equal(silu_and_mul_ref(y[:, cols], block), silu_and_mul_ref(y))


@pytest.mark.parametrize("n,block", [(255, 128), (384, 128), (100, 64)])
def test_a_weight_not_in_whole_blocks_is_refused(n, block):
    with pytest.raises(ValueError, match=f"N={n}"):
        glu_blocked(n, block)


@pytest.mark.parametrize("bits", [4, 8])
def test_the_gated_store_writes_every_output_once_from_its_gate_and_up(bits):
    """The store's columns, transcribed from the source: each lane's gate values c < VALUES / 2
    and up values c + VALUES / 2 of its two int16 rows (4-bit: 4 values, 8-bit: 2) are the
    same MLP column under ``glu_blocked`` in blocks of ``GLU_BLOCKS[bits]``, written at that
    column; every column of [M, N / 2] is written exactly once."""
    text = cuda_checks.source_text(swapab_mma.SOURCE)
    assert "const int col = (nb / (64 * VALUES)) * (32 * VALUES) + nb % (64 * VALUES);" in text
    assert "out[(size_t)m * half_n + col + 64 * c]" in text
    assert f"_w{bits}_m8_s4_glu" in text and f"_w{bits}_m16_s4_glu" in text
    n, values = 2048, 16 // bits
    inter = n // 2
    cols = glu_blocked(n, swapab_mma.GLU_BLOCKS[bits])  # stored column j holds cols[j]
    written = []
    for tile in range(n // (16 * values)):
        for g in range(8):
            for row in (tile * 16 + g, tile * 16 + g + 8):
                nb = cuda_checks.swapab_column(row, bits)
                col = (nb // (64 * values)) * (32 * values) + nb % (64 * values)
                for c in range(values // 2):
                    gate, up = nb + 64 * c, nb + 64 * (c + values // 2)
                    assert cols[gate] == col + 64 * c
                    assert cols[up] == inter + col + 64 * c
                    written.append(col + 64 * c)
    assert sorted(written) == list(range(inter))


def test_supports_glu():
    ok = dict(m=1, k=4096, n=28672, group_size=128, bits=4, dtype=torch.bfloat16)
    assert swapab_mma.supports_glu(**ok)
    assert swapab_mma.supports_glu(**{**ok, "m": 16, "dtype": torch.float16})
    assert swapab_mma.supports_glu(**{**ok, "group_size": 4096})
    assert swapab_mma.supports_glu(**{**ok, "bits": 8})
    assert swapab_mma.supports_glu(**{**ok, "bits": 8, "n": 28672 + 128})  # 64-column blocks
    for bad in ({"m": 17}, {"m": 0}, {"bits": 2}, {"group_size": 64}, {"n": 28672 + 128},
                {"bits": 8, "n": 28672 + 64}, {"dtype": torch.float32}):
        assert not swapab_mma.supports_glu(**{**ok, **bad}), bad
    assert int_weight_layout.glu_block(4096, 28672, 128, 4) == swapab_mma.GLU_BLOCKS[4] == 128
    assert int_weight_layout.glu_block(4096, 28672, 128, 8) == swapab_mma.GLU_BLOCKS[8] == 64
    assert int_weight_layout.glu_block(4096, 28672, 64, 4) is None
    assert int_weight_layout.glu_block(4096, 28672, 64, 8) is None
    assert int_weight_layout.glu_block(4096, 28672 + 128, 128, 4) is None


def test_the_switch_is_on_by_default_to_8_rows(monkeypatch):
    from octavo import envs

    monkeypatch.delenv("OCTAVO_SWAPAB_GLU", raising=False)
    monkeypatch.delenv("OCTAVO_SWAPAB_GLU_MAX_M", raising=False)
    assert envs.swapab_glu() is True
    assert envs.swapab_glu_max_m(int_weight_layout.GLU_MAX_M) == 8
    monkeypatch.setenv("OCTAVO_SWAPAB_GLU", "0")
    assert envs.swapab_glu() is False


def test_silu_and_mul_over_blocked_columns(device):
    pytest.importorskip("triton")
    from octavo.kernels.activation import silu_and_mul

    x = (torch.randn(3, 2 * 512, device=device) * 3).to(torch.bfloat16)
    out = silu_and_mul(x, 128)
    assert out.shape == (3, 512)
    torch.testing.assert_close(out, silu_and_mul_ref(x, 128), atol=2e-2, rtol=2e-2)
    assert torch.equal(silu_and_mul(x, 512), silu_and_mul(x))  # one block: the halves


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("on", [True, False])
def test_a_gptq_gate_up_layer_loads_blocked_and_still_computes_gate_then_up(on, bits,
                                                                             monkeypatch):
    """The loader's side on CPU tensors (the CUDA path forced, as test_int_weight_layout
    does): with the switch on, a 4- or 8-bit g128 [gate | up] layer in the swap-AB layout keeps its
    packed values, scales and zeros in ``glu_blocked`` order; its plain forward still gives
    [gate | up], and the engine's gated entry the activation of it. A down projection (one
    part) and the switch off are left alone."""
    pytest.importorskip("triton")
    from octavo.layers.linear import MergedColumnParallelLinear, RowParallelLinear
    from octavo.quantization import int_weight
    from octavo.quantization.gptq import GPTQConfig
    from tests.quantization.packers import gptq_tensors, quantize

    monkeypatch.setenv("OCTAVO_SWAPAB_GLU", "1" if on else "0")
    monkeypatch.setattr(int_weight, "use_kernel", lambda device, k, g, b: True)
    monkeypatch.setattr(int_weight_layout, "choose", lambda k, n, g, b, d: "swapab")
    cfg = GPTQConfig(bits=bits, group_size=128, desc_act=False, sym=False)
    torch.manual_seed(0)
    layer = MergedColumnParallelLinear(256, [256, 256], quant_config=cfg,
                                       prefix="model.layers.0.mlp.gate_up_proj")
    parts = {i: quantize(torch.randn(256, 256), bits, 128, False, seed=i) for i in (0, 1)}
    for sid, qz in parts.items():
        for name, t in gptq_tensors(qz, bits).items():
            getattr(layer, name).weight_loader(getattr(layer, name), t, sid)
    layer.process_weights_after_loading()
    block = swapab_mma.GLU_BLOCKS[bits]
    assert layer.glu_block == (block if on else None)
    dense = torch.cat([parts[0].dequantize(), parts[1].dequantize()])  # [512, 256]
    stored = dense if not on else dense[glu_blocked(512, block)]
    from octavo.kernels.w4a16_swapab import dequantize_swapab

    got = dequantize_swapab(layer.qweight_kernel, layer.scales_kernel, layer.zeros_kernel, 128,
                            bits, torch.float32)  # [K, N] as stored
    torch.testing.assert_close(got.t(), stored, atol=1e-6, rtol=1e-6)
    x = torch.randn(3, 256)
    ref = torch.nn.functional.linear(x, dense)
    torch.testing.assert_close(layer(x), ref, atol=1e-4, rtol=1e-4)
    if on:
        h = int_weight_layout.gated_blocked(x, layer.qweight_kernel, layer.scales_kernel,
                                            layer.zeros_kernel, 128, bits, layer.glu_block)
        torch.testing.assert_close(h, silu_and_mul_ref(ref), atol=1e-3, rtol=1e-3)
    down = RowParallelLinear(256, 256, quant_config=cfg, prefix="model.layers.0.mlp.down_proj")
    for name, t in gptq_tensors(parts[0], bits).items():
        getattr(down, name).weight_loader(getattr(down, name), t)
    down.process_weights_after_loading()
    assert down.glu_block is None


# --- on the GPU ---------------------------------------------------------------------------

gpu = cuda_checks.needs_build(swapab_mma.SOURCE)


def _blocked_case(m, k, n, dtype, scale_dtype, seed=0, bits=4):
    from octavo.kernels.w4a16_swapab import pack_swapab

    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 1 << bits, (k, n), generator=g)
    scales = (torch.rand(k // 128, n, generator=g) * 0.02 / (1 << (bits - 4))
              + 0.001).to(scale_dtype)
    zeros = torch.randint(0, (1 << bits) + 1, (k // 128, n), generator=g).to(scale_dtype)
    x = torch.randn(m, k, generator=g).to(dtype)
    cols = glu_blocked(n, swapab_mma.GLU_BLOCKS[bits])
    plain = (pack_swapab(q, bits).cuda(), scales.cuda(), zeros.cuda())
    blocked = (pack_swapab(q[:, cols], bits).cuda(), scales[:, cols].cuda(),
               zeros[:, cols].cuda())
    return x.cuda(), plain, blocked


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype,scale_dtype", [(torch.bfloat16, torch.bfloat16),
                                               (torch.bfloat16, torch.float16),
                                               (torch.float16, torch.float16)])
@pytest.mark.parametrize("m", [1, 2, 5, 8, 9, 16])
@pytest.mark.parametrize("per_sm", [6, 200, 1])
@pytest.mark.parametrize("bits", [4, 8])
def test_the_gated_store_is_the_plain_store_s_activation_gpu(dtype, scale_dtype, m, per_sm,
                                                             bits):
    """Against the plain kernel on the unblocked weight, then ``silu_and_mul``: gate and up
    are rounded to the dtype in both, so only the exponential's and the division's last bits
    may differ; every ticket counter back at zero (K split over CTAs at per_sm 200)."""
    from octavo.kernels import split_k
    from octavo.kernels.activation import silu_and_mul

    x, plain, blocked = _blocked_case(m, 2048, 2048, dtype, scale_dtype, seed=m, bits=bits)
    ref = silu_and_mul(swapab_mma.swapab_mma(x, *plain, 128, bits, warps_per_sm=per_sm))
    out = swapab_mma.swapab_mma(x, *blocked, 128, bits, warps_per_sm=per_sm, glu=True)
    assert out.shape == (m, 1024) and out.dtype == dtype
    torch.testing.assert_close(out, ref, atol=1e-3, rtol=1e-2)
    assert (out != ref).float().mean().item() < 0.02  # a last-bit difference here and there
    torch.cuda.synchronize()
    assert not split_k.counters(x.device, 1).any()


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("m", [1, 16, 17, 64, 200])
@pytest.mark.parametrize("bits", [4, 8])
def test_gated_blocked_at_every_batch_gpu(m, bits):
    """The engine's entry: the kernel's store to 8 rows, the blocked activation above it, both
    the activation of the plain projection; graph replays give the same bits."""
    from octavo.kernels.activation import silu_and_mul

    x, plain, blocked = _blocked_case(m, 4096, 4096, torch.bfloat16, torch.float16, seed=7,
                                      bits=bits)
    block = swapab_mma.GLU_BLOCKS[bits]
    ref = silu_and_mul(int_weight_layout.linear(x, *plain, 128, bits,
                                                int_weight_layout.SWAPAB))
    out = int_weight_layout.gated_blocked(x, *blocked, 128, bits, block)
    assert out.shape == (m, 2048)
    torch.testing.assert_close(out, ref, atol=1e-3, rtol=1e-2)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = int_weight_layout.gated_blocked(x, *blocked, 128, bits, block)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, out)


@pytest.mark.gpu
@gpu
def test_engine_decode_with_the_gated_store_matches_it_off_gpu(tmp_path, monkeypatch):
    """A bf16 GPTQ 4-bit Llama decodes through the gated store (calls counted) with the
    logprobs of the engine without it. Dummy weights: the packed values are seeded per
    checkpoint parameter, so both engines hold the same integers before the reordering."""
    cuda_checks.gptq_llama(tmp_path, group_size=128)
    monkeypatch.setenv("OCTAVO_INT_WEIGHT_LAYOUT", "swapab")
    cuda_checks.check_switch_decodes(tmp_path, monkeypatch, swapab_mma, "swapab_mma",
                                     "OCTAVO_SWAPAB_GLU", lambda kw: kw.get("glu", False))


@pytest.mark.gpu
@gpu
def test_the_gated_store_stops_at_its_row_cap_gpu(monkeypatch):
    """OCTAVO_SWAPAB_GLU_MAX_M: past it, the plain store and the blocked activation (the
    kernel is called without ``glu``), with the same values."""
    from octavo.kernels.activation import silu_and_mul

    monkeypatch.setenv("OCTAVO_SWAPAB_GLU_MAX_M", "8")
    real, glus = swapab_mma.swapab_mma, []
    monkeypatch.setattr(swapab_mma, "swapab_mma",
                        lambda *a, **kw: glus.append(kw.get("glu", False)) or real(*a, **kw))
    for m, fused in ((8, True), (9, False), (16, False)):
        x, plain, blocked = _blocked_case(m, 4096, 4096, torch.bfloat16, torch.float16, seed=m)
        ref = silu_and_mul(int_weight_layout.linear(x, *plain, 128, 4, int_weight_layout.SWAPAB))
        glus.clear()
        out = int_weight_layout.gated_blocked(x, *blocked, 128, 4, swapab_mma.GLU_BLOCKS[4])
        assert glus and glus[-1] is fused, (m, glus)
        torch.testing.assert_close(out, ref, atol=1e-3, rtol=1e-2)
