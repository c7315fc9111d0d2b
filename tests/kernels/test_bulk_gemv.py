"""The bulk-copy FP8 GEMV (octavo/kernels/bulk_gemv.py, cuda/bulk_gemv.cu): its plans, the
nvcc build and its routing on the CPU; on a Hopper GPU its output against the float64
reference and the Triton FP8 GEMV at every plan (partial last chunks and tiles, one and two
rows, bf16 / fp16, the gated store), under CUDA graphs, and an engine's greedy decode."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from octavo.kernels import bulk_gemv, cuda_module
from octavo.kernels.bulk_gemv import FP8, PLANS
from tests.kernels import cuda_checks

SOURCE = Path(bulk_gemv.__file__).parent / "cuda" / bulk_gemv.SOURCE


def _names() -> list[str]:
    return [bulk_gemv.kernel_name(dtype, m, plan, glu) for plan in sorted(PLANS)
            for dtype in (torch.bfloat16, torch.float16) for m in (1, 2) for glu in (False, True)]


def test_the_plans_built_are_the_plans_listed():
    built = {tuple(int(v) for v in match) for match in re.findall(
        r"^OCTAVO_BULK_GEMV_PLAN\((\d+), (\d+), (\d+), (\d+)\)", SOURCE.read_text(), re.M)}
    assert built == set(PLANS)
    assert bulk_gemv.DEFAULT_PLAN in PLANS
    from benchmarks.gemv_scaling import BULK_PLANS

    assert set(BULK_PLANS) == set(PLANS)


@pytest.mark.parametrize("plan", sorted(PLANS))
def test_each_plan_fits_a_hopper_sm(plan):
    rows, warps, chunk, stages = plan
    assert rows <= 32 and rows % warps == 0 and (rows // warps) % 2 == 0  # GLU: whole pairs
    assert chunk % 512 == 0 and stages >= 2
    assert bulk_gemv.shared_bytes(plan) <= 227 * 1024  # the most one CTA may ask for


def test_tiles_and_names():
    assert bulk_gemv.tiles(4096, (16, 4, 1024, 4), glu=False) == 256
    assert bulk_gemv.tiles(4097, (16, 4, 1024, 4), glu=False) == 257
    assert bulk_gemv.tiles(28672, (16, 4, 1024, 4), glu=True) == 1792  # 14,336 pairs / 8
    assert bulk_gemv.tiles(18, (16, 4, 1024, 4), glu=True) == 2
    assert bulk_gemv.kernel_name(torch.bfloat16, 2, (8, 2, 1024, 4), True) == \
        "bulk_gemv_e4m3_bf16_m2_r8_w2_c1024_s4_glu"


def test_fits_and_takes_want_a_hopper_gpu(monkeypatch):
    x = torch.randn(1, 64)
    w = torch.zeros(32, 64).to(FP8)
    s = torch.ones(32)
    assert not bulk_gemv.fits(x, w, s)  # CPU tensors
    monkeypatch.setenv("OCTAVO_FP8_BULK", "1")
    assert not bulk_gemv.takes(x, w, s)
    with pytest.raises(ValueError, match="not supported"):
        bulk_gemv.bulk_gemv(x, w, s)


@pytest.mark.skipif(cuda_module.nvcc_path() is None, reason="no nvcc on this machine")
def test_the_source_builds_for_hopper_without_spills(tmp_path, monkeypatch):
    spills = cuda_checks.build_once(bulk_gemv.SOURCE, _names(), tmp_path, monkeypatch)
    assert not any(spills.values()), spills


# --- on the GPU ---------------------------------------------------------------------------

gpu = pytest.mark.skipif(not torch.cuda.is_available()
                         or torch.cuda.get_device_capability() < (9, 0)
                         or cuda_module.module(bulk_gemv.SOURCE, torch.device("cuda")) is None,
                         reason="needs an NVIDIA GPU of compute capability 9.0+ and nvcc")


def _case(m, k, n, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    weight = (torch.randn(n, k, generator=g) * 100).clamp(-448, 448).to(FP8)
    scale = torch.rand(n, generator=g) * 0.01 + 1e-4
    x = torch.randn(m, k, generator=g).to(dtype)
    return x.cuda(), weight.cuda(), scale.cuda()


def _ref(x, weight, scale):
    return x.double() @ (weight.double() * scale.double()[:, None]).T


def _rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp(min=1e-30)).item()


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("plan", sorted(PLANS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("n,k", [
    (4096, 4096),   # whole tiles and chunks
    (100, 4112),    # a partial last tile; a last chunk of 16 bytes
    (33, 16),       # one chunk shorter than a lane's first piece for most lanes
    (6144, 1040),   # a chunk plus a partial one
])
def test_matches_the_float64_reference_gpu(n, k, m, dtype, plan):
    x, weight, scale = _case(m, k, n, dtype)
    out = bulk_gemv.bulk_gemv(x, weight, scale, plan=plan)
    assert out.shape == (m, n) and out.dtype == dtype
    # each output rounded once to its dtype (bf16: 2**-9 relative)
    assert _rel(out, _ref(x, weight, scale)) < (4e-3 if dtype == torch.bfloat16 else 1e-3)
    # the same float32 products as the Triton GEMV, summed in another order
    from octavo.kernels.fp8_gemv import fp8_gemv

    assert _rel(out, fp8_gemv(x, weight, scale)) < (8e-3 if dtype == torch.bfloat16 else 2e-3)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("plan", sorted(PLANS))
@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("inter,k", [(14336, 4096), (20, 528)])
def test_glu_is_silu_of_gate_times_up_gpu(inter, k, m, plan):
    x, weight, scale = _case(m, k, 2 * inter, torch.bfloat16, seed=1)
    out = bulk_gemv.bulk_gemv(x, weight, scale, glu=True, plan=plan)
    assert out.shape == (m, inter)
    plain = bulk_gemv.bulk_gemv(x, weight, scale, plan=plan)
    g, u = plain[:, :inter].float(), plain[:, inter:].float()
    expect = (torch.nn.functional.silu(g) * u).to(torch.bfloat16)
    # the same rounded gate and up, silu through ex2.approx: within an output rounding
    assert _rel(out, expect) < 4e-3
    ref = _ref(x, weight, scale)
    assert _rel(out, torch.nn.functional.silu(ref[:, :inter]) * ref[:, inter:]) < 1.6e-2


@pytest.mark.gpu
@gpu
def test_every_code_and_strided_rows_gpu():
    """Every e4m3 code (NaN's two excepted) in a row, and x a strided view: exact where the
    products are exact (x a power of two, one code per row)."""
    codes = torch.arange(256, dtype=torch.uint8)
    codes = codes[(codes & 0x7F) != 0x7F]  # no NaN
    k = 512
    n = codes.numel()
    weight = torch.zeros(n, k, dtype=torch.uint8)
    weight[torch.arange(n), torch.arange(n) % k] = codes
    weight = weight.view(FP8).cuda()
    scale = torch.ones(n, device="cuda")
    big = torch.zeros(2, 2 * k, device="cuda", dtype=torch.float16)
    big[:, :k] = 2.0
    x = big[:, :k]  # rows 2K apart: 16-byte aligned, not contiguous
    out = bulk_gemv.bulk_gemv(x, weight, scale, plan=(8, 2, 1024, 4))
    expect = (weight.float() * 2.0).sum(1).to(torch.float16)
    assert torch.equal(out[0], expect) and torch.equal(out[1], expect)


@pytest.mark.gpu
@gpu
def test_graph_replays_and_pdl_gpu():
    """Captured in a CUDA graph between two other kernels (PDL on where enabled): each replay
    recomputes from the current x."""
    x, weight, scale = _case(1, 4096, 6144, torch.bfloat16)
    out = bulk_gemv.bulk_gemv(x, weight, scale)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = bulk_gemv.bulk_gemv(x * 1.0, weight, scale) + 0.0
    graph.replay()
    assert torch.equal(y, out)
    x.mul_(2)
    graph.replay()
    torch.cuda.synchronize()
    assert _rel(y, 2 * out.double()) < 4e-3


@pytest.mark.gpu
@gpu
def test_takes_wide_weights_when_switched_on_gpu(monkeypatch):
    x, weight, scale = _case(1, 4096, 28672, torch.bfloat16)
    monkeypatch.delenv("OCTAVO_FP8_BULK", raising=False)
    assert not bulk_gemv.takes(x, weight, scale)  # off by default
    monkeypatch.setenv("OCTAVO_FP8_BULK", "1")
    assert bulk_gemv.takes(x, weight, scale)
    assert bulk_gemv.takes(x, weight, scale, glu=True)
    assert not bulk_gemv.takes(x, weight[:1024], scale[:1024])  # 64 tiles: Triton splits K
    assert not bulk_gemv.takes(torch.cat([x] * 3), weight, scale)  # three rows


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("eager", [True, False])
def test_engine_fp8_decode_through_the_bulk_kernel_gpu(tmp_path, monkeypatch, eager):
    """An fp8 Llama (random weights) decodes one prompt through the bulk kernel (every FP8
    GEMV call but the qkv's rotating store; calls counted) with the greedy tokens and
    logprobs of the Triton GEMV, step by step while they agree."""
    import json

    from tests.kernels.test_dense_mma_fp8 import _LLAMA_512, _liven_fp8

    config = {**_LLAMA_512, "quantization_config": {"quant_method": "fp8",
                                                     "activation_scheme": "dynamic"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    calls = cuda_checks.count_rows(monkeypatch, bulk_gemv, "bulk_gemv")
    monkeypatch.setattr(bulk_gemv, "MIN_CTAS_PER_SM", 0)  # the tiny model's layers too
    one = cuda_checks.PROMPTS[:1]
    monkeypatch.setenv("OCTAVO_FP8_BULK", "0")
    triton_out = cuda_checks.greedy_decode(tmp_path, _liven_fp8, eager, prompts=one)
    assert not calls
    monkeypatch.setenv("OCTAVO_FP8_BULK", "1")
    bulk_out = cuda_checks.greedy_decode(tmp_path, _liven_fp8, eager, prompts=one)
    assert calls and set(calls) == {1}
    assert cuda_checks.compare_decodes(triton_out, bulk_out, tol=0.05) >= 4
