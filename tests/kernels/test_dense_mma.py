"""The CUDA C++ float GEMM for decode batches (octavo/kernels/dense_mma.py,
cuda/dense_mma.cu): the launch plan, the nvcc build, and the kernel's operand and output
mapping emulated lane by lane on the CPU; against the float64 reference on the GPU (every
batch size 1-32, bf16 / fp16, bias, real projection shapes, split plans, strided rows, graph
replays, the engine)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from octavo.kernels import cuda_module, dense_mma
from octavo.kernels.dense_mma import FP8_VARIANTS, VARIANTS, plan, supports
from tests.kernels import cuda_checks

NAMES = [f"dense_mma_{t}_m{mt}_n{nt}_s{s}" for t in ("bf16", "f16")
         for mt, nt, s in sorted(VARIANTS)]
FP8_NAMES = [f"dense_mma_{t}_e4m3_m{mt}_n{nt}_s{s}" for t in ("bf16", "f16")
             for mt, nt, s in sorted(FP8_VARIANTS)]
# (N, K): Qwen3-0.6B's qkv, gate_up, o, down; Llama-3.1-8B's qkv, gate_up, o, down.
REAL_SHAPES = [(4096, 1024), (6144, 1024), (1024, 2048), (1024, 3072),
               (6144, 4096), (28672, 4096), (4096, 4096), (4096, 14336)]


@pytest.mark.parametrize("n,k", REAL_SHAPES + [(64, 256), (48, 96), (16, 32), (160, 4160)])
@pytest.mark.parametrize("m", [1, 8, 9, 16, 17, 32])
@pytest.mark.parametrize("sms,per_sm,most", [(132, 6, 8), (132, 16, 8), (4, 16, 8), (132, 6, 3)])
def test_plan_covers_k_once_in_whole_chunks(n, k, m, sms, per_sm, most):
    p = plan(m, k, n, sms, per_sm, most_warps=most)
    s = p.split
    assert (p.mt, p.nt, s.steps) in VARIANTS and p.mt * 8 >= m
    assert k % s.chunk == 0 and s.k_per_warp % s.chunk == 0
    assert 1 <= s.warps <= min(most, dense_mma.MAX_WARPS)
    assert s.warps * s.splits * s.k_per_warp >= k  # K covered ...
    assert (s.splits - 1) * s.warps * s.k_per_warp < k  # ... and no CTA of idle warps only
    assert p.tiles * 16 * p.nt == n
    assert p.tiles * s.warps * s.splits <= max(per_sm * sms, p.tiles) * 2  # about per_sm
    assert p.kernel(torch.bfloat16) in NAMES and p.kernel(torch.float16) in NAMES


def test_plan_fills_the_gpu_and_keeps_wide_shapes_whole():
    down = plan(1, 3072, 1024, 132)  # Qwen3-0.6B down_proj: 64 tiles, split over CTAs
    s = down.split
    assert down.tiles == 64 and s.steps == 8
    assert 132 * 2 <= 64 * s.warps * s.splits <= 132 * 6  # about WARPS_PER_SM per SM
    deep = plan(1, 16384, 1024, 132, warps_per_sm=16).split  # 33 warps a tile: 4 CTAs
    assert deep.splits > 1 and deep.warps * deep.splits * deep.k_per_warp >= 16384
    gate_up = plan(1, 4096, 28672, 132)  # Llama-8B gate_up: 1792 tiles, one warp each
    assert gate_up.split.splits == 1 and gate_up.split.warps == 1
    # The sweep's choice: one feature tile per warp, the longest chunks built.
    assert plan(17, 1024, 4096, 132).nt == 1 and plan(8, 1024, 4096, 132).nt == 1
    assert plan(32, 1024, 4096, 132).split.steps == 4  # m4 s8 spills: not built
    assert plan(32, 1024, 4096, 132, nt=2).nt == 2


def test_plan_refuses_what_is_not_built():
    with pytest.raises(ValueError, match="no kernel"):
        plan(32, 1024, 4096, 132, steps=8)  # m4 s8 spills: not built
    with pytest.raises(ValueError, match="no kernel"):
        plan(1, 1024, 48, 132, nt=2)  # N not a multiple of 32
    assert plan(1, 96, 48, 132).split.steps == 1  # K = 3 steps: chunks of one


def test_supports():
    assert supports(1, 1024, 4096, torch.bfloat16)
    assert supports(32, 14336, 4096, torch.float16)
    assert supports(5, 32, 16, torch.bfloat16)
    assert not supports(33, 1024, 4096, torch.bfloat16)  # batch
    assert not supports(0, 1024, 4096, torch.bfloat16)
    assert not supports(1, 1024, 4096, torch.float32)  # dtype
    assert not supports(1, 1040, 4096, torch.bfloat16)  # K % 32
    assert not supports(1, 1024, 4104, torch.bfloat16)  # N % 16


def test_fits_wants_cuda_tensors():
    w = torch.empty(64, 256, dtype=torch.bfloat16)
    assert not dense_mma.fits(torch.empty(1, 256, dtype=torch.bfloat16), w)  # on the CPU


def test_available_where_built_unless_turned_off(monkeypatch):
    cuda_checks.check_switch(monkeypatch, dense_mma, "OCTAVO_CUDA_DENSE", default=True)


@pytest.mark.skipif(cuda_module.nvcc_path() is None, reason="no nvcc on this machine")
def test_the_source_builds_for_hopper_without_spills(tmp_path, monkeypatch):
    spills = cuda_checks.build_once(dense_mma.SOURCE, NAMES, tmp_path, monkeypatch)
    assert not any(spills.values()), spills  # every kernel built (VARIANTS) fits, no spills


# --- the kernel's mapping, emulated on the CPU ----------------------------------------------

G, T = cuda_checks.G, cuda_checks.T
_mma = cuda_checks.mma16816


def _emulate(x_flat, m, stride_x, w, bias, p):
    """What cuda/dense_mma.cu computes, lane by lane and in its index arithmetic: each lane's
    16-byte loads (a uint4 = 8 values, word i = values 2i, 2i+1), the registers handed to the
    mma, the CTA's and the split's sums and the output offsets."""
    n, k = w.shape
    mt_tiles, nt, steps, s = p.mt, p.nt, p.split.steps, p.split
    w_flat = w.reshape(-1)

    def u4(flat, idx):  # [32] uint4 indices -> [32, 8] values
        return flat[(8 * idx)[:, None] + np.arange(8)]

    part = np.full((s.splits, m * n), np.nan)  # an output no lane writes stays NaN
    writes = np.zeros((s.splits, m * n), int)
    for tile in range(p.tiles):
        n0 = tile * nt * 16
        wrow = ((n0 + G) * k + 8 * T) // 8
        for split in range(s.splits):
            total = np.zeros((mt_tiles, nt, 32, 4))
            for warp in range(s.warps):
                acc = np.zeros((mt_tiles, nt, 32, 4))
                k_begin = (split * s.warps + warp) * s.k_per_warp
                for kk in range(k_begin, min(k_begin + s.k_per_warp, k), 32 * steps):
                    for i in range(steps):
                        for h in range(2):
                            for mt in range(mt_tiles):
                                rows = mt * 8 + G
                                xv = np.where((rows < m)[:, None], x_flat[
                                    (np.minimum(rows, m - 1) * stride_x + kk + 32 * i
                                     + 8 * T)[:, None] + np.arange(8)], 0.0)
                                b = np.stack([xv[:, 4 * h:4 * h + 2],
                                              xv[:, 4 * h + 2:4 * h + 4]], 1)
                                for j in range(nt):
                                    wa = wrow + j * 2 * k
                                    ca = u4(w_flat, wa + (kk // 32 + i) * 4)
                                    cb = u4(w_flat, wa + k + (kk // 32 + i) * 4)
                                    a = np.stack([ca[:, 4 * h:4 * h + 2], cb[:, 4 * h:4 * h + 2],
                                                  ca[:, 4 * h + 2:4 * h + 4],
                                                  cb[:, 4 * h + 2:4 * h + 4]], 1)
                                    _mma(acc[mt, j], a, b)
                total += acc
            for mt in range(mt_tiles):
                for i in range(4):
                    rows = mt * 8 + 2 * T + (i & 1)
                    for j in range(nt):
                        feats = n0 + 16 * j + G + (0 if i < 2 else 8)
                        ok = rows < m
                        part[split, rows[ok] * n + feats[ok]] = total[mt, j, ok, i]
                        np.add.at(writes[split], rows[ok] * n + feats[ok], 1)
    assert (writes == 1).all()  # each output once per split
    summed = part.sum(0)  # the last ticket's sum, in split order
    feats = np.arange(m * n) % n
    out = summed + (bias[feats] if bias is not None else 0.0)
    return out.reshape(m, n)


@pytest.mark.parametrize("m", [1, 3, 8, 9, 16, 17, 25, 32])
@pytest.mark.parametrize("n,k,sms,per_sm,most,nt,steps", [
    (64, 256, 132, 6, 8, None, None),  # one CTA per tile
    (64, 512, 2, 16, 2, None, 2),  # split over CTAs
    (96, 384, 1, 8, 8, 1, 4),  # several warps, one CTA
    (64, 256, 4, 8, 3, 2, 1),  # two feature tiles, idle warps in the last CTA
    (48, 96, 132, 6, 8, 1, None),  # K of 3 steps
])
def test_the_fragment_mapping_computes_x_at_w_transposed(m, n, k, sms, per_sm, most, nt, steps):
    if nt == 2 and n % 32:
        pytest.skip("N")
    rng = np.random.default_rng(m * 1000 + n + k)
    w = rng.standard_normal((n, k))
    bias = rng.standard_normal(n)
    stride_x = k + 64  # rows of a wider buffer
    x_full = rng.standard_normal((m, stride_x))
    try:
        p = plan(m, k, n, sms, per_sm, steps, most, nt)
    except ValueError:
        pytest.skip("not a built variant")
    got = _emulate(x_full.reshape(-1), m, stride_x, w, bias, p)
    ref = x_full[:, :k] @ w.T + bias
    np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-10)
    assert p.split.splits > 1 or (sms, most) != (2, 2)  # the split case does split


# --- on the GPU ---------------------------------------------------------------------------

def _rel_rows(out, ref):
    """The worst row's relative error."""
    a, b = out.double().cpu(), ref.double().cpu()
    return ((a - b).norm(dim=-1) / b.norm(dim=-1).clamp_min(1e-30)).max().item()


def _tol(dtype):  # the output's own rounding (bf16: 2**-9) dominates; a wrong row or column
    return 8e-3 if dtype == torch.bfloat16 else 2e-3  # gives errors of order 1


@functools.cache
def _weights(n, k, dtype):
    g = torch.Generator(device="cuda").manual_seed(n * 7 + k)
    w = (torch.randn(n, k, device="cuda", generator=g) / k ** 0.5).to(dtype)
    bias = torch.randn(n, device="cuda", generator=g).to(dtype)
    return w, bias


gpu = cuda_checks.needs_build(dense_mma.SOURCE)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n,k", REAL_SHAPES + [(64, 256), (48, 96), (16, 32)])
def test_matches_the_float64_reference_at_every_batch_gpu(n, k, dtype, with_bias):
    w, b = _weights(n, k, dtype)
    bias = b if with_bias else None
    wd = w.double()
    for m in range(1, 33):
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        out = dense_mma.dense_mma(x, w, bias)
        assert out.dtype == dtype and out.shape == (m, n)
        ref = x.double() @ wd.T + (bias.double() if bias is not None else 0)
        assert torch.isfinite(out).all(), m
        assert _rel_rows(out, ref) < _tol(dtype), m


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("m", [1, 8, 13, 32])
@pytest.mark.parametrize("per_sm,most_warps,steps,nt", [
    (1, 1, 1, 1), (4, 2, 2, 2), (64, 8, 4, 1), (16, 3, None, 2), (200, 8, 1, 1),
    (6, 8, 8, 1), (12, 8, 2, 2), (8, 4, None, None)])
def test_every_plan_gives_the_same_answer_gpu(m, per_sm, most_warps, steps, nt):
    """Plans from one warp per tile to K split over several CTAs (the last-ticket sum), with
    idle warps in the last CTA: the same answer call after call, the split-K counters left
    zeroed."""
    from octavo.kernels import split_k

    w, bias = _weights(1024, 2048, torch.bfloat16)
    x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)
    try:
        p = plan(m, 2048, 1024, 132, per_sm, steps, most_warps, nt)
    except ValueError:
        pytest.skip("not a built variant")
    out = dense_mma.dense_mma(x, w, bias, warps_per_sm=per_sm, steps=steps,
                              most_warps=most_warps, nt=nt)
    ref = x.double() @ w.double().T + bias.double()
    assert _rel_rows(out, ref) < 8e-3, p
    again = dense_mma.dense_mma(x, w, bias, warps_per_sm=per_sm, steps=steps,
                                most_warps=most_warps, nt=nt)
    assert torch.equal(again, out)  # the split sums in a fixed order
    torch.cuda.synchronize()
    assert not split_k.counters(x.device, 1).any()


@pytest.mark.gpu
@gpu
def test_strided_rows_leading_dims_and_graph_replays_gpu():
    from tests.quantization.gemm_checks import check_graph_replays

    w, bias = _weights(4096, 1024, torch.bfloat16)
    wide = torch.randn(6, 1024 + 64, device="cuda", dtype=torch.bfloat16)
    view = wide[:, 64:]  # row stride 1088: 16-byte aligned rows, not contiguous
    assert torch.equal(dense_mma.dense_mma(view, w, bias),
                       dense_mma.dense_mma(view.contiguous(), w, bias))
    odd = wide[:, 3:1027]  # rows not 16-byte aligned: copied first
    assert torch.equal(dense_mma.dense_mma(odd, w), dense_mma.dense_mma(odd.contiguous(), w))
    x3 = torch.randn(2, 3, 1024, device="cuda", dtype=torch.bfloat16)
    out3 = dense_mma.dense_mma(x3, w, bias)
    assert out3.shape == (2, 3, 4096)
    assert torch.equal(out3.reshape(6, 4096), dense_mma.dense_mma(x3.reshape(6, 1024), w, bias))

    x = torch.randn(5, 1024, device="cuda", dtype=torch.bfloat16)
    check_graph_replays(lambda xx: dense_mma.dense_mma(xx, w, bias),
                        lambda xx: xx.float() @ w.float().T + bias.float(), x)


@pytest.mark.gpu
@gpu
def test_float_linear_routes_the_opted_in_rows_gpu(monkeypatch):
    import torch.nn.functional as F

    from octavo.kernels.float_linear import linear

    calls = cuda_checks.count_rows(monkeypatch, dense_mma, "dense_mma")
    w, bias = _weights(1024, 2048, torch.bfloat16)
    xs = {m: torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16) for m in (1, 2, 32, 33)}

    def run_all():
        for x in xs.values():
            torch.testing.assert_close(linear(x, w, bias).float(),
                                       F.linear(x.float(), w.float(), bias.float()),
                                       atol=0.05, rtol=2e-2)

    monkeypatch.setenv("OCTAVO_CUDA_DENSE", "0")
    run_all()
    assert calls == []  # turned off
    monkeypatch.delenv("OCTAVO_CUDA_DENSE", raising=False)  # on by default
    run_all()
    assert calls == [1, 2, 32]
    calls.clear()
    monkeypatch.setenv("OCTAVO_CUDA_DENSE_MIN_M", "2")
    monkeypatch.setenv("OCTAVO_CUDA_DENSE_MAX_M", "16")
    run_all()
    assert calls == [2]
    calls.clear()
    linear(xs[2], w.t().contiguous().t())  # a weight not contiguous: the other kernels
    linear(xs[2].float(), w.float())  # float32: cuBLAS
    big = torch.randn(8192, 2048, device="cuda", dtype=torch.bfloat16)  # 32 MB: cuBLAS
    linear(xs[2], big)
    assert calls == []


def _liven(model) -> torch.Generator:
    """Dummy weights (+-1e-3) give near-uniform logits, under which any kernel passes: the
    same seeded weights of realistic scale in both engines (norms 1, linears 1/sqrt(K)). The
    generator, to draw more (test_dense_mma_fp8's float8 buffers)."""
    g = torch.Generator(device="cuda").manual_seed(1)
    for name, p in sorted(model.named_parameters()):
        if "norm" in name:
            p.data.fill_(1.0)
        elif "embed_tokens" in name:
            p.data.normal_(0.0, 1.0, generator=g)
        elif "lm_head" in name:
            p.data.normal_(0.0, 0.05, generator=g)
        elif p.dim() == 2:
            p.data.normal_(0.0, p.shape[1] ** -0.5, generator=g)
    return g


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("eager", [True, False])
def test_engine_decode_through_the_kernel_matches_the_default_kernels_gpu(tmp_path, monkeypatch,
                                                                          eager):
    """A bf16 Qwen3 (random weights) decodes greedily through the CUDA dense kernel (calls
    counted; eagerly and under CUDA graphs) with the logprobs of the default kernels' engine
    (OCTAVO_CUDA_DENSE=0), step by step while the two agree on the token."""
    import json

    config = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 512,
              "intermediate_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 8,
              "num_key_value_heads": 4, "head_dim": 64, "vocab_size": 2048,
              "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
              "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    calls = cuda_checks.count_rows(monkeypatch, dense_mma, "dense_mma")

    def run(cuda: bool, enforce_eager: bool):
        monkeypatch.setenv("OCTAVO_CUDA_DENSE", "1" if cuda else "0")
        return cuda_checks.greedy_decode(tmp_path, _liven, enforce_eager)

    default_out = run(False, True)
    assert not calls
    cuda_out = run(True, eager)
    assert calls and max(calls) <= 32  # the decode steps' batches (graphs: at capture)
    assert cuda_checks.compare_decodes(default_out, cuda_out) >= 3 * len(cuda_checks.PROMPTS)
