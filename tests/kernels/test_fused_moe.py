"""fused_moe (two grouped Triton GEMMs over expert-sorted rows) against its torch reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from octavo.kernels.fused_moe import (  # noqa: E402
    MoeTiles,
    align_by_expert,
    default_tiles,
    fused_moe,
    fused_moe_reference,
    padded_rows,
    supports,
)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
TOL = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}
# Small tiles keep the interpreter quick and leave K / N tails (H = 48, I = 40) to the masks.
SMALL = MoeTiles(block_m=16, block_n=32, block_k=32)


def make_case(t, h, inter, e, k, dtype, device, seed=0, ids=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g).to(device, dtype)
    w13 = (torch.randn(e, 2 * inter, h, generator=g) / h ** 0.5).to(device, dtype)
    w2 = (torch.randn(e, h, inter, generator=g) / inter ** 0.5).to(device, dtype)
    if ids is None:
        ids = torch.rand(t, e, generator=g).argsort(dim=1)[:, :k]  # k distinct experts
    weights = torch.softmax(torch.randn(t, k, generator=g), dim=1)
    return x, w13, w2, weights.to(device), ids.to(device, torch.int32)


def check(x, w13, w2, weights, ids, tiles=SMALL):
    got = fused_moe(x, w13, w2, weights, ids, tiles=tiles)
    assert got.shape == x.shape and got.dtype == x.dtype
    ref = fused_moe_reference(x, w13, w2, weights, ids)
    torch.testing.assert_close(got.float(), ref.float(), **TOL[x.dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("e", [4, 8])
@pytest.mark.parametrize("t", [1, 3, 17])
def test_matches_reference(t, e, k, dtype, device):
    check(*make_case(t, 48, 40, e, k, dtype, device, seed=t * 100 + e * 10 + k))


def test_an_expert_without_tokens_and_int64_ids(device):
    # Experts 1 and 3 of 4 receive nothing; ids as int64.
    ids = torch.tensor([[0, 2], [2, 0], [0, 2], [2, 0], [0, 2]], dtype=torch.int64)
    x, w13, w2, weights, _ = make_case(5, 48, 40, 4, 2, torch.float32, device)
    check(x, w13, w2, weights, ids.to(device))


def test_all_tokens_to_one_expert(device):
    # 17 rows of one expert span two 16-row tiles.
    ids = torch.full((17, 1), 5, dtype=torch.int32)
    check(*make_case(17, 48, 40, 8, 1, torch.float32, device, ids=ids))


def test_default_tiles(device):
    # 64-row tiles (T * k >= 32 E) and 64-wide N / K tiles over H = 48, I = 40.
    check(*make_case(64, 48, 40, 4, 2, torch.float32, device, seed=7), tiles=None)
    # Decode tiles: K steps of 128 in bf16 (past H = 48 and I = 40: the masks), 64 in float32.
    check(*make_case(3, 48, 40, 4, 2, torch.bfloat16, device, seed=8), tiles=None)
    assert default_tiles(3, 2, 4, torch.bfloat16) == MoeTiles(16, 64, 128)
    assert default_tiles(3, 2, 4, torch.float32) == MoeTiles(16, 64, 64)


def test_empty_batch(device):
    x, w13, w2, weights, ids = make_case(0, 48, 40, 4, 2, torch.float32, device)
    assert fused_moe(x, w13, w2, weights, ids).shape == (0, 48)


def test_reference_against_einsum():
    x, w13, w2, weights, ids = make_case(5, 24, 12, 4, 2, torch.float32, torch.device("cpu"))
    idx = ids.long()
    gate_up = torch.einsum("th,tjnh->tjn", x, w13[idx])  # [T, k, 2I]
    act = F.silu(gate_up[..., :12]) * gate_up[..., 12:]
    down = torch.einsum("tji,tjhi->tjh", act, w2[idx])  # [T, k, H]
    expected = (down * weights[..., None]).sum(1)
    torch.testing.assert_close(fused_moe_reference(x, w13, w2, weights, ids), expected,
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("block_m", [16, 64])
def test_alignment_sizes_depend_only_on_the_shape(block_m):
    t, k, e = 9, 2, 8
    spread = torch.arange(t * k).view(t, k) % e
    one = torch.zeros(t, k, dtype=torch.int64)
    one[:, 1] = 1
    a, b = align_by_expert(spread, e, block_m), align_by_expert(one, e, block_m)
    assert a.sorted_ids.shape == b.sorted_ids.shape == (padded_rows(t * k, e, block_m),)
    assert a.tile_experts.shape == b.tile_experts.shape
    for align, ids in ((a, spread), (b, one)):
        rows = align.sorted_ids.view(-1, block_m).long()
        real = rows < t * k
        # Every pair appears once; each tile's real rows belong to the tile's expert.
        assert torch.equal(rows[real].sort().values, torch.arange(t * k))
        tile_e = align.tile_experts.long()[:, None].expand_as(rows)
        assert torch.equal(ids.reshape(-1)[rows[real]], tile_e[real])
        assert (align.tile_experts[~real.any(1)] == e).all()  # tiles past the end: sentinel


def test_supports(device):
    # On the CPU the interpreter is on for these tests (conftest), so CPU tensors qualify.
    w13, w2 = torch.empty(4, 80, 48, device=device), torch.empty(4, 48, 40, device=device)
    x = torch.empty(3, 48, device=device)
    assert supports(x, w13, w2)
    assert not supports(x.half(), w13, w2)
    assert not supports(x, w13, torch.empty(4, 40, 48))
    assert not supports(x, w13.transpose(1, 2).contiguous().transpose(1, 2), w2)
    assert not supports(x.int(), w13.int(), w2.int())


@needs_cuda
def test_no_host_sync_and_graph_capture():
    """The whole call runs under sync-debug "error" mode and replays from a CUDA graph with a
    new routing written into the captured inputs."""
    x, w13, w2, weights, ids = make_case(5, 64, 48, 8, 2, torch.bfloat16, torch.device("cuda"))
    fused_moe(x, w13, w2, weights, ids)  # compile outside the capture
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fused_moe(x, w13, w2, weights, ids)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_moe(x, w13, w2, weights, ids)
    ids.copy_(torch.tensor([[7, 0]] * 5, dtype=torch.int32))
    graph.replay()
    torch.testing.assert_close(out, fused_moe_reference(x, w13, w2, weights, ids),
                               **TOL[torch.bfloat16])
    assert torch.equal(out, fused_moe(x, w13, w2, weights, ids))  # deterministic


@pytest.mark.parametrize("kernel", ["_gate_up_kernel", "_down_kernel"])
# CI compiles bf16 at 512 tokens; the rest (3 s each on 2 cores) with the slow tests.
@pytest.mark.parametrize("dtype", ["bf16", pytest.param("fp32", marks=pytest.mark.slow)])
@pytest.mark.parametrize("tokens", [pytest.param(1, marks=pytest.mark.slow), 512])
def test_default_tiles_compile_for_sm90(kernel, dtype, tokens):
    """The default tiles (decode: 16 x 64 x 128, float32 16 x 64 x 64; 64 x 64 x 64 once
    experts average 32 rows), three stages, compile for sm_90 offline (scripts/triton_sass.py,
    in a process of its own) without spills and within an H200 SM's shared memory (the early
    return on the sentinel expert included)."""
    import re

    from tests.kernels.sm90 import compile_sm90

    fp32 = dtype == "fp32"
    tiles = default_tiles(tokens, 8, 128, torch.float32 if fp32 else torch.bfloat16)
    ptrs = ["sorted_ptr=i32", "tiles_ptr=i32"]
    if kernel == "_gate_up_kernel":
        ptrs += [f"{name}={dtype}" for name in ("x_ptr", "w_ptr", "out_ptr")]
        div16 = ["stride_xt", "stride_we", "stride_wn", "stride_op", "H", "INTER"]
    else:
        ptrs += [f"{name}={dtype}" for name in ("h_ptr", "w_ptr")]
        ptrs += ["weights_ptr=fp32", "out_ptr=fp32"]
        div16 = ["stride_hp", "stride_we", "stride_wn", "stride_op", "H", "INTER"]
    code = compile_sm90(
        f"octavo.kernels.fused_moe:{kernel}", "--const", f"BLOCK_M={tiles.block_m}",
        f"BLOCK_N={tiles.block_n}", f"BLOCK_K={tiles.block_k}", f"FP32_DOT={int(fp32)}",
        "--ptr", *ptrs, "--div16", *div16, "--num-warps", str(tiles.num_warps),
        "--num-stages", str(tiles.num_stages))
    found = re.search(r"local (\d+) B\s+shared (\d+) B", code.report)
    assert found, code.report
    assert int(found.group(1)) == 0, code.report  # no spills
    assert int(found.group(2)) <= 227 * 1024, code.report
