"""fused_moe_int (the grouped MoE launches over stacked 4- / 8-bit along-K experts) against
dequantize-then-reference, in the CPU interpreter at small shapes and on a GPU."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from octavo.kernels.fused_moe import MoeTiles, align_by_expert  # noqa: E402
from octavo.kernels.fused_moe_int import (  # noqa: E402
    IntExperts,
    block_k,
    default_tiles,
    dequantize,
    fused_moe_int,
    fused_moe_int_reference,
    supports,
)
from octavo.kernels.w4a16_gemm import dequantize_ref, pack_along_k  # noqa: E402

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
       torch.float16: dict(atol=2e-3, rtol=2e-3)}


@pytest.fixture(autouse=True)
def _tensor_core_launches(monkeypatch):
    """The grouped GEMMs unless a test asks for the GEMV (OCTAVO_MOE_INT_GEMV, default 128
    pairs, which would otherwise take every small case here)."""
    monkeypatch.setenv("OCTAVO_MOE_INT_GEMV", "0")


def _packed(g: torch.Generator, e: int, k: int, n: int, bits: int, group: int, sym: bool):
    q = torch.randint(0, 1 << bits, (e, k, n), generator=g)
    # Weights of about the same size at both widths (8-bit values span 16x the range).
    scales = (torch.rand(e, k // group, n, generator=g) / 40 + 0.005) / (1 << (bits - 4))
    if sym:
        zeros = torch.full(scales.shape, float(1 << (bits - 1)))
    else:
        zeros = torch.randint(0, 1 << bits, scales.shape, generator=g).float()
    return torch.stack([pack_along_k(q[i], bits) for i in range(e)]), scales, zeros


def make_experts(e=4, h=64, inter=96, bits=4, groups=(32, 32), sym=False, perm=False,
                 scale_dtype=torch.float16, device="cpu", seed=0) -> IntExperts:
    g = torch.Generator().manual_seed(seed)
    w13, s13, z13 = _packed(g, e, h, 2 * inter, bits, groups[0], sym)
    w2, s2, z2 = _packed(g, e, inter, h, bits, groups[1], sym)
    p13 = torch.stack([torch.randperm(h, generator=g) for _ in range(e)]).int() if perm else None
    p2 = torch.stack([torch.randperm(inter, generator=g) for _ in range(e)]).int() if perm \
        else None
    to = dict(device=device)
    return IntExperts(w13.to(**to), s13.to(device, scale_dtype), z13.to(device, scale_dtype),
                      w2.to(**to), s2.to(device, scale_dtype), z2.to(device, scale_dtype),
                      groups[0], groups[1], bits,
                      None if p13 is None else p13.to(**to), None if p2 is None else p2.to(**to))


def make_routing(t, e, k, device, seed=0):
    g = torch.Generator().manual_seed(seed + 1)
    ids = torch.rand(t, e, generator=g).argsort(dim=1)[:, :k].to(device, torch.int32)
    weights = torch.softmax(torch.randn(t, k, generator=g), dim=1).to(device)
    return weights, ids


def check(experts, t, k, dtype, device, tiles=None, seed=0, scaled=False):
    """The kernel against the reference; ``scaled``: errors measured against the output's
    largest magnitude (real shapes: outputs in the hundreds, where a bf16 rounding of the
    activation product moves a near-zero output by more than any elementwise tolerance)."""
    g = torch.Generator().manual_seed(seed + 2)
    x = torch.randn(t, experts.hidden, generator=g).to(device, dtype)
    weights, ids = make_routing(t, experts.num_experts, k, device, seed)
    got = fused_moe_int(x, experts, weights, ids, tiles=tiles)
    assert got.shape == x.shape and got.dtype == x.dtype
    ref = fused_moe_int_reference(x, experts, weights, ids)
    if scaled:
        err = (got.float() - ref.float()).abs().max() / ref.float().abs().max()
        assert err < 1e-2, f"max error {err:.2e} of the largest output"
        return
    torch.testing.assert_close(got.float(), ref.float(), **TOL[dtype])


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t,k", [(1, 2), (5, 2), (3, 1)])
def test_matches_reference(bits, dtype, t, k, device):
    # inter = 96: the 64-column tiles leave a tail of 32 gate and 32 up columns to the masks.
    check(make_experts(bits=bits, device=device, seed=bits), t, k, dtype, device, seed=t)


@pytest.mark.parametrize("sym", [True, False])
def test_act_order_groups_and_symmetric_zeros(sym, device):
    # Each expert's rows in its own order (desc_act sorted at load), groups of 16 on gate/up
    # and 32 on down: a common K step of 16.
    ex = make_experts(groups=(16, 32), sym=sym, perm=True, device=device, seed=3)
    assert block_k(ex) == 16
    check(ex, 4, 2, torch.float32, device, seed=4)


def test_bf16_scales_and_64_row_tiles(device):
    ex = make_experts(scale_dtype=torch.bfloat16, device=device, seed=5)
    check(ex, 6, 2, torch.bfloat16, device, tiles=MoeTiles(64, 32, 32), seed=6)


def test_dequantize_undoes_the_permutation():
    ex = make_experts(e=2, h=32, inter=32, groups=(16, 16), perm=True, scale_dtype=torch.float32)
    w13, w2 = dequantize(ex, torch.float32)
    # Expert 1's down weight: column perm2[1, i] of the checkpoint is sorted row i.
    sorted_w = dequantize_ref(ex.w2[1], ex.s2[1], ex.z2[1], 16, 4, torch.float32)
    torch.testing.assert_close(w2[1][:, ex.perm2[1].long()], sorted_w.t())
    assert w13.shape == (2, 64, 32) and w2.shape == (2, 32, 32)


def test_an_empty_batch_launches_nothing(device):
    ex = make_experts(device=device)
    x = torch.empty(0, ex.hidden, device=device)
    out = fused_moe_int(x, ex, torch.empty(0, 2, device=device),
                        torch.empty(0, 2, dtype=torch.int32, device=device))
    assert out.shape == (0, ex.hidden)


def test_bad_inputs_are_named(device):
    ex = make_experts(device=device)
    x = torch.randn(2, ex.hidden, device=device)
    weights, ids = make_routing(2, ex.num_experts, 2, device)
    with pytest.raises(ValueError, match=r"s13 is \(4, 1, 192\), expected \(4, 2, 192\)"):
        fused_moe_int(x, ex._replace(s13=ex.s13[:, :1].contiguous()), weights, ids)
    with pytest.raises(ValueError, match="BLOCK_K=128 must divide the groups"):
        fused_moe_int(x, ex, weights, ids, tiles=MoeTiles(16, 64, 128))
    wrong = align_by_expert(ids, ex.num_experts, 64)
    with pytest.raises(ValueError, match="the alignment holds 256 rows, not the 64"):
        fused_moe_int(x, ex, weights, ids, alignment=wrong)
    assert not supports(torch.randn(2, 48, device=device), ex)  # width 48 against 64
    with pytest.raises(ValueError, match="not supported"):
        fused_moe_int(torch.randn(2, 48, device=device), ex, weights, ids)


@pytest.mark.parametrize("kernel", ["_int_gate_up_kernel", "_int_down_kernel"])
# CI compiles the first case; the others (3 s each on 2 cores) run with the slow tests and
# wherever a GPU runs the kernels.
@pytest.mark.parametrize("bits,perm,fp32,tiles", [
    (4, 0, 0, (32, 128, 4)),
    pytest.param(4, 1, 0, (64, 64, 3), marks=pytest.mark.slow),
    pytest.param(8, 0, 0, (32, 128, 4), marks=pytest.mark.slow),
    pytest.param(8, 1, 1, (64, 64, 3), marks=pytest.mark.slow)])
def test_compiles_for_sm90(kernel, bits, perm, fp32, tiles):
    """Each launch compiles for sm_90 offline (scripts/triton_sass.py) without spills at
    both default tiles, with and without act order, bf16 and float32 (the interpreter runs
    code compiled Triton rejects, e.g. branches returning different types)."""

    from tests.kernels.sm90 import compile_sm90

    x = "fp32" if fp32 else "bf16"
    code = compile_sm90(
        f"octavo.kernels.fused_moe_int:{kernel}", "--const", "GROUP=128", f"BITS={bits}",
        f"PERM={perm}", f"FP32_DOT={fp32}", "BLOCK_M=16", f"BLOCK_N={tiles[0]}",
        f"BLOCK_K={tiles[1]}", "--ptr", "qw_ptr=i32", "sorted_ptr=i32", "tiles_ptr=i32", "perm_ptr=i32",
        "weights_ptr=fp32", f"x_ptr={x}", f"h_ptr={x}",
        f"out_ptr={'fp32' if kernel == '_int_down_kernel' else x}", "--div16", "H", "INTER",
        "stride_xt", "stride_hp", "stride_qe", "stride_qk", "stride_se", "stride_sg",
        "stride_pe", "stride_op", "--num-warps", "4", "--num-stages", str(tiles[2]))
    assert code.local_bytes == 0, code.report


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("t", [1, 16, 300])
def test_real_shape_on_the_gpu(bits, t):
    """Qwen3-30B-A3B's experts (E 128, H 2048, I 768, top 8), group 128, bf16."""
    ex = make_experts(e=128, h=2048, inter=768, bits=bits, groups=(128, 128), device="cuda",
                      scale_dtype=torch.bfloat16, seed=7)
    check(ex, t, 8, torch.bfloat16, "cuda", seed=t, scaled=True)


def test_default_tiles_follow_the_h100_sweep():
    """32 columns, K steps of 128 over 4 stages while pairs are fewer than experts (where the
    groups allow); 64 x 64 beyond, and wherever 128 does not divide the groups."""
    ex = make_experts(e=128, h=256, inter=128, groups=(128, 128), device="cpu")
    assert tuple(default_tiles(1, 8, ex)) == (16, 32, 128, 4, 4)
    assert tuple(default_tiles(16, 8, ex)) == (16, 64, 64, 4, 3)
    assert tuple(default_tiles(1, 8, ex._replace(group2=64)))[:3] == (16, 64, 64)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("split_k", [1, 2])
def test_grouped_gemv_rows(bits, dtype, split_k, device):
    """``w4a16_gemv``'s grouped form: row r of the result is x[rows[r]] through expert
    experts[r]'s weight, split over K or not (the split's counters are per (tile, row))."""
    from octavo.kernels.w4a16_gemm import w4a16_gemm_ref
    from octavo.kernels.w4a16_gemv import w4a16_gemv

    ex = make_experts(e=3, h=64, inter=32, bits=bits, groups=(32, 32), device=device,
                      seed=10)
    g = torch.Generator().manual_seed(11)
    x = torch.randn(2, 64, generator=g).to(device, dtype)
    rows = torch.tensor([1, 0, 1, 1, 0], dtype=torch.int32, device=device)
    experts = torch.tensor([2, 2, 0, 1, 1], dtype=torch.int32, device=device)
    got = w4a16_gemv(x, ex.w13, ex.s13, ex.z13, 32, bits, rows=rows, experts=experts,
                     split_k=split_k, block_n=32)
    assert got.shape == (5, 64) and got.dtype == dtype
    for r in range(5):
        e = int(experts[r])
        want = w4a16_gemm_ref(x[int(rows[r])][None].float(), ex.w13[e], ex.s13[e], ex.z13[e],
                              32, bits)
        torch.testing.assert_close(got[r].float(), want[0], **TOL[dtype])


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_gemv_path_matches_reference(bits, dtype, device, monkeypatch):
    """OCTAVO_MOE_INT_GEMV=N: up to N (token, expert) pairs run the grouped GEMV (no
    sorting); act order keeps the tensor-core launches."""
    from octavo.kernels import fused_moe_int as fmi

    monkeypatch.setenv("OCTAVO_MOE_INT_GEMV", "8")
    ex = make_experts(bits=bits, device=device, seed=12)
    assert fmi.gemv_applies(ex, 8) and not fmi.gemv_applies(ex, 9)
    assert not fmi.gemv_applies(make_experts(perm=True, device=device), 2)
    calls = []
    real = fmi._gemv_path
    monkeypatch.setattr(fmi, "_gemv_path", lambda *a: calls.append(1) or real(*a))
    check(ex, 4, 2, dtype, device, seed=13)
    assert calls


def test_the_gemv_path_takes_decode_batches_by_default(monkeypatch):
    from octavo.kernels import fused_moe_int as fmi

    monkeypatch.delenv("OCTAVO_MOE_INT_GEMV", raising=False)
    assert fmi.gemv_applies(make_experts(), 128) and not fmi.gemv_applies(make_experts(), 129)
    monkeypatch.setenv("OCTAVO_MOE_INT_GEMV", "0")
    assert not fmi.gemv_applies(make_experts(), 1)
    monkeypatch.setenv("OCTAVO_MOE_INT_GEMV", "-3")
    with pytest.raises(ValueError, match="OCTAVO_MOE_INT_GEMV must be a non-negative integer"):
        fmi.gemv_applies(make_experts(), 1)


def test_grouped_gemv_compiles_for_sm90():

    from tests.kernels.sm90 import compile_sm90

    code = compile_sm90(
        "octavo.kernels.w4a16_gemv:_int_weight_gemv_kernel", "--const", "GROUP=128",
        "FLUSH=128", "BITS=4", "BLOCK_M=1", "BLOCK_N=512", "BLOCK_P=4", "PAIRED=1", "BYTES=0",
        "ASM=1", "PREFETCH=1", "PDL=0", "GROUPED=1", "--ptr", "qw_ptr=i32", "cnt_ptr=i32",
        "part_ptr=fp32", "rows_ptr=i32", "experts_ptr=i32", "--ones", "stride_qn",
        "stride_sn", "stride_zn", "stride_on", "stride_pn", "--div16", "stride_xm",
        "stride_qk", "N", "K", "K_PER_SPLIT", "stride_sg", "stride_zg", "stride_om",
        "stride_ps", "stride_pm", "stride_qe", "stride_se", "stride_ze", "--num-warps", "4")
    assert code.local_bytes == 0, code.report
