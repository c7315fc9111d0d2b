"""swapab_mma's ring and tiled variants (cuda/swapab_mma.cu's STAGES and TILED; swapab_tiled's
layout): the tiled packer and the kernel's tiled addressing on the CPU, the argument checks,
and on the GPU every variant against the float64 reference and against the register-prefetch
kernel (the same sums in the same order: the same bits)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from octavo.kernels import cuda_module, swapab_mma
from octavo.kernels.swapab_tiled import (
    pack_swapab_tiled,
    tile_swapab,
    unpack_swapab_tiled,
    untile_swapab,
)
from octavo.kernels.w4a16_swapab import pack_swapab

VARIANTS = ("tiled", "cp2", "cp3", "cp2_tiled", "cp3_tiled")
RING_NAMES = [f"swapab_mma_{t}_{t}_w4_m8_s4_{v}" for t in ("bf16", "f16") for v in VARIANTS]


def _variant(v: str) -> dict:
    return {"stages": int(v[2]) if v.startswith("cp") else 0, "tiled": v.endswith("tiled")}


# --- the tiled layout ---------------------------------------------------------------------

@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("k,n,steps", [(128, 256, 4), (256, 512, 4), (384, 256, 1),
                                       (256, 1024, 2), (512, 256, 4)])
def test_the_tiled_layout_round_trips_and_keeps_the_shape(bits, k, n, steps):
    q = torch.randint(0, 2**bits, (k, n), generator=torch.Generator().manual_seed(k + n))
    tiled = pack_swapab_tiled(q, bits, steps)
    rows = pack_swapab(q, bits)
    assert tiled.dtype == rows.dtype == torch.int16 and tiled.shape == rows.shape
    assert torch.equal(unpack_swapab_tiled(tiled, bits, steps), q)
    assert torch.equal(untile_swapab(tiled, steps), rows)
    assert torch.equal(tile_swapab(rows, steps), tiled)
    assert not torch.equal(tiled, rows)  # reordered (random data)


def _uint4s(t: torch.Tensor) -> np.ndarray:
    """An int16 tensor's 16-byte pieces, in memory order: [numel / 8, 8] int16."""
    return t.contiguous().numpy().reshape(-1, 8)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("k,n,steps", [(256, 512, 4), (384, 256, 1), (256, 1024, 2)])
def test_each_block_holds_each_lane_s_uint4_in_the_order_the_lanes_load(bits, k, n, steps):
    """Block (tile, chunk c) element (i, h, lane) is the uint4 lane (g, t) loads in the row
    layout for step i, half h: row tile * 16 + 8 h + g, K c * CHUNK + 32 i + 8 t (the
    kernel's ``wa + (k / 32 + i) * 4``), at the kernel's tiled address
    ``(tile * (K / CHUNK) + c) * 64 * steps + (i * 2 + h) * 32 + lane`` (uint4)."""
    q = torch.randint(0, 2**bits, (k, n), generator=torch.Generator().manual_seed(7))
    rows = pack_swapab(q, bits)
    row_u4 = _uint4s(rows)
    tiled_u4 = _uint4s(pack_swapab_tiled(q, bits, steps))
    blocks = tiled_u4.reshape(rows.shape[0] // 16, k // (32 * steps), steps, 2, 32, 8)
    chunk = 32 * steps
    lane = np.arange(32)
    g, t = lane // 4, lane % 4
    for tile in range(rows.shape[0] // 16):
        for c in range(k // chunk):
            for i in range(steps):
                for h in range(2):
                    row = tile * 16 + g + 8 * h
                    # the row layout's uint4 index: (row * K + 8 t) / 8 + (k / 32 + i) * 4
                    kk = c * chunk
                    want = row_u4[(row * k + 8 * t) // 8 + (kk // 32 + i) * 4]
                    np.testing.assert_array_equal(blocks[tile, c, i, h], want)
                    addr = (tile * (k // chunk) + c) * 64 * steps + (i * 2 + h) * 32 + lane
                    np.testing.assert_array_equal(tiled_u4[addr], want)
                    # the same 8 int16: row `row`, K kk + 32 i + 8 t + 0..7
                    r = rows.numpy()
                    np.testing.assert_array_equal(
                        want, r[row[:, None], (kk + 32 * i + 8 * t)[:, None] + np.arange(8)])


def test_the_tiled_packer_rejects_a_k_that_is_not_whole_chunks():
    q = torch.randint(0, 16, (192, 256))
    with pytest.raises(ValueError, match="chunk 128"):
        pack_swapab_tiled(q, 4, 4)
    assert pack_swapab_tiled(q, 4, 2).shape == (64, 192)


# --- the ring's protocol -------------------------------------------------------------------

def _run_ring(chunks: int, stages: int) -> list[int]:
    """cuda/swapab_mma.cu's ring, step by step, for one warp of ``chunks`` chunks: the
    prologue copies chunks 0..STAGES-2 into slots 0.., a group each; iteration j copies chunk
    j + STAGES - 1 into the slot read in iteration j - 1, commits (an empty group past the
    range) and waits until at most STAGES - 1 groups are pending, then reads slot j %
    STAGES. A group completes only when a wait forces it (the latest a GPU may finish it).
    Returns the chunk each iteration read; asserts no copy lands in a slot whose chunk is
    still unread or being read."""
    slots = [None] * stages  # (chunk, its group) per slot
    unread = set()  # slots copied, not read yet
    groups, done = [], 0  # groups committed (their chunks), how many completed
    read = []

    def copy(chunk, slot):
        assert slot not in unread, (chunk, slot)
        slots[slot] = (chunk, len(groups))
        unread.add(slot)

    for s in range(stages - 1):
        if s < chunks:
            copy(s, s)
        groups.append(s)
    slot = 0
    for j in range(chunks):
        if j + stages - 1 < chunks:
            copy(j + stages - 1, stages - 1 if slot == 0 else slot - 1)
        groups.append(j + stages - 1)
        done = max(done, len(groups) - (stages - 1))  # cp.async.wait_group STAGES - 1
        chunk, group = slots[slot]
        assert group < done, (j, "read before its copy completed")
        read.append(chunk)
        unread.discard(slot)
        slot = 0 if slot == stages - 1 else slot + 1
    return read


@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("chunks", range(0, 9))
def test_the_ring_reads_every_chunk_once_in_order_after_its_copy(chunks, stages):
    assert _run_ring(chunks, stages) == list(range(chunks))


def test_the_ring_model_follows_the_source():
    """The model's steps are the kernel's (read from swapab_mma.cu)."""
    src = (cuda_module.SOURCE_DIR / swapab_mma.SOURCE).read_text()
    assert "if (k_begin + s * CHUNK < k_end) copy_chunk(k_begin + s * CHUNK, s);" in src
    assert "if (kn < k_end) copy_chunk(kn, slot == 0 ? STAGES - 1 : slot - 1);" in src
    assert "const int kn = k + (STAGES - 1) * CHUNK;" in src
    loop = src[src.index("const int kn = k + (STAGES - 1) * CHUNK;"):]
    assert loop.index("cp_async_commit();") < loop.index("cp_async_wait<STAGES - 1>();") \
        < loop.index("ca[i] = ring[((slot * STEPS + i) * 2 + 0) * 32];") \
        < loop.index("slot = slot == STAGES - 1 ? 0 : slot + 1;")


# --- the driver's arguments and launch (a recording module stands in for the GPU) ----------

def _inputs(m=1, k=1024, n=512, group=128, dtype=torch.bfloat16, scale_dtype=None, bits=4):
    q = torch.randint(0, 2**bits, (k, n), generator=torch.Generator().manual_seed(0))
    sd = scale_dtype or dtype
    return (torch.randn(m, k).to(dtype), pack_swapab(q, bits),
            torch.rand(k // group, n).to(sd), torch.full((k // group, n), 8.0).to(sd))


class _Recorder:
    def __init__(self):
        self.launches = []

    def launch(self, name, grid, block, args, pdl=False, shared_bytes=0):
        self.launches.append({"name": name, "grid": grid, "block": block,
                              "shared_bytes": shared_bytes, "k_per_warp": args[-2].value})


@pytest.fixture
def recorder(monkeypatch):
    rec = _Recorder()
    monkeypatch.setattr(cuda_module, "loaded", lambda source, device: rec)
    monkeypatch.setattr(swapab_mma, "num_compute_units", lambda device: 132)
    return rec


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("per_sm", [6, 12])
def test_each_variant_launches_its_kernel_with_its_ring(recorder, variant, dtype, per_sm):
    kw = _variant(variant)
    x, qw, s, z = _inputs(m=5, k=4096, n=4096, dtype=dtype)
    swapab_mma.swapab_mma(x, qw, s, z, 128, warps_per_sm=per_sm, **kw)
    (launch,) = recorder.launches
    t = "bf16" if dtype == torch.bfloat16 else "f16"
    assert launch["name"] == f"swapab_mma_{t}_{t}_w4_m8_s4_{variant}"
    warps = launch["block"] // 32
    assert launch["shared_bytes"] == warps * kw["stages"] * 4096  # 4 KB per chunk per warp
    assert launch["shared_bytes"] <= 227 << 10  # an H100 / H200 CTA's most
    assert launch["k_per_warp"] % 128 == 0


def test_the_default_launch_is_unchanged(recorder):
    x, qw, s, z = _inputs(m=3, k=1024, n=512)
    swapab_mma.swapab_mma(x, qw, s, z, 128)
    swapab_mma.swapab_mma(x, qw, s, z, 128, stages=0, tiled=False)
    assert [r["name"] for r in recorder.launches] == ["swapab_mma_bf16_bf16_w4_m8_s4"] * 2
    assert [r["shared_bytes"] for r in recorder.launches] == [0, 0]


def test_the_largest_ring_fits_a_cta():
    assert swapab_mma.ring_bytes(swapab_mma.MAX_WARPS, max(swapab_mma.RING_STAGES)) <= 227 << 10


@pytest.mark.parametrize("why,inputs,kw,match", [
    ("9 rows", dict(m=9), dict(stages=2), "up to 8 rows"),
    ("16 rows tiled", dict(m=16), dict(tiled=True), "up to 8 rows"),
    ("8-bit", dict(bits=8, n=512), dict(stages=3), "4-bit"),
    ("2-step chunks", dict(), dict(stages=2, steps=2), "4-step"),
    ("group 64 (2-step chunks)", dict(group=64), dict(tiled=True), "4-step"),
    ("group 64, 4 steps", dict(group=64), dict(stages=2, steps=4), "whole 128-wide"),
    ("bf16 scales, fp16 x", dict(dtype=torch.float16, scale_dtype=torch.bfloat16),
     dict(tiled=True), "dtype"),
    ("1 stage", dict(), dict(stages=1), "stages must be"),
    ("4 stages", dict(), dict(stages=4, tiled=True), "stages must be"),
])
def test_unsupported_variants_raise_value_error(recorder, why, inputs, kw, match):
    x, qw, s, z = _inputs(**inputs)
    group = inputs.get("group", 128)
    with pytest.raises(ValueError, match=match):
        swapab_mma.swapab_mma(x, qw, s, z, group, inputs.get("bits", 4), **kw)
    assert not recorder.launches, why


def test_the_other_kernels_still_take_mixed_dtypes_and_8_bit(recorder):
    x, qw, s, z = _inputs(scale_dtype=torch.float16)
    swapab_mma.swapab_mma(x, qw, s, z, 128)
    x, qw, s, z = _inputs(bits=8, n=512)
    swapab_mma.swapab_mma(x, qw, s, z, 128, 8)
    assert [r["name"] for r in recorder.launches] == ["swapab_mma_bf16_f16_w4_m8_s4",
                                                      "swapab_mma_bf16_bf16_w8_m8_s4"]


# --- on the GPU ---------------------------------------------------------------------------

gpu = pytest.mark.skipif(not torch.cuda.is_available()
                         or cuda_module.module(swapab_mma.SOURCE, torch.device("cuda")) is None,
                         reason="needs an NVIDIA GPU and nvcc")
SHAPES = [(256, 256), (1024, 512), (4096, 4096), (4096, 28672), (14336, 4096)]


@functools.cache
def _gpu_case(k: int, n: int, dtype: torch.dtype, scale_dtype: torch.dtype | None = None):
    """8 rows of x, the row and tiled layouts, scales, zeros (in ``scale_dtype``, default
    x's) and the float64 reference [8, N] (rows are independent: a batch of m takes the
    first m)."""
    g = torch.Generator().manual_seed(k + n)
    q = torch.randint(0, 16, (k, n), generator=g)
    scales = (torch.rand(k // 128, n, generator=g) * 0.02 + 0.001).to(scale_dtype or dtype)
    zeros = torch.randint(0, 17, (k // 128, n), generator=g).to(scale_dtype or dtype)
    x = torch.randn(8, k, generator=g).to(dtype)
    w = (q.double() - zeros.double().repeat_interleave(128, 0)) \
        * scales.double().repeat_interleave(128, 0)
    ref = x.double() @ w
    rows = pack_swapab(q, 4)
    return (x.cuda(), rows.cuda(), tile_swapab(rows, 4).cuda(), scales.cuda(), zeros.cuda(),
            ref)


def _rel(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("k,n", SHAPES)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype,scale_dtype", [(torch.bfloat16, None),
                                               (torch.bfloat16, torch.float16),
                                               (torch.float16, None)])
def test_ring_and_tiled_match_the_reference_and_the_register_kernel_gpu(dtype, scale_dtype,
                                                                          variant, k, n):
    """Every batch 1, 2, 5, 8 and 6, 10, 12 warps per SM (one CTA per tile, several, idle
    warps): the float64 reference within the other GPU tests' tolerance, and the register
    pipeline's output bit for bit (the same products and sums in the same order; only where
    the weights wait differs)."""
    from octavo.kernels import split_k

    kw = _variant(variant)
    x8, rows, tiled, s, z, ref8 = _gpu_case(k, n, dtype, scale_dtype)
    qw = tiled if kw["tiled"] else rows
    for m in (1, 2, 5, 8):
        for per_sm in (6, 10, 12):
            x, ref = x8[:m], ref8[:m]
            out = swapab_mma.swapab_mma(x, qw, s, z, 128, warps_per_sm=per_sm, steps=4, **kw)
            base = swapab_mma.swapab_mma(x, rows, s, z, 128, warps_per_sm=per_sm, steps=4)
            assert out.dtype == dtype and out.shape == (m, n), (m, per_sm)
            assert torch.isfinite(out).all(), (m, per_sm)
            assert _rel(out, ref) < (8e-3 if dtype == torch.bfloat16 else 2e-3), (m, per_sm)
            assert torch.equal(out, base), (m, per_sm, _rel(out, base))
    torch.cuda.synchronize()
    assert not split_k.counters(x8.device, 1).any()  # every ticket counter back at zero


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("per_sm,most_warps", [(1, 1), (16, 3), (64, 8), (200, 8)])
def test_ring_and_tiled_under_every_split_and_cta_shape_gpu(variant, per_sm, most_warps):
    """One warp per tile to K over several CTAs of up to 8 warps (the ring's largest
    shared memory: 8 x 12 KB for 3 stages, opted in above 48 KB), idle warps in the last CTA
    (their empty copy groups and their ring in the CTA sum)."""
    kw = _variant(variant)
    x8, rows, tiled, s, z, ref8 = _gpu_case(4096, 4096, torch.bfloat16)
    qw = tiled if kw["tiled"] else rows
    out = swapab_mma.swapab_mma(x8[:5], qw, s, z, 128, warps_per_sm=per_sm, steps=4,
                                most_warps=most_warps, **kw)
    base = swapab_mma.swapab_mma(x8[:5], rows, s, z, 128, warps_per_sm=per_sm, steps=4,
                                 most_warps=most_warps)
    assert _rel(out, ref8[:5]) < 8e-3
    assert torch.equal(out, base)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("variant", ["cp3_tiled", "cp2"])
def test_ring_and_tiled_replay_in_a_graph_gpu(variant):
    from tests.quantization.gemm_checks import check_graph_replays

    kw = _variant(variant)
    x8, rows, tiled, s, z, ref8 = _gpu_case(4096, 4096, torch.bfloat16)
    qw = tiled if kw["tiled"] else rows

    def ref(xx):
        return swapab_mma.swapab_mma(xx, rows, s, z, 128).float()

    check_graph_replays(lambda xx: swapab_mma.swapab_mma(xx, qw, s, z, 128, **kw), ref,
                        x8[:4].clone())


def test_the_engine_plan_takes_the_ring_only_where_a_kernel_is_built(monkeypatch):
    bf16, f16 = torch.bfloat16, torch.float16
    plan = swapab_mma.engine_plan
    assert plan(1, 4, 128, bf16, f16) == {"stages": swapab_mma.ENGINE_STAGES,
                                          "warps_per_sm": swapab_mma.WARPS_PER_SM,
                                          "split_ctas": swapab_mma.ENGINE_SPLIT_CTAS}
    monkeypatch.setenv("OCTAVO_SWAPAB_STAGES", "3")
    monkeypatch.setenv("OCTAVO_SWAPAB_WARPS_PER_SM", "12")
    monkeypatch.setenv("OCTAVO_SWAPAB_SPLIT_CTAS", "0")
    assert plan(8, 4, 128, bf16, f16) == {"stages": 3, "warps_per_sm": 12, "split_ctas": False}
    assert plan(8, 4, 128, f16, f16)["stages"] == 3
    # No ring kernel: 9+ rows, 8-bit, 2-step chunks (group 64), fp16 x with bf16 scales.
    for args in ((9, 4, 128, bf16, f16), (1, 8, 128, bf16, bf16), (1, 4, 64, bf16, bf16),
                 (1, 4, 128, f16, bf16)):
        assert plan(*args) == {"stages": 0, "warps_per_sm": 12, "split_ctas": False}, args
    monkeypatch.setenv("OCTAVO_SWAPAB_STAGES", "4")
    with pytest.raises(ValueError, match="OCTAVO_SWAPAB_STAGES"):
        plan(1, 4, 128, bf16, bf16)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("k,n", [(4096, 4096), (14336, 4096), (1024, 512)])
@pytest.mark.parametrize("stages", [0, 3])
def test_plans_without_cta_splits_match_the_reference_gpu(k, n, stages):
    x8, rows, _, s, z, ref8 = _gpu_case(k, n, torch.bfloat16, torch.float16)
    for m in (1, 3, 8):
        for per_sm in (4, 6, 12):
            out = swapab_mma.swapab_mma(x8[:m], rows, s, z, 128, warps_per_sm=per_sm,
                                        stages=stages, split_ctas=False)
            assert _rel(out, ref8[:m]) < 8e-3, (m, per_sm)
