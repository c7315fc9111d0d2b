"""The FP8 x FP8 decode GEMM (octavo/kernels/e4m3_mma.py, cuda/e4m3_mma.cu) on the GPU:
against the float64 reference of the same quantization rule (fp8_quant's, bit for bit: the
quantized activations are compared exactly through a unit weight), every batch of 1-8 rows,
both activation types, every scale rule, every plan, graph replays, and the FP8 layers'
routing. The CPU side (the plan, the build, the mapping emulated lane by lane) is
test_e4m3_mma.py."""

from __future__ import annotations

import functools

import pytest
import torch

from octavo.kernels import cuda_module, e4m3_mma
from octavo.kernels.e4m3_mma import FP8, e4m3_mma_ref
from tests.kernels.test_dense_mma import REAL_SHAPES, _rel_rows

gpu = pytest.mark.skipif(not torch.cuda.is_available()
                         or torch.cuda.get_device_capability() < (8, 9)
                         or cuda_module.module(e4m3_mma.SOURCE, torch.device("cuda")) is None,
                         reason="needs an NVIDIA GPU of compute capability 8.9+ and nvcc")
pytestmark = [pytest.mark.gpu, gpu]

SHAPES = REAL_SHAPES + [(64, 256), (48, 128), (16, 128), (160, 4224)]


@functools.cache
def _weights(n, k):
    from octavo.quantization.fp8 import quantize_fp8

    g = torch.Generator(device="cuda").manual_seed(n * 7 + k)
    w = torch.randn(n, k, device="cuda", generator=g) / k ** 0.5
    q, s = quantize_fp8(w, per_channel=True)
    return q, s.contiguous()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n,k", SHAPES)
def test_matches_the_reference_at_every_batch(n, k, dtype):
    if k % 128:
        pytest.skip("K not a multiple of two steps")
    q, s = _weights(n, k)
    for m in range(1, 9):
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        out = e4m3_mma.e4m3_mma(x, q, s)
        assert out.dtype == dtype and out.shape == (m, n)
        assert torch.isfinite(out).all(), m
        # float32 sums of exact fp8 products, then the output's rounding (bf16 2**-9); a
        # wrong row, column or quantization gives errors of order 1
        ref = e4m3_mma_ref(x, q, s)
        assert _rel_rows(out, ref) < (8e-3 if dtype == torch.bfloat16 else 2e-3), (m, n, k)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rule", ["token-clamp", "token-replace", "tensor-clamp",
                                  "tensor-replace", "static"])
def test_the_quantized_activations_are_fp8_quant_s_bit_for_bit(dtype, rule):
    """Through a weight of one 1.0 per row (row n picks x[n]) with unit scales, the output is
    the quantized activation times its scale: equal to fp8_quant_ref's, every element, for
    every scale rule, rows of zeros and values past the clamp included."""
    from octavo.kernels.fp8_quant import fp8_quant_ref

    k = n = 1024
    eye = torch.eye(n, k, device="cuda").to(FP8)
    ones = torch.ones(n, device="cuda")
    x = torch.randn(4, k, device="cuda", dtype=torch.float32) * torch.tensor(
        [[1.0], [1e-3], [0.0], [300.0]], device="cuda")
    x = x.to(dtype)
    static = torch.tensor([0.37], device="cuda") if rule == "static" else None
    per_tensor = rule.startswith("tensor")
    small = "replace" if rule.endswith("replace") else "clamp"
    min_scale = 1e-12 if small == "clamp" else torch.finfo(torch.float32).eps
    out = e4m3_mma.e4m3_mma(x, eye, ones, static, min_scale, small, per_tensor)
    if per_tensor:
        amax = x.float().abs().amax().reshape(1, 1) / 448.0
        scale = amax.clamp(min=min_scale) if small == "clamp" else amax
        xq, xs = fp8_quant_ref(x, scale, min_scale, small)
    else:
        xq, xs = fp8_quant_ref(x, static, min_scale, small)
    want = (xq.float() * xs).to(dtype)
    assert torch.equal(out, want), (out - want).abs().max()


@pytest.mark.parametrize("m", [1, 2, 5, 8])
@pytest.mark.parametrize("per_sm,steps", [(1, 2), (4, 4), (16, 4), (24, 2), (64, 8), (8, 8)])
def test_every_plan_gives_the_same_answer(m, per_sm, steps):
    from octavo.kernels import split_k

    q, s = _weights(1024, 2048)
    x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)
    run = functools.partial(e4m3_mma.e4m3_mma, x, q, s, warps_per_sm=per_sm, steps=steps)
    out = run()
    base = e4m3_mma.e4m3_mma(x, q, s, warps_per_sm=4, steps=2)
    assert _rel_rows(out, e4m3_mma_ref(x, q, s)) < 8e-3
    assert torch.allclose(out.float(), base.float(), rtol=1e-2, atol=1e-3)
    assert torch.equal(run(), out)  # the split sums in a fixed order
    torch.cuda.synchronize()
    assert not split_k.counters(x.device, 1).any()


def test_strided_rows_and_graph_replays():
    from tests.quantization.gemm_checks import check_graph_replays

    q, s = _weights(4096, 1024)
    wide = torch.randn(6, 1024 + 64, device="cuda", dtype=torch.bfloat16)
    view = wide[:, 64:]
    assert torch.equal(e4m3_mma.e4m3_mma(view, q, s), e4m3_mma.e4m3_mma(view.contiguous(), q, s))
    x = torch.randn(5, 1024, device="cuda", dtype=torch.bfloat16)
    check_graph_replays(lambda xx: e4m3_mma.e4m3_mma(xx, q, s),
                        lambda xx: e4m3_mma_ref(xx, q, s).float(), x)


def test_fp8_layers_route_decode_rows(monkeypatch):
    """With OCTAVO_E4M3_MMA on, FP8 layers send batches of up to OCTAVO_E4M3_MMA_MAX_M rows
    here (their own scale rule); off, None (the other paths)."""
    from octavo.quantization import fp8_linear

    q, s = _weights(1024, 2048)
    calls = []
    real = e4m3_mma.e4m3_mma
    monkeypatch.setattr(e4m3_mma, "e4m3_mma",
                        lambda x2, *a, **kw: calls.append(x2.shape[0]) or real(x2, *a, **kw))
    x1 = torch.randn(1, 2048, device="cuda", dtype=torch.bfloat16)
    monkeypatch.delenv("OCTAVO_E4M3_MMA", raising=False)
    monkeypatch.setenv("OCTAVO_E4M3_MMA", "1")
    for m in (1, 2, 3):
        x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)
        y = fp8_linear.e4m3_mma(x, q, s.view(1, -1), None, 1e-12, "clamp")
        if m > fp8_linear.E4M3_MMA_MAX_M:
            assert y is None
        else:
            assert _rel_rows(y, e4m3_mma_ref(x, q, s)) < 8e-3
    assert calls == [1, 2]
    monkeypatch.setenv("OCTAVO_E4M3_MMA", "0")
    assert fp8_linear.e4m3_mma(x1, q, s, None, 1e-12, "clamp") is None


@pytest.mark.parametrize("eager", [True, False])
def test_engine_fp8_decode_through_the_kernel(tmp_path, monkeypatch, eager):
    """A Qwen3 (random weights) quantized at load to fp8 decodes greedily through this kernel
    (calls counted) with the logprobs of torch._scaled_mm at every batch (the same W8A8
    rounding of the activations), step by step while they agree."""
    import json

    from tests.kernels import cuda_checks
    from tests.kernels.test_dense_mma_fp8 import _liven_fp8

    config = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 512,
              "intermediate_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 8,
              "num_key_value_heads": 4, "head_dim": 64, "vocab_size": 2048,
              "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
              "tie_word_embeddings": False, "torch_dtype": "bfloat16",
              "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    calls = []
    real = e4m3_mma.e4m3_mma
    monkeypatch.setattr(e4m3_mma, "e4m3_mma",
                        lambda x2, *a, **kw: calls.append(x2.shape[0]) or real(x2, *a, **kw))

    def run(on: bool, enforce_eager: bool):
        monkeypatch.setenv("OCTAVO_E4M3_MMA", "1" if on else "0")
        monkeypatch.setenv("OCTAVO_E4M3_MMA_MAX_M", "8")
        monkeypatch.setenv("OCTAVO_FP8_GEMV", "0")  # off: _scaled_mm at every batch
        monkeypatch.setenv("OCTAVO_CUDA_FP8", "0")
        monkeypatch.setenv("OCTAVO_CUDA_DENSE", "0")
        return cuda_checks.greedy_decode(tmp_path, _liven_fp8, enforce_eager)

    default_out = run(False, True)
    assert not calls
    kernel_out = run(True, eager)
    assert calls and max(calls) <= 8
    assert cuda_checks.compare_decodes(default_out, kernel_out) >= 3 * len(cuda_checks.PROMPTS)
