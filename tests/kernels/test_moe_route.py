"""moe_route (routing and expert alignment in one launch) against the torch ops it replaces."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from octavo.kernels import moe_route  # noqa: E402
from octavo.kernels.fused_moe import (  # noqa: E402
    Alignment,
    MoeTiles,
    align_by_expert,
    fused_moe,
    fused_moe_reference,
)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def torch_route(logits, k, renormalize, round_to):
    probs = torch.softmax(logits.float(), dim=-1)
    weights, ids = torch.topk(probs, k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(round_to).float(), ids


def distinct_logits(t, e, dtype, g):
    """Logits without ties in ``dtype`` (multiples of 1/32 in [-2, 2): exact in bf16), so the
    top k is one set whatever the tie rule."""
    return (torch.rand(t, e, generator=g).argsort(1).float() / e * 4 - 2).to(dtype)


def by_expert(align, block_m):
    """The sorted index with each expert's run sorted: the kernel orders the pairs inside a
    run as its atomics land (on the GPU), the torch version in the pairs' order."""
    rows = align.sorted_ids.clone()
    tiles = align.tile_experts.tolist()
    i = 0
    while i < len(tiles):
        j = i
        while j < len(tiles) and tiles[j] == tiles[i]:
            j += 1
        rows[i * block_m:j * block_m] = rows[i * block_m:j * block_m].sort().values
        i = j
    return rows


def assert_same_alignment(got, ref, block_m):
    assert torch.equal(got.tile_experts, ref.tile_experts)
    assert torch.equal(by_expert(got, block_m), by_expert(ref, block_m))
    if not got.sorted_ids.is_cuda:  # the interpreter's atomics land in order
        assert torch.equal(got.sorted_ids, ref.sorted_ids)


# (T, k, E, BLOCK_M): decode shapes (Qwen3-30B-A3B: 128 experts, 8 a token; Qwen2-MoE: 60),
# pairs over several of the kernel's blocks, one expert, BLOCK_M 64, 300 experts (512 padded:
# narrower register tiles).
SHAPES = [(1, 8, 128, 16), (3, 2, 60, 16), (17, 4, 8, 16), (64, 8, 128, 16), (5, 1, 4, 64),
          (40, 8, 128, 64), (33, 2, 3, 16), (9, 8, 300, 16)]


@pytest.mark.parametrize("t,k,e,block_m", SHAPES)
def test_align_is_the_torch_alignment(t, k, e, block_m, device):
    g = torch.Generator().manual_seed(t * 1000 + e)
    ids = torch.rand(t, e, generator=g).argsort(1)[:, :k]
    got = moe_route.align(ids.to(device), e, block_m)
    assert_same_alignment(got, align_by_expert(ids.to(device), e, block_m), block_m)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_align_every_pair_to_one_expert(dtype, device):
    ids = torch.full((50, 2), 5, dtype=dtype)
    ids[:, 1] = 0
    got = moe_route.align(ids.to(device), 8, 16)
    assert_same_alignment(got, align_by_expert(ids.to(device), 8, 16), 16)


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("t,k,e,block_m", SHAPES[:5] + SHAPES[-1:])
def test_route_and_align(t, k, e, block_m, dtype, renormalize, device):
    g = torch.Generator().manual_seed(t * 7 + k)
    logits = (torch.randn(t, e, generator=g) if dtype == torch.float32
              else distinct_logits(t, e, dtype, g)).to(device)
    got = moe_route.route_and_align(logits, k, renormalize, block_m, round_to=dtype)
    weights, ids = torch_route(logits, k, renormalize, dtype)
    assert got.ids.dtype == torch.int32 and got.weights.dtype == torch.float32
    assert torch.equal(got.ids.long(), ids)  # the same experts in the same (descending) order
    tol = dict(rtol=2e-6, atol=1e-7) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-3)
    torch.testing.assert_close(got.weights, weights, **tol)
    assert_same_alignment(got, align_by_expert(ids, e, block_m), block_m)


def test_route_reads_strided_logits(device):
    g = torch.Generator().manual_seed(3)
    wide = torch.randn(6, 40, generator=g).to(device)
    logits = wide[:, 4:36]  # rows 40 apart
    got = moe_route.route_and_align(logits, 3, True, 16)
    weights, ids = torch_route(logits, 3, True, torch.float32)
    assert torch.equal(got.ids.long(), ids)
    torch.testing.assert_close(got.weights, weights, rtol=2e-6, atol=1e-7)


def test_ties_go_to_the_lowest_expert(device):
    logits = torch.zeros(2, 8, device=device)
    logits[1, 6] = logits[1, 2] = 1.0
    got = moe_route.route_and_align(logits, 3, False, 16)
    assert got.ids.tolist() == [[0, 1, 2], [2, 6, 0]]


def test_availability():
    x = torch.empty(1, 4)
    assert moe_route.available(x, 8, 128) == moe_route.interpreting()
    assert not moe_route.available(x, 0, 128)
    assert not moe_route.available(x, moe_route.MAX_PAIRS + 1, 128)
    assert not moe_route.available(x, 8, moe_route.MAX_EXPERTS + 1)


def test_fused_moe_with_a_routed_alignment(device):
    """The layer's decode path: route_and_align's weights, ids and alignment into fused_moe."""
    g = torch.Generator().manual_seed(11)
    t, h, inter, e, k = 9, 48, 40, 8, 2
    x = torch.randn(t, h, generator=g).to(device)
    w13 = (torch.randn(e, 2 * inter, h, generator=g) / h ** 0.5).to(device)
    w2 = (torch.randn(e, h, inter, generator=g) / inter ** 0.5).to(device)
    r = moe_route.route_and_align(torch.randn(t, e, generator=g).to(device), k, True, 16)
    got = fused_moe(x, w13, w2, r.weights, r.ids, tiles=MoeTiles(16, 32, 32),
                    alignment=Alignment(r.sorted_ids, r.tile_experts))
    torch.testing.assert_close(got, fused_moe_reference(x, w13, w2, r.weights, r.ids),
                               atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="tiles of 64"):  # aligned for 16-row tiles
        fused_moe(x, w13, w2, r.weights, r.ids, tiles=MoeTiles(64, 32, 32),
                  alignment=Alignment(r.sorted_ids, r.tile_experts))


@needs_cuda
def test_no_host_sync_and_graph_capture():
    """One launch under sync-debug "error" mode; a captured graph replays new logits."""
    dev = torch.device("cuda")
    logits = torch.randn(16, 128, device=dev, dtype=torch.bfloat16)
    moe_route.route_and_align(logits, 8, True, 16, torch.bfloat16)  # compile first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        moe_route.route_and_align(logits, 8, True, 16, torch.bfloat16)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = moe_route.route_and_align(logits, 8, True, 16, torch.bfloat16)
    g = torch.Generator().manual_seed(5)
    logits.copy_(distinct_logits(16, 128, torch.bfloat16, g).to(dev))
    graph.replay()
    weights, ids = torch_route(logits, 8, True, torch.bfloat16)
    assert torch.equal(out.ids.long(), ids)
    torch.testing.assert_close(out.weights, weights, rtol=1e-2, atol=1e-3)
    assert_same_alignment(out, align_by_expert(ids, 128, 16), 16)


@pytest.mark.parametrize("route", [0, 1])
# CI compiles the largest case; the others (3 s each on 2 cores) with the slow tests.
@pytest.mark.parametrize("tokens,experts", [pytest.param(1, 128, marks=pytest.mark.slow),
                                            pytest.param(64, 128, marks=pytest.mark.slow),
                                            (256, 512)])
def test_compiles_for_sm90(route, tokens, experts):
    """The launch compiles for sm_90 offline (scripts/triton_sass.py, a process of its own)
    without spills: Qwen3-30B-A3B's routing (128 experts, 8 a token) at one and 64 tokens,
    and 512 experts (the register tiles shrink with the experts)."""

    from tests.kernels.sm90 import compile_sm90

    block_t, block_p, block_tiles = moe_route.blocks(tokens, tokens * 8, experts)
    code = compile_sm90(
        "octavo.kernels.moe_route:_route_align_kernel", "--const", "TOPK=8", f"ROUTE={route}",
        "RENORM=1", "ROUND=2", "BLOCK_M=16", f"E_PAD={experts}", "K_PAD=8",
        f"BLOCK_T={block_t}", f"BLOCK_P={block_p}", "BLOCK_R=128",
        f"BLOCK_TILES={block_tiles}", "--ptr", "logits_ptr=bf16", "ids_ptr=i32",
        "weights_ptr=fp32", "rank_ptr=i32", "cnt_ptr=i32", "sorted_ptr=i32", "tiles_ptr=i32",
        "ticket_ptr=i32", "--num-warps", "4")
    assert code.local_bytes == 0, code.report


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_logits_route_in_range(bad, device):
    """A NaN or infinite logit (an overflowed activation) makes its row's softmax NaN: the
    launch still picks k distinct experts in range (never a count or a weight tile outside
    the experts), the other rows route as torch does, and the row's weights stay NaN."""
    g = torch.Generator().manual_seed(9)
    logits = torch.randn(3, 16, generator=g)
    logits[1, 5] = bad
    if bad == float("-inf"):
        logits[1] = bad  # every logit -inf: -inf - -inf is NaN
    got = moe_route.route_and_align(logits.to(device), 4, True, 16)
    ids = got.ids.cpu()
    assert ((ids >= 0) & (ids < 16)).all()
    assert all(len(set(row.tolist())) == 4 for row in ids)
    weights, ref_ids = torch_route(logits[[0, 2]], 4, True, torch.float32)
    assert torch.equal(ids[[0, 2]].long(), ref_ids)
    torch.testing.assert_close(got.weights.cpu()[[0, 2]], weights, rtol=2e-6, atol=1e-7)
    assert got.weights.cpu()[1].isnan().all()
    assert_same_alignment(got, align_by_expert(got.ids, 16, 16), 16)


def test_empty_batch_and_bad_top_k(device):
    logits = torch.empty(0, 8, device=device)
    got = moe_route.route_and_align(logits, 2, True, 16)
    assert got.ids.shape == (0, 2) and got.sorted_ids.numel() == 0
    assert got.tile_experts.numel() == 0
    assert moe_route.align(torch.empty(0, 2, dtype=torch.int32, device=device), 8,
                           16).sorted_ids.numel() == 0
    with pytest.raises(ValueError, match="top_k=9"):
        moe_route.route_and_align(torch.zeros(1, 8, device=device), 9, True, 16)
