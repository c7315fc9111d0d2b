"""The CUDA C++ decode attention (octavo/kernels/paged_decode.py, cuda/paged_decode.cu): the
launch plan, which launches it takes, the nvcc build, and the kernel's tiles, operand
fragments and merges emulated lane by lane on the CPU against the torch reference; on the
GPU against the reference at real shapes (GQA groups 1-16, both head sizes, every tile and
split, NaN in unused cache slots, mixed batches, graph replays)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from octavo.kernels import cuda_module, paged_decode
from octavo.kernels.paged_attention import paged_attention, paged_attention_ref
from octavo.kernels.paged_decode import Plan, kernel_name, plan, supported
from tests.kernels import cuda_checks
from tests.kernels.test_paged_attention import make_batch

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

NAMES = [f"paged_decode_{t}_d{d}_s{s}{g}" for t in ("bf16", "f16") for d in (64, 128)
         for s in (2, 3, 4, 6, 8) for g in ("", "_g16")]

# --------------------------------------------------------------------------- the plan


@pytest.mark.parametrize("seqs,kv_heads,max_len", [(1, 8, 4096), (2, 8, 300), (16, 8, 4096),
                                                   (32, 8, 400), (256, 8, 4096), (1, 1, 20)])
def test_plan_splits_only_what_cannot_fill_the_gpu(seqs, kv_heads, max_len, monkeypatch):
    monkeypatch.delenv("OCTAVO_CUDA_ATTN_TILE", raising=False)
    monkeypatch.delenv("OCTAVO_CUDA_ATTN_PART", raising=False)
    dev = torch.device("cpu")  # 4 "SMs" there
    p = plan(seqs, kv_heads, max_len, dev)
    assert (p.warps, p.stages) == (paged_decode.DEFAULT_WARPS, paged_decode.DEFAULT_STAGES)
    assert p.min_part == 16 * p.warps
    pairs = seqs * kv_heads
    if pairs >= 4:
        assert p.splits == 1
    else:
        assert 1 < p.splits <= -(-max_len // p.min_part) or max_len <= p.min_part
    assert p.shared_bytes(128) == p.warps * p.stages * 8192


def test_plan_overrides(monkeypatch):
    monkeypatch.setenv("OCTAVO_CUDA_ATTN_TILE", "8,4")
    monkeypatch.setenv("OCTAVO_CUDA_ATTN_PART", "500")
    p = plan(256, 8, 4096, torch.device("cpu"))
    assert (p.warps, p.stages, p.min_part, p.splits) == (4, 4, 512, 8)  # 8 x 4 x 8 KB > 227 KB
    monkeypatch.setenv("OCTAVO_CUDA_ATTN_TILE", "8,8")
    assert plan(256, 8, 4096, torch.device("cpu")).warps == 2
    monkeypatch.setenv("OCTAVO_CUDA_ATTN_TILE", "3,3")
    with pytest.raises(ValueError, match="OCTAVO_CUDA_ATTN_TILE"):
        plan(1, 1, 16, torch.device("cpu"))
    monkeypatch.setenv("OCTAVO_CUDA_ATTN_TILE", "4,3")
    monkeypatch.setenv("OCTAVO_CUDA_ATTN_PART", "8")
    with pytest.raises(ValueError, match="OCTAVO_CUDA_ATTN_PART"):
        plan(1, 1, 16, torch.device("cpu"))


def test_supported_shapes():
    def case(heads=16, kv=8, d=128, bs=16, dtype=torch.bfloat16, cache_dtype=None):
        q = torch.zeros(2, heads, d, dtype=dtype)
        kc = torch.zeros(4, bs, kv, d, dtype=cache_dtype or dtype)
        i32 = torch.zeros(3, dtype=torch.int32)
        return supported(q, kc, kc, i32, i32[:2], torch.zeros(2, 4, dtype=torch.int32))

    assert case() and case(d=64) and case(heads=16, kv=1) and case(dtype=torch.float16)
    assert not case(d=96) and not case(d=256) and not case(bs=8) and not case(heads=32, kv=1)
    assert not case(dtype=torch.float32) and not case(cache_dtype=torch.float8_e4m3fn)


def test_switch_and_no_gpu(monkeypatch):
    assert paged_decode.module_for(torch.device("cpu")) is None
    monkeypatch.setattr(cuda_module, "module", lambda source, device: "built")
    monkeypatch.delenv("OCTAVO_CUDA_ATTENTION", raising=False)
    assert paged_decode.module_for(torch.device("cuda", 0)) is None  # off by default
    monkeypatch.setenv("OCTAVO_CUDA_ATTENTION", "1")
    assert paged_decode.module_for(torch.device("cuda", 0)) == "built"
    monkeypatch.setenv("OCTAVO_CUDA_ATTENTION", "0")
    assert paged_decode.module_for(torch.device("cuda", 0)) is None


def test_takes_launches_of_a_pair_per_sm(monkeypatch):
    cpu = torch.device("cpu")  # 4 "SMs"
    monkeypatch.delenv("OCTAVO_CUDA_ATTN_MIN_PAIRS", raising=False)
    assert paged_decode.takes(1, 4, cpu) and paged_decode.takes(2, 2, cpu)
    assert not paged_decode.takes(1, 3, cpu)
    monkeypatch.setenv("OCTAVO_CUDA_ATTN_MIN_PAIRS", "0")
    assert paged_decode.takes(1, 1, cpu)


def test_kernel_names():
    assert kernel_name(torch.bfloat16, 128, 3, 2) == "paged_decode_bf16_d128_s3"
    assert kernel_name(torch.float16, 64, 2, 9) == "paged_decode_f16_d64_s2_g16"
    assert set(NAMES) == {kernel_name(dt, d, s, g) for dt in (torch.bfloat16, torch.float16)
                          for d in (64, 128) for s in (2, 3, 4, 6, 8) for g in (8, 16)}


@pytest.mark.skipif(cuda_module.nvcc_path() is None, reason="needs nvcc")
def test_builds_every_kernel_without_spills(tmp_path, monkeypatch):
    spilled = cuda_checks.build_once(paged_decode.SOURCE, NAMES, tmp_path, monkeypatch)
    assert spilled == {name: 0 for name in NAMES}


# ------------------------------------------------------- the kernel emulated lane by lane


def _swizzle_k(row):
    return (row & 1) << 2


def _swizzle_v(row):
    return ((row >> 1) & 3) << 1


@pytest.mark.parametrize("d", [64, 128])
def test_ring_layout_round_trips_without_bank_conflicts(d):
    """cuda/paged_decode.cu's shared-memory tile: the warp's copies (chunk e = 32 q + lane)
    put every (row, chunk) where the operand reads look for it, and every 8-lane phase of a
    copy or a read touches 8 distinct 16-byte bank groups."""
    ch = d // 8
    for swz in (_swizzle_k, _swizzle_v):
        written = {}
        for q in range(16 * ch // 32):
            groups = [set() for _ in range(4)]
            for lane in range(32):
                row, c = divmod(32 * q + lane, ch)
                pos = row * ch + (c ^ swz(row))
                written[row, c] = pos
                groups[lane // 8].add(pos % 8)
            assert all(len(gr) == 8 for gr in groups)
        assert sorted(written.values()) == list(range(16 * ch))  # a permutation of the tile
    reads = []
    for j in range(2):
        for i in range(d // 32):
            reads.append(("k", [(8 * j + g, 4 * i + t) for g in range(8) for t in range(4)]))
    for r in range(4):
        for c in range(d // 64):
            reads.append(("v", [(2 * t + (r & 1) + 8 * (r >> 1), 8 * c + g)
                                for g in range(8) for t in range(4)]))
    for kind, lanes in reads:  # lane = 4 g + t
        swz = _swizzle_k if kind == "k" else _swizzle_v
        pos = [row * ch + (c ^ swz(row)) for row, c in lanes]
        for phase in range(4):
            assert len({x % 8 for x in pos[8 * phase:8 * phase + 8]}) == 8

LANES = np.arange(32)
G_OF, T_OF = LANES // 4, LANES % 4


def _bf16(x):
    return torch.from_numpy(np.asarray(x, dtype=np.float32)).to(torch.bfloat16).float().numpy()


def _mma(c, a, b):
    """m16n8k16 on fragments: a [32, 4 regs, 2 halves], b [32, 2, 2], c [32, 4] (PTX's
    mma.m16n8k16 .row.col layouts), returns c + A @ B as fragments."""
    A = np.zeros((16, 16))
    B = np.zeros((16, 8))
    for lane in range(32):
        g, t = divmod(lane, 4)
        for r in range(4):
            for e in range(2):
                A[g + 8 * (r & 1), 2 * t + e + 8 * (r >> 1)] = a[lane, r, e]
        for r in range(2):
            for e in range(2):
                B[2 * t + e + 8 * r, g] = b[lane, r, e]
    C = A @ B
    out = c.copy()
    for lane in range(32):
        g, t = divmod(lane, 4)
        for i in range(4):
            out[lane, i] += C[g + 8 * (i >> 1), 2 * t + (i & 1)]
    return out


def _words(v8):
    """[32, 8] values of a lane's 16-byte load as its four 32-bit words [32, 4, 2]."""
    return v8.reshape(32, 4, 2)


def _quad(v, op):
    return np.array([op(v[(lane // 4) * 4:(lane // 4) * 4 + 4]) for lane in range(32)])


def _emulate(q, kc, vc, qsl, seq_lens, bt, scale, p: Plan):
    """The kernel's arithmetic, lane by lane, in float64 (P rounded to bf16 as it is packed),
    for every decode of the batch: [T, H, D] (rows of other requests zero)."""
    T, H, D = q.shape
    bs, Hkv = kc.shape[1], kc.shape[2]
    G = H // Hkv
    KS, JD = D // 32, D // 8
    qk_scale = scale * math.log2(math.e)
    out = np.zeros((T, H, D))
    for b in range(len(seq_lens)):
        if qsl[b + 1] - qsl[b] != 1:
            continue
        tok_q, seq_len = qsl[b], seq_lens[b]
        share = -(-seq_len // p.splits)
        part = max(-(-share // 16) * 16, p.min_part)
        used = -(-seq_len // part)

        def key(n, h, b=b):
            return kc[bt[b, n // bs], n % bs, h]

        def value(n, h, b=b):
            return vc[bt[b, n // bs], n % bs, h]

        for kvh in range(Hkv):
            parts = []
            for split in range(used):
                lo, hi = split * part, min(split * part + part, seq_len)
                tiles = -(-(hi - lo) // 16)
                qa = np.zeros((32, KS, 8))
                qb = np.zeros((32, KS, 8))
                for lane in range(32):
                    g, t = G_OF[lane], T_OF[lane]
                    for i in range(KS):
                        if g < G:
                            qa[lane, i] = q[tok_q, kvh * G + g, 32 * i + 8 * t:32 * i + 8 * t + 8]
                        if g + 8 < G:
                            qb[lane, i] = q[tok_q, kvh * G + g + 8,
                                            32 * i + 8 * t:32 * i + 8 * t + 8]
                warps = []
                for warp in range(p.warps):
                    o = np.zeros((JD, 32, 4))
                    m = np.full((32, 2), -1e30)
                    ll = np.zeros((32, 2))
                    for u in range(warp, tiles, p.warps):
                        ts = lo + 16 * u
                        s = [np.zeros((32, 4)), np.zeros((32, 4))]
                        for i in range(KS):
                            for j in range(2):
                                kv = np.zeros((32, 8))
                                for lane in range(32):
                                    n = ts + 8 * j + G_OF[lane]
                                    if n < hi:
                                        d0 = 32 * i + 8 * T_OF[lane]
                                        kv[lane] = key(n, kvh)[d0:d0 + 8]
                                wq, wqb, wk = _words(qa[:, i]), _words(qb[:, i]), _words(kv)
                                for h in range(2):
                                    a = np.stack([wq[:, 2 * h], wqb[:, 2 * h], wq[:, 2 * h + 1],
                                                  wqb[:, 2 * h + 1]], 1)
                                    s[j] = _mma(s[j], a, np.stack([wk[:, 2 * h],
                                                                   wk[:, 2 * h + 1]], 1))
                        sc = np.zeros((2, 32, 4))
                        for j in range(2):
                            for i in range(4):
                                n = ts + 8 * j + 2 * T_OF + (i & 1)
                                sc[j, :, i] = np.where(n < hi, s[j][:, i] * qk_scale, -np.inf)
                        pr = np.zeros((2, 32, 4))
                        for row, cols in ((0, (0, 1)), (1, (2, 3))):
                            mx = _quad(sc[:, :, cols].max(axis=(0, 2)), np.max)
                            mn = np.maximum(m[:, row], mx)
                            alpha = np.exp2(m[:, row] - mn)
                            ll[:, row] *= alpha
                            o[:, :, cols[0]] *= alpha
                            o[:, :, cols[1]] *= alpha
                            m[:, row] = mn
                            for j in range(2):
                                for c in cols:
                                    pr[j, :, c] = np.exp2(sc[j, :, c] - mn)
                            ll[:, row] += pr[:, :, cols].sum(axis=(0, 2))
                        pr = _bf16(pr)
                        pa = np.stack([pr[0, :, 0:2], pr[0, :, 2:4], pr[1, :, 0:2],
                                       pr[1, :, 2:4]], 1)
                        v = np.zeros((4, 32, D // 8))
                        for r in range(4):
                            for lane in range(32):
                                n = ts + 2 * T_OF[lane] + (r & 1) + 8 * (r >> 1)
                                if n < hi:  # dims 64 c + 8 g + [0, 8) for each c
                                    g = G_OF[lane]
                                    v[r, lane] = value(n, kvh).reshape(D // 64, 8, 8)[:, g].ravel()
                        for jd in range(JD):
                            bfr = np.stack([np.stack([v[0, :, jd], v[1, :, jd]], 1),
                                            np.stack([v[2, :, jd], v[3, :, jd]], 1)], 1)
                            o[jd] = _mma(o[jd], pa, bfr)
                    ll = np.stack([_quad(ll[:, r], np.sum) for r in range(2)], 1)
                    red = np.zeros((16, D))
                    for jd in range(JD):
                        for lane in range(32):
                            g, t = G_OF[lane], T_OF[lane]
                            for i in range(4):
                                dim = 64 * (jd >> 3) + 8 * (2 * t + (i & 1)) + (jd & 7)
                                red[g + 8 * (i >> 1), dim] = o[jd, lane, i]
                    rows_m = np.zeros(16)
                    rows_l = np.zeros(16)
                    for lane in range(0, 32, 4):
                        g = G_OF[lane]
                        rows_m[g], rows_m[g + 8] = m[lane]
                        rows_l[g], rows_l[g + 8] = ll[lane]
                    warps.append((rows_m, rows_l, red))
                mx = np.max([w[0] for w in warps], axis=0)
                num = sum(np.exp2(w[0] - mx)[:, None] * w[2] for w in warps)
                den = sum(np.exp2(w[0] - mx) * w[1] for w in warps)
                parts.append((mx, den, num))
            mx = np.max([pt[0] for pt in parts], axis=0)
            num = sum(np.exp2(pt[0] - mx)[:, None] * pt[2] for pt in parts)
            den = sum(np.exp2(pt[0] - mx) * pt[1] for pt in parts)
            out[tok_q, kvh * G:kvh * G + G] = (num / den[:, None])[:G]
    return out


@pytest.mark.parametrize("heads,kv,d,seq_lens,p", [
    (4, 2, 64, [40, 7, 16], Plan(2, 2, 1, 32)),            # GQA 2, tails, idle warps
    (8, 2, 64, [70], Plan(4, 3, 3, 64)),                   # parts of >= 64 keys: 2 used
    (16, 1, 64, [33, 17], Plan(1, 2, 2, 16)),               # a group of 16: rows g + 8
    (2, 2, 128, [20], Plan(2, 2, 1, 32)),                   # no GQA, head_dim 128
])
def test_emulated_kernel_matches_reference(heads, kv, d, seq_lens, p):
    q, kc, vc, qsl, sl, bt = make_batch([1] * len(seq_lens), seq_lens, heads, kv, d, 16,
                                        torch.bfloat16, "cpu")
    scale = d ** -0.5
    ref = paged_attention_ref(q.float(), kc.float(), vc.float(), qsl, sl, bt, scale)
    got = _emulate(q.float().numpy().astype(np.float64), kc.float().numpy().astype(np.float64),
                   vc.float().numpy().astype(np.float64), qsl.tolist(), sl.tolist(),
                   bt.numpy(), scale, p)
    np.testing.assert_allclose(got, ref.numpy(), atol=2e-2, rtol=2e-2)


# ------------------------------------------------------------------------------- GPU

TOL = {torch.bfloat16: dict(atol=2e-2, rtol=2e-2), torch.float16: dict(atol=3e-3, rtol=3e-3)}


def _run(q_lens, seq_lens, heads, kv, d, dtype, tile=None, part=None, block_size=16,
         nan_pad=True, monkeypatch=None):
    q, kc, vc, qsl, sl, bt = make_batch(q_lens, seq_lens, heads, kv, d, block_size, dtype,
                                        "cuda")
    if nan_pad:  # unused slots of the last blocks hold NaN: masked and zero-filled
        for b, n in enumerate(seq_lens):
            if n % block_size:
                blk = bt[b, n // block_size]
                kc[blk, n % block_size:] = float("nan")
                vc[blk, n % block_size:] = float("nan")
    monkeypatch.setenv("OCTAVO_CUDA_ATTENTION", "1")
    monkeypatch.setenv("OCTAVO_CUDA_ATTN_MIN_PAIRS", "0")  # every launch, split or not
    if tile is not None:
        monkeypatch.setenv("OCTAVO_CUDA_ATTN_TILE", f"{tile[0]},{tile[1]}")
    if part is not None:
        monkeypatch.setenv("OCTAVO_CUDA_ATTN_PART", str(part))
    scale = d ** -0.5
    out = torch.zeros_like(q)
    paged_attention(q, kc, vc, qsl, sl, bt, scale, out=out,
                    max_query_len=max(q_lens))
    ref = paged_attention_ref(q, kc, vc, qsl, sl, bt, scale)
    return out, ref


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads,kv,d", [(16, 8, 128), (32, 8, 128), (8, 8, 128), (64, 8, 128),
                                        (16, 1, 128), (9, 3, 64), (14, 2, 64)])
@pytest.mark.parametrize("tile,part", [(None, None), ((4, 2), None), ((2, 4), 64),
                                       ((8, 2), 256), ((1, 3), None), ((4, 4), 16),
                                       ((2, 8), None), ((4, 6), 128)])
def test_gpu_matches_reference(dtype, heads, kv, d, tile, part, monkeypatch):
    seq_lens = [1, 15, 16, 17, 100, 300, 1000, 2049, 33, 4096]
    out, ref = _run([1] * len(seq_lens), seq_lens, heads, kv, d, dtype, tile, part,
                    monkeypatch=monkeypatch)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), ref.float(), **TOL[dtype])


@gpu
@needs_cuda
@pytest.mark.parametrize("heads,kv,d", [(16, 8, 128), (32, 8, 128), (9, 3, 64), (16, 16, 64)])
@pytest.mark.parametrize("tile,part", [(None, None), ((4, 4), 64), ((4, 2), None)])
def test_gpu_a_warp_per_kv_head(heads, kv, d, tile, part, monkeypatch):
    """OCTAVO_CUDA_ATTN_FLAGS=4: one CTA per request and part, a warp per KV head (more than
    8 KV heads keep the default grid)."""
    monkeypatch.setenv("OCTAVO_CUDA_ATTN_FLAGS", "4")
    seq_lens = [1, 15, 16, 17, 100, 300, 1000, 2049, 33, 4096]
    out, ref = _run([1] * len(seq_lens), seq_lens, heads, kv, d, torch.bfloat16, tile, part,
                    monkeypatch=monkeypatch)
    torch.testing.assert_close(out.float(), ref.float(), **TOL[torch.bfloat16])


@gpu
@needs_cuda
@pytest.mark.parametrize("batch,ctx", [(1, 128), (1, 4000), (2, 300), (8, 2000), (32, 284),
                                       (128, 1028), (256, 600)])
def test_gpu_real_batches(batch, ctx, monkeypatch):
    gen = torch.Generator().manual_seed(batch)
    seq_lens = torch.randint(max(1, ctx // 2), ctx + 1, (batch,), generator=gen).tolist()
    for heads in ((16, 8), (32, 8)):
        out, ref = _run([1] * batch, seq_lens, heads[0], heads[1], 128, torch.bfloat16,
                        monkeypatch=monkeypatch)
        torch.testing.assert_close(out.float(), ref.float(), **TOL[torch.bfloat16])


@gpu
@needs_cuda
def test_gpu_mixed_batch_leaves_prefills_to_triton(monkeypatch):
    q_lens = [1, 37, 1, 1, 300, 1]
    seq_lens = [500, 37, 17, 4000, 900, 3]
    out, ref = _run(q_lens, seq_lens, 16, 8, 128, torch.bfloat16, nan_pad=False,
                    monkeypatch=monkeypatch)
    torch.testing.assert_close(out.float(), ref.float(), **TOL[torch.bfloat16])


@gpu
@needs_cuda
def test_gpu_graph_replays_and_counters_left_zeroed(monkeypatch):
    """Captured once with a long context bound, replayed over new lengths: every part's
    ticket counter is zero again after each replay."""
    from octavo.kernels.split_k import counters

    q, kc, vc, qsl, sl, bt = make_batch([1, 1], [4096, 4096], 32, 8, 128, 16,
                                        torch.bfloat16, "cuda")
    sl.copy_(torch.tensor([3000, 50], dtype=torch.int32))
    scale = 128 ** -0.5
    out = torch.empty_like(q)
    mod = cuda_module.loaded(paged_decode.SOURCE, q.device)
    p = paged_decode.plan(2, 8, 4096, q.device)
    assert p.splits > 1
    paged_decode.paged_decode(out, q, kc, vc, qsl, sl, bt, scale, 4096, mod)  # warm
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        paged_decode.paged_decode(out, q, kc, vc, qsl, sl, bt, scale, 4096, mod)
    for lens in ([3000, 50], [17, 2900], [1, 1], [4096, 4096]):
        sl.copy_(torch.tensor(lens, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        ref = paged_attention_ref(q, kc, vc, qsl, sl, bt, scale)
        torch.testing.assert_close(out.float(), ref.float(), **TOL[torch.bfloat16])
        assert int(counters(q.device, 16)[:16].abs().sum()) == 0
