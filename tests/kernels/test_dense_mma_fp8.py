"""The CUDA float GEMM's float8 weights (octavo/kernels/dense_mma.py's FP8_VARIANTS,
cuda/dense_mma.cuh's Weights<T, E4m3>, built from cuda/dense_mma_fp8.cu): the launch plan, the e4m3 conversion's bit placement
for every code, the operand mapping emulated lane by lane on the CPU for both activation
types; on the GPU against the float64 reference (every batch 1-32, every code, plans, graph
replays) and through the FP8 layers of the engine."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from octavo.kernels import cuda_module, dense_mma
from octavo.kernels.dense_mma import FP8, FP8_VARIANTS, plan, supports
from tests.kernels import cuda_checks
from tests.kernels.cuda_checks import G, T
from tests.kernels.cuda_checks import mma16816 as _mma
from tests.kernels.test_dense_mma import FP8_NAMES, REAL_SHAPES, _liven, _rel_rows


@pytest.mark.parametrize("n,k", REAL_SHAPES + [(64, 256), (48, 192), (16, 64), (160, 4160)])
@pytest.mark.parametrize("m", [1, 8, 9, 16, 17, 32])
@pytest.mark.parametrize("sms,per_sm,most", [(132, 4, 8), (132, 16, 8), (4, 16, 8), (132, 6, 3)])
def test_plan_covers_k_once_in_whole_64_wide_chunks(n, k, m, sms, per_sm, most):
    p = plan(m, k, n, sms, per_sm, most_warps=most, fp8=True)
    s = p.split
    assert p.fp8 and (p.mt, p.nt, s.steps) in FP8_VARIANTS and p.mt * 8 >= m
    chunk = 64 * s.steps
    assert k % chunk == 0 and s.k_per_warp % chunk == 0
    assert 1 <= s.warps <= min(most, dense_mma.MAX_WARPS)
    assert s.warps * s.splits * s.k_per_warp >= k  # K covered ...
    assert (s.splits - 1) * s.warps * s.k_per_warp < k  # ... and no CTA of idle warps only
    assert p.tiles * 16 == n
    assert p.kernel(torch.bfloat16) in FP8_NAMES and p.kernel(torch.float16) in FP8_NAMES


def test_plan_refuses_what_is_not_built():
    with pytest.raises(ValueError, match="float8"):
        plan(32, 1024, 4096, 132, steps=4, fp8=True)  # m4 s4: not built
    with pytest.raises(ValueError, match="float8"):
        plan(1, 1024, 4096, 132, nt=2, fp8=True)  # one feature tile per warp only
    assert plan(1, 192, 48, 132, fp8=True).split.steps == 1  # K = 3 steps: chunks of one
    assert plan(1, 4096, 4096, 132, fp8=True).split.steps == 2  # FP8_PLAN
    assert plan(1, 4096, 4096, 132, steps=4, fp8=True).split.steps == 4


@pytest.mark.skipif(cuda_module.nvcc_path() is None, reason="no nvcc on this machine")
def test_the_float8_source_builds_for_hopper_without_spills(tmp_path, monkeypatch):
    spills = cuda_checks.build_once(dense_mma.FP8_SOURCE, FP8_NAMES, tmp_path, monkeypatch)
    assert not any(spills.values()), spills


def test_supports_and_fits():
    assert supports(1, 4096, 4096, torch.bfloat16, fp8=True)
    assert not supports(1, 4128, 4096, torch.bfloat16, fp8=True)  # K % 64
    assert supports(1, 4128, 4096, torch.bfloat16)  # 16-bit weights: K % 32
    w = torch.zeros(64, 256, dtype=FP8)
    s = torch.ones(64)
    assert not dense_mma.fits(torch.empty(1, 256, dtype=torch.bfloat16), w, None, s)  # CPU


# --- the conversion and the mapping, emulated on the CPU ------------------------------------

def _decode(codes: np.ndarray) -> np.ndarray:
    """e4m3 codes (uint8) as float64 values (torch's own decoding)."""
    return torch.from_numpy(np.ascontiguousarray(codes)).view(FP8).double().numpy()


def _bf16_pairs(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Weights<bf16, E4m3>::pair on uint32 words: (lo, hi) as [..., 2] float64 (low half
    first): lo holds bytes 0 and 2, hi bytes 1 and 3, each w * 2**-120."""
    q = q.astype(np.uint64)
    hi = ((q & 0x7F007F00) >> 4) | (q & 0x80008000)
    q8 = (q << 8) & 0xFFFFFFFF
    lo = ((q8 & 0x7F007F00) >> 4) | (q8 & 0x80008000)

    def halves(v):  # bf16 bits -> float32 bits -> float64
        f = np.stack([(v & 0xFFFF) << 16, (v >> 16) << 16], -1).astype(np.uint32)
        return f.view(np.float32).astype(np.float64)
    return halves(lo), halves(hi)


def test_bf16_bit_placement_is_exact_for_every_code():
    """Every e4m3 code but the two NaNs (zeros, subnormals down to 2**-9, +-448) becomes its
    value times 2**-120 in bf16, bit for bit; negative zero keeps its sign."""
    codes = np.arange(256, dtype=np.uint8)
    words = codes.view(np.uint32)  # byte i of word j: code 4j + i
    lo, hi = _bf16_pairs(words)
    got = np.stack([lo[:, 0], hi[:, 0], lo[:, 1], hi[:, 1]], 1).reshape(-1)  # bytes 0, 1, 2, 3
    expect = _decode(codes) * 2.0**-120
    finite = (codes & 0x7F) != 0x7F
    assert np.array_equal(got[finite], expect[finite])
    assert np.signbit(got[0x80]) and got[0x80] == 0
    assert got[0x01] == 2.0**-129  # the smallest subnormal: a bf16 subnormal, not zero


def _emulate_fp8(x_flat, m, stride_x, codes, scale, bias, p, act):
    """What cuda/dense_mma_fp8.cu computes, lane by lane and in its index
    arithmetic: each lane's 16-byte loads (16 weights; word p = weights 4p..4p+3), the
    conversion and pairing of Weights<act, E4m3>, the activations' two uint4 per step, the
    CTA's and the split's sums and the output offsets (float64 arithmetic)."""
    n, k = codes.shape
    mt_tiles, steps, s = p.mt, p.split.steps, p.split
    w_flat = codes.reshape(-1)
    part = np.full((s.splits, m * n), np.nan)
    writes = np.zeros((s.splits, m * n), int)
    out_scale = 2.0**56 if act == "bf16" else 1.0
    for tile in range(p.tiles):
        n0 = tile * 16
        wrow = ((n0 + G) * k + 16 * T) // 16  # in uint4
        for split in range(s.splits):
            total = np.zeros((mt_tiles, 32, 4))
            for warp in range(s.warps):
                acc = np.zeros((mt_tiles, 32, 4))
                k_begin = (split * s.warps + warp) * s.k_per_warp
                for kk in range(k_begin, min(k_begin + s.k_per_warp, k), 64 * steps):
                    for i in range(steps):
                        step = (kk // 64 + i) * 4
                        ra = w_flat[(16 * (wrow + step))[:, None] + np.arange(16)]
                        rb = w_flat[(16 * (wrow + k // 2 + step))[:, None] + np.arange(16)]
                        for pp in range(4):
                            words_a = ra[:, 4 * pp:4 * pp + 4].copy().view(np.uint32)[:, 0]
                            words_b = rb[:, 4 * pp:4 * pp + 4].copy().view(np.uint32)[:, 0]
                            if act == "bf16":
                                (a0, a2), (a1, a3) = _bf16_pairs(words_a), _bf16_pairs(words_b)
                            else:  # cvt.rn.f16x2.e4m3x2 of each half-word: bytes in order
                                va = _decode(ra[:, 4 * pp:4 * pp + 4])
                                vb = _decode(rb[:, 4 * pp:4 * pp + 4])
                                a0, a2, a1, a3 = va[:, :2], va[:, 2:], vb[:, :2], vb[:, 2:]
                            a = np.stack([a0, a1, a2, a3], 1)
                            for mt in range(mt_tiles):
                                rows = mt * 8 + G
                                base = (np.minimum(rows, m - 1) * stride_x + kk + 64 * i
                                        + 16 * T + 4 * pp)
                                xv = np.where((rows < m)[:, None],
                                              x_flat[base[:, None] + np.arange(4)], 0.0)
                                if act == "bf16":  # paired {0, 2}, {1, 3}, times 2**64
                                    b = np.stack([xv[:, 0::2], xv[:, 1::2]], 1) * 2.0**64
                                else:
                                    b = np.stack([xv[:, :2], xv[:, 2:]], 1)
                                _mma(acc[mt], a, b)
                total += acc
            for mt in range(mt_tiles):
                for r in range(4):
                    rows = mt * 8 + 2 * T + (r & 1)
                    feats = n0 + G + (0 if r < 2 else 8)
                    ok = rows < m
                    part[split, rows[ok] * n + feats[ok]] = total[mt, ok, r]
                    np.add.at(writes[split], rows[ok] * n + feats[ok], 1)
    assert (writes == 1).all()  # each output once per split
    feats = np.arange(m * n) % n
    out = part.sum(0) * scale[feats] * out_scale + (bias[feats] if bias is not None else 0.0)
    return out.reshape(m, n)


@pytest.mark.parametrize("act", ["bf16", "f16"])
@pytest.mark.parametrize("m", [1, 3, 9, 17, 32])
@pytest.mark.parametrize("n,k,sms,per_sm,most,steps", [
    (32, 512, 132, 4, 8, None),  # one CTA per tile
    (32, 1024, 2, 16, 2, 2),  # split over CTAs
    (48, 768, 1, 8, 8, 4),  # several warps, one CTA
    (16, 192, 132, 6, 8, None),  # K of 3 steps
])
def test_the_fp8_fragment_mapping_computes_x_at_w_transposed(act, m, n, k, sms, per_sm, most,
                                                             steps):
    rng = np.random.default_rng(m * 1000 + n + k)
    codes = rng.integers(0, 256, size=(n, k), dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x01  # no NaN codes: every other code, subnormals too
    scale = rng.uniform(0.5, 2.0, n)
    bias = rng.standard_normal(n)
    stride_x = k + 64
    x_full = rng.standard_normal((m, stride_x))
    try:
        p = plan(m, k, n, sms, per_sm, steps, most, fp8=True)
    except ValueError:
        pytest.skip("not a built variant")
    got = _emulate_fp8(x_full.reshape(-1), m, stride_x, codes, scale, bias, p, act)
    ref = x_full[:, :k] @ (_decode(codes) * scale[:, None]).T + bias
    np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-9)
    assert p.split.splits > 1 or (sms, most) != (2, 2)  # the split case does split


# --- on the GPU ---------------------------------------------------------------------------

gpu = pytest.mark.skipif(not torch.cuda.is_available()
                         or torch.cuda.get_device_capability() < (8, 9)
                         or cuda_module.module(dense_mma.FP8_SOURCE, torch.device("cuda")) is None,
                         reason="needs an NVIDIA GPU of compute capability 8.9+ and nvcc")


@functools.cache
def _fp8_weights(n, k):
    from octavo.quantization.fp8 import quantize_fp8

    g = torch.Generator(device="cuda").manual_seed(n * 7 + k)
    w = torch.randn(n, k, device="cuda", generator=g) / k ** 0.5
    q, s = quantize_fp8(w, per_channel=True)
    bias = torch.randn(n, device="cuda", generator=g)
    return q, s.contiguous(), bias


def _ref(x, q, s, bias=None):
    w = q.double() * s.double()[:, None]
    return x.double() @ w.T + (bias.double() if bias is not None else 0)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n,k", REAL_SHAPES + [(64, 256), (48, 192), (16, 64)])
def test_fp8_matches_the_float64_reference_at_every_batch_gpu(n, k, dtype, with_bias):
    q, s, b = _fp8_weights(n, k)
    bias = b.to(dtype) if with_bias else None
    for m in range(1, 33):
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        out = dense_mma.dense_mma(x, q, bias, s)
        assert out.dtype == dtype and out.shape == (m, n)
        assert torch.isfinite(out).all(), m
        # the output's own rounding (bf16: 2**-9) dominates; a wrong row or column or a
        # wrong conversion gives errors of order 1
        assert _rel_rows(out, _ref(x, q, s, bias)) < (8e-3 if dtype == torch.bfloat16
                                                      else 2e-3), m


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_every_code_and_the_extremes_gpu(dtype):
    """Every e4m3 code but the NaNs (subnormals down to 2**-9, zeros, +-448) in every K
    position against large (1e4) and small (1e-3) activations and mixed row scales: within a
    float32-summation bound of the exact float64 sum (a flushed subnormal, a lost sign or a
    wrong byte pairing is far outside it)."""
    k, n = 1024, 64
    codes = torch.arange(n * k, dtype=torch.int64).remainder(256).to(torch.uint8).reshape(n, k)
    codes = torch.stack([r.roll(int(i) * 37) for i, r in enumerate(codes)])
    codes[(codes & 0x7F) == 0x7F] = 0x01
    q = codes.view(FP8).cuda()
    scale = torch.logspace(-4, 3, n, dtype=torch.float32)
    if dtype == torch.float16:
        scale /= 1e6  # outputs within float16's range (row 0's largest: 6.1e3)
    scale = scale.cuda()
    x = torch.full((3, k), 1e-3)
    x[0, ::3] = 1e4
    x[0, 1::5] = -1e4
    x[1] = torch.randn(k)
    x[2, 5::7] = 0.0
    x = x.to(dtype).cuda()
    out = dense_mma.dense_mma(x, q, None, scale).double().cpu()
    w64 = q.cpu().double() * scale.cpu().double()[:, None]
    x64 = x.cpu().double()
    exact = x64 @ w64.T
    # float32 sums of K terms (a cancellation-proof bound), then the output's rounding: half
    # an ulp (bf16 2**-9, fp16 2**-11 relative; fp16 subnormals below 2**-14 are 2**-24 apart)
    bound = k * 2.0**-24 * (x64.abs() @ w64.abs().T) + (
        exact.abs() * 2.0**-8 if dtype == torch.bfloat16 else exact.abs() * 2.0**-11 + 2.0**-25)
    assert torch.isfinite(out).all()
    bad = ((out - exact).abs() > bound).nonzero().tolist()
    assert not bad, [(r, c, out[r, c].item(), exact[r, c].item(), bound[r, c].item())
                     for r, c in bad[:8]]
    # The smallest subnormal weight alone: 2**-9 * 1e-3 * K, not flushed to zero.
    sub = torch.full((16, k), 0x01, dtype=torch.uint8).view(FP8).cuda()
    tiny = torch.full((1, k), 1e-3, dtype=dtype, device="cuda")
    got = dense_mma.dense_mma(tiny, sub, None, torch.ones(16, device="cuda")).double().cpu()
    want = (tiny.double().cpu() @ sub.cpu().double().T)
    assert torch.allclose(got, want, rtol=8e-3, atol=0)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("m", [1, 8, 13, 32])
@pytest.mark.parametrize("per_sm,most_warps,steps", [
    (1, 1, 1), (4, 2, 2), (64, 8, 4), (16, 3, None), (200, 8, 1), (8, 4, None)])
def test_every_fp8_plan_gives_the_same_answer_gpu(m, per_sm, most_warps, steps):
    from octavo.kernels import split_k

    q, s, bias = _fp8_weights(1024, 2048)
    bias = bias.bfloat16()
    x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)
    try:
        p = plan(m, 2048, 1024, 132, per_sm, steps, most_warps, fp8=True)
    except ValueError:
        pytest.skip("not a built variant")
    run = functools.partial(dense_mma.dense_mma, x, q, bias, s, warps_per_sm=per_sm,
                            steps=steps, most_warps=most_warps)
    out = run()
    assert _rel_rows(out, _ref(x, q, s, bias)) < 8e-3, p
    assert torch.equal(run(), out)  # the split sums in a fixed order
    torch.cuda.synchronize()
    assert not split_k.counters(x.device, 1).any()


@pytest.mark.gpu
@gpu
def test_fp8_strided_rows_and_graph_replays_gpu():
    from tests.quantization.gemm_checks import check_graph_replays

    q, s, _ = _fp8_weights(4096, 1024)
    wide = torch.randn(6, 1024 + 64, device="cuda", dtype=torch.bfloat16)
    view = wide[:, 64:]
    assert torch.equal(dense_mma.dense_mma(view, q, None, s),
                       dense_mma.dense_mma(view.contiguous(), q, None, s))
    x = torch.randn(5, 1024, device="cuda", dtype=torch.bfloat16)
    check_graph_replays(lambda xx: dense_mma.dense_mma(xx, q, None, s),
                        lambda xx: _ref(xx, q, s).float(), x)


@pytest.mark.gpu
@gpu
def test_fp8_layers_route_decode_rows_gpu(monkeypatch):
    """FP8 layers send batches of OCTAVO_CUDA_FP8_MIN_M..OCTAVO_CUDA_FP8_MAX_M rows (2..8 by
    default) to the kernel, with the bias; OCTAVO_CUDA_FP8=0 keeps the GEMV / _scaled_mm."""
    from octavo.quantization import fp8_linear

    calls = cuda_checks.count_rows(monkeypatch, dense_mma, "dense_mma")
    q, s, b = _fp8_weights(1024, 2048)
    bias = b.bfloat16()
    for m in (1, 2, 8, 9, 32):
        x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)
        y = fp8_linear.cuda_mma(x, q, s.view(1, -1), bias)
        if not 2 <= m <= 8:  # the default rows
            assert y is None
            continue
        assert _rel_rows(y, _ref(x, q, s, bias)) < 8e-3
    assert calls == [2, 8]
    calls.clear()
    monkeypatch.setenv("OCTAVO_CUDA_FP8_MIN_M", "1")
    monkeypatch.setenv("OCTAVO_CUDA_FP8_MAX_M", "32")
    for m in (1, 32):
        x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)
        assert _rel_rows(fp8_linear.cuda_mma(x, q, s, None), _ref(x, q, s)) < 8e-3
    assert calls == [1, 32]
    calls.clear()
    monkeypatch.setenv("OCTAVO_CUDA_FP8", "0")
    assert fp8_linear.cuda_mma(torch.randn(1, 2048, device="cuda", dtype=torch.bfloat16),
                               q, s, bias) is None
    assert calls == []


def _liven_fp8(model) -> None:
    """Realistic weights for an engine of FP8 linears (dummy weights of +-1e-3 give
    near-uniform logits, under which any kernel passes): norms 1, embeddings N(0, 1), each
    FP8 linear's weight N(0, 1/K) quantized per row, into its float8 buffers or, where the
    layer dequantized them at load, into its bf16 weight (the same values)."""
    from octavo.quantization.fp8 import quantize_fp8

    g = _liven(model)  # the parameters: norms, embeddings, LM head (the linears are buffers)
    for _, mod in sorted(model.named_modules()):
        w = getattr(mod, "weight_fp8", None)
        dense = getattr(mod, "dequantized_weight", None)
        if not isinstance(w, torch.Tensor) and not isinstance(dense, torch.Tensor):
            continue
        n, k = (w if w is not None else dense).shape
        q, s = quantize_fp8(torch.randn(n, k, device="cuda", generator=g) / k ** 0.5,
                            per_channel=True)
        if w is not None:
            w.copy_(q)
            mod.weight_scale.copy_(s)
        else:
            dense.copy_((q.float() * s[:, None]).to(dense.dtype))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("eager", [True, False])
def test_engine_fp8_decode_through_the_kernel_gpu(tmp_path, monkeypatch, eager):
    """A Qwen3 (random weights) quantized at load to fp8 decodes greedily through the CUDA
    float8 kernel (calls counted) with the logprobs of the same weights dequantized to bf16
    at load (plain matmuls, activations unrounded as in the kernel; _scaled_mm's W8A8 rounds
    them to fp8), step by step while they agree."""
    import json

    from octavo.quantization import fp8

    config = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 512,
              "intermediate_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 8,
              "num_key_value_heads": 4, "head_dim": 64, "vocab_size": 2048,
              "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
              "tie_word_embeddings": False, "torch_dtype": "bfloat16",
              "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    calls = cuda_checks.count_rows(monkeypatch, dense_mma, "dense_mma")

    def run(cuda: bool, enforce_eager: bool):
        monkeypatch.setenv("OCTAVO_CUDA_FP8_MIN_M", "1")  # the six prompts decode as 1-6 rows
        monkeypatch.setenv("OCTAVO_CUDA_DENSE", "0")  # only the float8 layers call it
        with monkeypatch.context() as m:
            if not cuda:  # float8 weights dequantized at load
                m.setattr(fp8, "use_scaled_mm", lambda device: False)
            return cuda_checks.greedy_decode(tmp_path, _liven_fp8, enforce_eager)

    default_out = run(False, True)
    assert not calls
    cuda_out = run(True, eager)
    assert calls and max(calls) <= 32
    assert cuda_checks.compare_decodes(default_out, cuda_out) >= 3 * len(cuda_checks.PROMPTS)


_LLAMA_512 = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512,
              "intermediate_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 8,
              "num_key_value_heads": 4, "vocab_size": 2048, "max_position_embeddings": 512,
              "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def _fused_glu_decodes_match(tmp_path, monkeypatch, eager, config, owner, name, liven):
    """Greedy one-prompt decodes with OCTAVO_FUSED_GLU=0 and =1 (``owner.name``'s calls
    spied: glu=False only, then some glu=True): the same tokens and logprobs, bit for bit."""
    import json

    (tmp_path / "config.json").write_text(json.dumps(config))
    calls = []
    real = getattr(owner, name)

    def spy(*args, glu=False, **kw):
        calls.append(glu)
        return real(*args, glu=glu, **kw)

    monkeypatch.setattr(owner, name, spy)
    one = cuda_checks.PROMPTS[:1]  # one row per decode step: the GEMV's
    monkeypatch.setenv("OCTAVO_FUSED_GLU", "0")
    separate = cuda_checks.greedy_decode(tmp_path, liven, eager, prompts=one)
    assert calls and not any(calls)
    calls.clear()
    monkeypatch.setenv("OCTAVO_FUSED_GLU", "1")
    fused = cuda_checks.greedy_decode(tmp_path, liven, eager, prompts=one)
    assert any(calls)
    assert fused == separate


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("eager", [True, False])
def test_engine_fused_glu_gpu(tmp_path, monkeypatch, eager):
    """One-row bf16 decodes (the CUDA dense GEMM off, so every linear runs the CUDA-core
    GEMV) apply the MLP's silu(gate) * up inside the down projection's GEMV: the same greedy
    tokens and logprobs as with the activation's own kernel, then the GEMV. Here beside the
    fp8 engine tests for their engine helpers."""
    from octavo.kernels import dense_gemv

    monkeypatch.setenv("OCTAVO_CUDA_DENSE", "0")  # every one-row linear on the GEMV
    _fused_glu_decodes_match(tmp_path, monkeypatch, eager, _LLAMA_512, dense_gemv,
                             "dense_gemv", _liven)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("eager", [True, False])
def test_engine_fp8_gated_gemv_gpu(tmp_path, monkeypatch, eager):
    """One-row fp8 decodes run the MLP's silu(gate) * up in the gate/up FP8 GEMV's store:
    the same greedy tokens and logprobs as the plain GEMV, then the activation's own
    kernel."""
    from octavo.quantization import fp8_linear

    config = {**_LLAMA_512, "quantization_config": {"quant_method": "fp8",
                                                     "activation_scheme": "dynamic"}}
    _fused_glu_decodes_match(tmp_path, monkeypatch, eager, config, fp8_linear, "gemv",
                             _liven_fp8)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("eager", [True, False])
def test_engine_fp8_qkv_rope_gemv_gpu(tmp_path, monkeypatch, eager):
    """Under OCTAVO_FUSED_QKV_ROPE=1 one-row fp8 decodes take q from the qkv FP8 GEMV whose
    store rotated q and k and wrote k / v into the paged cache (fused calls counted; no
    rotary launch): the same greedy tokens and logprobs, bit for bit, as with =0 (the plain
    GEMV, then the rotary kernel that stores k / v)."""
    import json

    from octavo.quantization import fp8_linear

    config = {**_LLAMA_512, "quantization_config": {"quant_method": "fp8",
                                                     "activation_scheme": "dynamic"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    fused_calls = []
    real = fp8_linear.gemv_qkv_rope

    def spy(*args, **kw):
        q = real(*args, **kw)
        fused_calls.append(q is not None)
        return q

    monkeypatch.setattr(fp8_linear, "gemv_qkv_rope", spy)
    one = cuda_checks.PROMPTS[:1]  # one row per decode step: the GEMV's
    monkeypatch.setenv("OCTAVO_FUSED_QKV_ROPE", "0")
    separate = cuda_checks.greedy_decode(tmp_path, _liven_fp8, eager, prompts=one)
    assert not fused_calls
    monkeypatch.setenv("OCTAVO_FUSED_QKV_ROPE", "1")
    fused = cuda_checks.greedy_decode(tmp_path, _liven_fp8, eager, prompts=one)
    assert fused_calls and all(fused_calls)
    assert fused == separate
