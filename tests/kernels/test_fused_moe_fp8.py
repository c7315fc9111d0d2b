"""fused_moe's FP8 path (float8_e4m3fn experts with float32 scales per row or per block,
each weight tile converted exactly in the main loop) against the float reference over the
dequantized weights: small shapes in Triton's CPU interpreter, sm_90 compiles offline,
Qwen3-30B-A3B's experts on the GPU."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from octavo.kernels.fused_moe import (  # noqa: E402
    FP8,
    Fp8Experts,
    MoeTiles,
    default_tiles,
    dequantize_fp8_experts,
    fused_moe,
    fused_moe_reference,
    supports,
)

SMALL = MoeTiles(block_m=16, block_n=32, block_k=32)


def make_experts(e, h, inter, block, device, seed=0) -> Fp8Experts:
    """Random FP8 experts over the whole e4m3 range; scales per row (block None) or per
    ``block`` of each weight, the last blocks partial where the block does not divide."""
    g = torch.Generator().manual_seed(seed)
    tensors = []
    for n, k in ((2 * inter, h), (h, inter)):
        w = (torch.randn(e, n, k, generator=g) * 120).clamp(-448, 448).to(FP8)
        shape = (e, n) if block is None else (e, -(-n // block[0]), -(-k // block[1]))
        s = torch.rand(shape, generator=g) / (300 * k ** 0.5) + 1e-5
        tensors += [w.to(device), s.to(device)]
    return Fp8Experts(w13=tensors[0], s13=tensors[1], w2=tensors[2], s2=tensors[3],
                      block=block)


def _route(t, e, k, device, seed=0):
    g = torch.Generator().manual_seed(seed + 1)
    ids = torch.rand(t, e, generator=g).argsort(dim=1)[:, :k].to(device, torch.int32)
    weights = torch.softmax(torch.randn(t, k, generator=g), dim=1).to(device)
    return weights, ids


def _check(x, fp8, weights, ids, tiles, rel):
    got = fused_moe(x, fp8.w13, fp8.w2, weights, ids, tiles=tiles, fp8=fp8)
    assert got.shape == x.shape and got.dtype == x.dtype
    w13, w2 = dequantize_fp8_experts(fp8)
    # The reference in float32 with the activation product rounded to x's dtype, as fused.
    ref = fused_moe_reference(x.float(), w13, w2, weights, ids) if x.dtype != torch.float32 \
        else fused_moe_reference(x, w13, w2, weights, ids)
    err = (got.float() - ref.float()).abs().max() / ref.float().abs().max()
    assert err < rel, err


@pytest.mark.parametrize("block", [None, (16, 32), (8, 16)], ids=["rows", "b16x32", "b8x16"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t", [1, 6])
def test_matches_reference(block, dtype, t, device):
    # H = 96 (three K steps of 32), I = 48: down's K ends in half a 32-column block.
    fp8 = make_experts(4, 96, 48, block, device, seed=t)
    x = torch.randn(t, 96, generator=torch.Generator().manual_seed(t)).to(device, dtype)
    weights, ids = _route(t, 4, 2, device, seed=t)
    # bf16: the activation product is rounded to bf16 before the down projection.
    _check(x, fp8, weights, ids, SMALL, 1e-5 if dtype == torch.float32 else 2e-2)


def test_float32_is_the_dequantized_float_kernel(device):
    """Row scales are exact powers of two here, so every product is exact and the FP8 path
    must equal the float kernel over the dequantized weights to the last bit."""
    fp8 = make_experts(4, 64, 32, None, device)
    pow2 = [torch.exp2(torch.round(torch.log2(s))) for s in (fp8.s13, fp8.s2)]
    fp8 = fp8._replace(s13=pow2[0], s2=pow2[1])
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(3)).to(device)
    weights, ids = _route(5, 4, 2, device)
    w13, w2 = dequantize_fp8_experts(fp8)
    assert torch.equal(fused_moe(x, fp8.w13, fp8.w2, weights, ids, tiles=SMALL, fp8=fp8),
                       fused_moe(x, w13, w2, weights, ids, tiles=SMALL))


@pytest.fixture
def cpu_interpreted():
    """The CPU tensors below run where Triton interprets (skip on a GPU machine)."""
    from octavo.kernels.triton_utils import interpreting

    if not interpreting():
        pytest.skip("CPU tensors run the kernels only in Triton's interpreter")


def test_errors_name_the_shape(cpu_interpreted):
    fp8 = make_experts(4, 64, 32, (16, 32), "cpu")
    x = torch.randn(2, 64)
    weights, ids = _route(2, 4, 2, "cpu")
    bad = fp8._replace(s13=fp8.s13[:, :-1].contiguous())
    with pytest.raises(ValueError, match=r"s13 is \(4, 3, 2\).*\(4, 4, 2\) \(blocks of"):
        fused_moe(x, fp8.w13, fp8.w2, weights, ids, tiles=SMALL, fp8=bad)
    odd = make_experts(4, 64, 32, (16, 48), "cpu")
    with pytest.raises(ValueError, match="K step of 32 does not divide .* 48 columns"):
        fused_moe(x, odd.w13, odd.w2, weights, ids, tiles=SMALL, fp8=odd)
    split = make_experts(4, 64, 24, (16, 32), "cpu")
    with pytest.raises(ValueError, match="gate/up split at row 24"):
        fused_moe(x, split.w13, split.w2, weights, ids, tiles=SMALL, fp8=split)
    rows = make_experts(4, 64, 32, None, "cpu")
    with pytest.raises(ValueError, match="one scale per row"):
        fused_moe(x, rows.w13, rows.w2, weights, ids, tiles=SMALL,
                  fp8=rows._replace(s2=rows.s2.double()))


def test_supports_fp8_only_with_its_scales(cpu_interpreted):
    fp8 = make_experts(4, 64, 32, None, "cpu")
    x = torch.randn(2, 64)
    assert supports(x, fp8.w13, fp8.w2, fp8)
    assert not supports(x, fp8.w13, fp8.w2)
    w13, w2 = dequantize_fp8_experts(fp8)
    assert not supports(x, w13, w2, fp8)


@pytest.mark.parametrize("kernel", ["_gate_up_kernel", "_down_kernel"])
@pytest.mark.parametrize("scaled", [1, 2], ids=["rows", "blocks"])
# CI compiles 512 tokens; one token (3 s each on 2 cores) with the slow tests.
@pytest.mark.parametrize("tokens", [pytest.param(1, marks=pytest.mark.slow), 512])
def test_compiles_for_sm90(kernel, scaled, tokens):
    """Both launches with FP8 weights and bf16 activations, at the decode and the prefill
    tiles, compile for sm_90 offline without spills, within an SM's shared memory."""
    import re

    from tests.kernels.sm90 import compile_sm90

    tiles = default_tiles(tokens, 8, 128, torch.bfloat16, fp8=True)
    ptrs = ["sorted_ptr=i32", "tiles_ptr=i32", "w_ptr=fp8e4nv", "s_ptr=fp32"]
    div16 = ["stride_we", "stride_wn", "stride_op", "H", "INTER", "stride_se", "stride_sn"]
    if scaled == 2:
        div16 += ["SCALE_N", "SCALE_K"]
    if kernel == "_gate_up_kernel":
        ptrs += ["x_ptr=bf16", "out_ptr=bf16"]
        div16 += ["stride_xt"]
    else:
        ptrs += ["h_ptr=bf16", "weights_ptr=fp32", "out_ptr=fp32"]
        div16 += ["stride_hp"]
    code = compile_sm90(
        f"octavo.kernels.fused_moe:{kernel}", "--const", f"BLOCK_M={tiles.block_m}",
        f"BLOCK_N={tiles.block_n}", f"BLOCK_K={tiles.block_k}", "FP32_DOT=0",
        f"SCALED={scaled}", "--ptr", *ptrs, "--div16", *div16,
        "--num-warps", str(tiles.num_warps), "--num-stages", str(tiles.num_stages))
    found = re.search(r"local (\d+) B\s+shared (\d+) B", code.report)
    assert found, code.report
    assert int(found.group(1)) == 0, code.report
    assert int(found.group(2)) <= 227 * 1024, code.report


@pytest.mark.gpu
@pytest.mark.parametrize("block", [None, (128, 128)], ids=["rows", "blocks"])
@pytest.mark.parametrize("tokens", [1, 16, 300])
def test_real_shape_on_the_gpu(block, tokens):
    """Qwen3-30B-A3B's experts (128 of hidden 2048, width 768, 8 a token), bf16."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("e4m3 needs compute capability 8.9")
    fp8 = make_experts(128, 2048, 768, block, "cuda")
    x = torch.randn(tokens, 2048, device="cuda").to(torch.bfloat16)
    weights, ids = _route(tokens, 128, 8, "cuda")
    _check(x, fp8, weights, ids, None, 2e-2)
