# ruff: noqa: B023, E731
"""Micro-benchmark for paged_attention on a GPU (not collected by pytest).

PYTHONPATH=. python tests/kernels/bench_attention.py [--tune] [--mixed | --w1 | --short | --small | --chunk | --merge]
    [--cfgs BLOCK_N,WARPS,STAGES ...] [--cold]

Decode rows report KV bytes read / GPU time (CUDA-graph replay, so no launch overhead);
prefill rows report causal TFLOP/s next to torch SDPA on contiguous K/V. ``--tune`` also
sweeps tile configurations (used to pick ``_pick_config``); ``--cfgs`` replaces the decode
sweeps' (--w1, --short, --small) lists of configurations with the ones given.

``--cold``: the split-count rows (--w1, --short, --small, --merge) read their K/V from HBM, as
each layer of a decode step does, instead of from L2: one CUDA graph launches the kernel over
enough copies of the caches (>= COLD_BYTES together) that no copy is still in L2 when its
turn comes. Without it a small batch's whole cache (W4's batch 32: ~30 MB) stays in the H200's
50 MB L2 across replays: 12.6 us per launch there against 18.4 us per layer in the engine's
step profile (session 16).
"""

from __future__ import annotations

import sys

import torch
from triton.testing import do_bench, do_bench_cudagraph

import octavo.kernels.paged_attention as pa

DEV = "cuda"


def batch(q_lens, seq_lens, H, Hkv, D, bs=16, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    nblk = [-(-s // bs) for s in seq_lens]
    total = sum(nblk) + 8
    perm = torch.randperm(total, device=DEV, generator=g).to(torch.int32)
    bt = torch.zeros(len(seq_lens), max(nblk), dtype=torch.int32, device=DEV)
    u = 0
    for b, n in enumerate(nblk):
        bt[b, :n] = perm[u : u + n]
        u += n
    kc = torch.randn(total, bs, Hkv, D, device=DEV, dtype=dtype, generator=g)
    vc = torch.randn_like(kc)
    q = torch.randn(sum(q_lens), H, D, device=DEV, dtype=dtype, generator=g)
    qsl = torch.zeros(len(q_lens) + 1, dtype=torch.int32, device=DEV)
    qsl[1:] = torch.tensor(q_lens, device=DEV).cumsum(0)
    sl = torch.tensor(seq_lens, dtype=torch.int32, device=DEV)
    return q, kc, vc, qsl, sl, bt


def t_ms(fn):
    return do_bench(fn, warmup=10, rep=40)


def g_ms(fn):
    """GPU time without Python launch overhead (CUDA graph replay)."""
    return do_bench_cudagraph(fn, rep=40)


def _cfgs(tuned):
    """The decode sweep's tile configurations: the defaults (None), then ``--cfgs``' if given,
    else ``tuned`` under --tune."""
    if "--cfgs" in sys.argv:
        given = []
        for arg in sys.argv[sys.argv.index("--cfgs") + 1:]:
            if arg.startswith("--"):
                break
            given.append(tuple(int(v) for v in arg.split(",")))
        return [None, *given]
    return [None, *(tuned if "--tune" in sys.argv else [])]


def _with_cfg(cfg, fn):
    """``fn()`` with every decode launch forced to the tile ``cfg`` = (BLOCK_N, warps, stages);
    None: the defaults."""
    orig = pa._pick_config
    if cfg is not None:
        pa._pick_config = lambda dec, *a, **kw: (
            pa._Config(1, 16, *cfg) if dec else orig(dec, *a, **kw))
    try:
        return fn()
    finally:
        pa._pick_config = orig


COLD_BYTES = 400 << 20  # eight times the H200's L2
_COLD_COPIES: dict = {}


def _cold_caches(kc, vc):
    """Copies of (kc, vc) adding up to at least COLD_BYTES (the first is the original); kept
    for the caches' lifetime so every row of one batch reuses them."""
    key = (kc.data_ptr(), vc.data_ptr())
    if key not in _COLD_COPIES:
        per = 2 * kc.numel() * kc.element_size()
        n = max(2, -(-COLD_BYTES // per))
        _COLD_COPIES.clear()  # one batch at a time: the previous batch's copies are freed
        _COLD_COPIES[key] = [(kc, vc)] + [(kc.clone(), vc.clone()) for _ in range(n - 1)]
    return _COLD_COPIES[key]


def _decode_ms(args, max_seq_len, ns, **kw):
    """Milliseconds per decode launch: one launch replayed (K/V hot in L2), or under --cold
    one launch per cache copy in one graph (K/V from HBM)."""
    q, kc, vc, qsl, sl, bt = args

    def call(k, v):
        return pa.paged_attention(q, k, v, qsl, sl, bt, 0.1, max_query_len=1,
                                  max_seq_len=max_seq_len, num_splits=ns, **kw)

    if "--cold" not in sys.argv:
        return g_ms(lambda: call(kc, vc))
    from benchmarks.common import graph_timed

    return graph_timed([lambda k=k, v=v: call(k, v) for k, v in _cold_caches(kc, vc)]) / 1e3


def _split_row(args, splits, max_seq_len, fmt):
    """One decode launch timed per forced split count (None: the heuristic), formatted."""
    row = []
    for ns in splits:
        try:
            ms = _decode_ms(args, max_seq_len, ns)
            row.append(f"s={ns}:{fmt(ms)}")
        except Exception as e:  # noqa: BLE001 - a config that does not fit
            row.append(f"s={ns}:err {type(e).__name__}")
    return " ".join(row)


def cpu_us(fn, n=200):
    import time

    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def decode(tune):
    H, Hkv, D = 32, 8, 128
    print(
        "decode (H=32, Hkv=8, D=128, bf16): B ctx | ms | GB/s  for splits=1 / heuristic(n) / forced"
    )
    for B in [1, 4, 16, 64, 256]:
        for ctx in [512, 2048, 4096, 16384]:
            if B * ctx > 256 * 4096:
                continue
            q, kc, vc, qsl, sl, bt = batch([1] * B, [ctx] * B, H, Hkv, D)
            gb = B * ctx * Hkv * D * 2 * 2 / 1e9
            row = []
            for ns in [1, None, 4, 16]:
                f = lambda: pa.paged_attention(
                    q,
                    kc,
                    vc,
                    qsl,
                    sl,
                    bt,
                    0.1,
                    max_query_len=1,  # noqa: E731
                    max_seq_len=ctx,
                    num_splits=ns,
                )
                ms = g_ms(f)
                row.append(f"s={ns}:{ms * 1e3:7.1f}us {gb / ms * 1e3:6.0f}GB/s")
            n = pa._pick_num_splits(B * Hkv, ctx, q.device)
            if B == 1 and ctx == 512:
                print(
                    "host us/call split=1:",
                    cpu_us(
                        lambda: pa.paged_attention(
                            q, kc, vc, qsl, sl, bt, 0.1, max_query_len=1, num_splits=1
                        )
                    ),
                    "split=4:",
                    cpu_us(
                        lambda: pa.paged_attention(
                            q, kc, vc, qsl, sl, bt, 0.1, max_query_len=1, num_splits=4
                        )
                    ),
                )
            print(f"B={B:4d} ctx={ctx:6d} heur={n:2d} | " + " | ".join(row), flush=True)
    if tune:
        orig = pa._pick_config
        for cfg in [
            (128, 4, 2),
            (64, 4, 3),
            (64, 4, 2),
            (32, 4, 3),
            (128, 4, 2),
            (64, 8, 3),
            (32, 2, 4),
            (16, 2, 4),
        ]:
            pa._pick_config = lambda *a, c=cfg, **kw: pa._Config(1, 16, *c)
            row = []
            for B, ctx in [(64, 4096), (256, 1024), (8, 4096)]:
                q, kc, vc, qsl, sl, bt = batch([1] * B, [ctx] * B, H, Hkv, D)
                gb = B * ctx * Hkv * D * 4 / 1e9
                ms = g_ms(
                    lambda: pa.paged_attention(
                        q, kc, vc, qsl, sl, bt, 0.1, max_query_len=1, max_seq_len=ctx
                    )
                )
                row.append(f"B={B},ctx={ctx}: {gb / ms * 1e3:6.0f}GB/s")
            print("decode cfg BLOCK_N,warps,stages", cfg, " | ".join(row), flush=True)
        pa._pick_config = orig


def prefill(tune):
    print("prefill (bf16, causal): TFLOP/s vs torch SDPA on contiguous K/V")
    cases = [
        ((16, 8, 128), [4096], [4096]),
        ((32, 8, 128), [1024] * 4, [1024] * 4),
        ((32, 8, 128), [512] * 4, [2048] * 4),
        ((16, 8, 64), [2048] * 2, [2048] * 2),
    ]
    cfgs = [None]
    if tune:
        cfgs += [
            (128, 64, 8, 2),
            (128, 64, 4, 2),
            (128, 64, 8, 3),
            (128, 32, 4, 3),
            (64, 64, 4, 3),
            (128, 128, 8, 2),
            (64, 32, 4, 2),
            (64, 64, 4, 2),
        ]
    orig = pa._pick_config
    for (H, Hkv, D), ql, sl_ in cases:
        q, kc, vc, qsl, sl, bt = batch(ql, sl_, H, Hkv, D)
        flops = sum(4 * H * D * (q_ * (s - q_) + q_ * (q_ + 1) / 2) for q_, s in zip(ql, sl_))
        row = []
        for cfg in cfgs:
            if cfg is not None:
                G = Hkv and H // Hkv
                pa._pick_config = lambda *a, c=cfg, G=G, **kw: pa._Config(
                    *pa._rows(c[0], G), *c[1:])
            ms = g_ms(lambda: pa.paged_attention(q, kc, vc, qsl, sl, bt, 0.1))
            pa._pick_config = orig
            row.append(f"{cfg}:{flops / ms / 1e9:5.0f}")
        # SDPA reference on contiguous tensors (first request only)
        L, S = ql[0], sl_[0]
        qq = torch.randn(1, H, L, D, device=DEV, dtype=torch.bfloat16)
        kk = torch.randn(1, Hkv, S, D, device=DEV, dtype=torch.bfloat16)
        try:
            if L == S:
                ms = g_ms(
                    lambda: torch.nn.functional.scaled_dot_product_attention(  # noqa: B023
                        qq, kk, kk, is_causal=True, enable_gqa=True
                    )
                )
                f1 = 4 * H * D * L * (L + 1) / 2
                row.append(f"sdpa:{f1 / ms / 1e9:5.0f}")
        except Exception as e:  # noqa: BLE001
            row.append(f"sdpa err {e}")
        print(f"H={H} Hkv={Hkv} D={D} q={ql} s={sl_} | " + " ".join(row), flush=True)


def mixed():
    H, Hkv, D = 32, 8, 128
    ql = [2048] + [1] * 64
    sl_ = [2048] + [2048] * 64
    q, kc, vc, qsl, sl, bt = batch(ql, sl_, H, Hkv, D)
    ms = g_ms(lambda: pa.paged_attention(q, kc, vc, qsl, sl, bt, 0.1))
    ms_p = g_ms(lambda: pa.paged_attention(q[:2048], kc, vc, qsl[:2], sl[:1], bt[:1], 0.1))
    q2, qsl2 = q[2048:], qsl[1:] - 2048
    ms_d = g_ms(lambda: pa.paged_attention(q2, kc, vc, qsl2, sl[1:], bt[1:], 0.1, max_query_len=1))
    print(
        f"mixed 1x2048 prefill + 64 decodes @2048: {ms * 1e3:.0f}us (prefill alone {ms_p * 1e3:.0f}us,"
        f" decodes alone {ms_d * 1e3:.0f}us)"
    )


def chunk(tune):
    """Chunked prefill of a long prompt: one 508-token chunk at the end of a long context
    beside 4 decodes (benchmarks/long_context.py's step, SmolLM2-135M heads), per split."""
    H, Hkv, D = 9, 3, 64
    print("chunk (H=9, Hkv=3, D=64, bf16): ctx | us per prefill_splits (TFLOP/s)")
    cfgs = [None] + ([(64, 64, 4, 3), (128, 64, 8, 2), (128, 64, 4, 2), (128, 64, 4, 3),
                      (128, 32, 4, 3), (128, 128, 8, 2)] if tune else [])
    orig = pa._pick_config
    for ctx in [2048, 4096, 8192]:
        ql, sl_ = [1] * 4 + [508], [70, 90, 65, 100, ctx]
        q, kc, vc, qsl, sl, bt = batch(ql, sl_, H, Hkv, D)
        flops = 4 * H * D * 508 * (ctx - 508 / 2)
        for cfg in cfgs:
            if cfg is not None:
                pa._pick_config = lambda dec, *a, c=cfg, **kw: (
                    orig(dec, *a, **kw) if dec else pa._Config(*pa._rows(c[0], 3), *c[1:]))
            row = []
            for ns in [1, 2, 3, 4, 5, 6, 7, 8, 12, None]:
                ms = g_ms(lambda: pa.paged_attention(q, kc, vc, qsl, sl, bt, 0.1,
                                                     max_query_len=508, max_seq_len=8256,
                                                     prefill_splits=ns))
                row.append(f"{ns}:{ms * 1e3:5.0f}us({flops / ms / 1e9:3.0f})")
            pa._pick_config = orig
            print(f"ctx={ctx:5d} cfg={cfg} | " + " ".join(row), flush=True)


def w1(tune):
    """W1's decode attention (Qwen3-0.6B heads: H=16, Hkv=8, D=128) at batch 128 and 256
    with W1-like mixed contexts (uniform 100..2048), per tile config and forced split."""
    import random

    H, Hkv, D = 16, 8, 128
    cfgs = _cfgs([(bn, w, s) for bn in (32, 64, 128) for w in (2, 4, 8) for s in (2, 3, 4)
                  if not (bn == 128 and s == 4)])
    print("w1 decode (H=16, Hkv=8, D=128, bf16): GB/s per (BLOCK_N, warps, stages) and split")
    for B in (128, 256):
        rng = random.Random(B)
        ctx = [rng.randint(100, 2048) for _ in range(B)]
        args = batch([1] * B, ctx, H, Hkv, D)
        gb = sum(ctx) * Hkv * D * 2 * 2 / 1e9
        for cfg in cfgs:
            row = _with_cfg(cfg, lambda: _split_row(args, (None, 1, 2, 4), 2048,
                                                    lambda ms: f"{gb / ms * 1e3:5.0f}"))
            print(f"B={B} cfg={cfg} | {row}", flush=True)


def short(tune):
    """W4's decode attention (Qwen3-0.6B heads, contexts 128..384 as prompt 128 + output 256)
    at batch 1-64, with max_seq_len 4096 as the captured decode graphs pass it: microseconds
    per launch (with its split merge) and GB/s per tile config and forced split."""
    import random

    H, Hkv, D = 16, 8, 128
    cfgs = _cfgs([(bn, w, s) for bn in (32, 64, 128) for w in (2, 4) for s in (1, 2, 3)
                  if not (bn == 128 and s == 3)])
    print("short decode (H=16, Hkv=8, D=128, bf16, ctx 128..384, max_seq_len 4096): "
          "us (GB/s) per (BLOCK_N, warps, stages) and split")
    for B in (1, 8, 32, 64):
        rng = random.Random(B)
        ctx = [rng.randint(128, 384) for _ in range(B)]
        q, kc, vc, qsl, sl, bt = batch([1] * B, ctx, H, Hkv, D)
        bt = torch.nn.functional.pad(bt, (0, 256 - bt.shape[1]))  # the graphs' table width
        args = (q, kc, vc, qsl, sl, bt)
        gb = sum(ctx) * Hkv * D * 2 * 2 / 1e9
        for cfg in cfgs:
            row = _with_cfg(cfg, lambda: _split_row(
                args, (None, 1, 2, 4, 8), 4096,
                lambda ms: f"{ms * 1e3:5.1f}({gb / ms * 1e3:4.0f})"))
            print(f"B={B} cfg={cfg} | {row}", flush=True)


def small(tune):
    """Decode grids with fewer programs than SMs (the split-K regime: batch 1-16 x 8 KV heads)
    at short and long contexts, max_seq_len 8192 as a captured graph would pass: microseconds
    per launch (with its merge) per tile config and split count."""
    H, Hkv, D = 16, 8, 128
    cfgs = _cfgs([(128, 4, 1), (64, 4, 1), (64, 4, 2), (32, 4, 1)])
    print("small decode grids (H=16, Hkv=8, D=128, bf16, max_seq_len 8192): us per launch")
    for B in (1, 4, 8, 16):
        for ctx in (256, 2048, 8192):
            q, kc, vc, qsl, sl, bt = batch([1] * B, [ctx] * B, H, Hkv, D)
            bt = torch.nn.functional.pad(bt, (0, 512 - bt.shape[1]))
            args = (q, kc, vc, qsl, sl, bt)
            for cfg in cfgs:
                row = _with_cfg(cfg, lambda: _split_row(args, (None, 1, 2, 4, 8, 16), 8192,
                                                        lambda ms: f"{ms * 1e3:6.1f}"))
                print(f"B={B:2d} ctx={ctx:5d} cfg={cfg} | {row}", flush=True)


def merge(tune):
    """Split decodes merged in the launch (with each context cut into parts of at least
    ``min_split_keys``) against the second merging launch (OCTAVO_ATTN_SPLIT_MERGE=0), both
    with the heuristic's split count for max_seq_len 4096 (a captured graph's): us per launch
    at W4's contexts (128..384) and at 2k / 8k."""
    import os
    import random

    H, Hkv, D = 16, 8, 128
    print("split merge (H=16, Hkv=8, D=128, bf16, max_seq_len 4096 / 8192): us per launch")
    cases = [(B, "w4") for B in (1, 2, 8, 16, 32)] + [(B, c) for B in (1, 4, 16)
                                                        for c in (2048, 8192)]
    for B, ctx in cases:
        rng = random.Random(B)
        lens = [rng.randint(128, 384) for _ in range(B)] if ctx == "w4" else [ctx] * B
        width = 512 if ctx == 8192 else 256
        q, kc, vc, qsl, sl, bt = batch([1] * B, lens, H, Hkv, D)
        bt = torch.nn.functional.pad(bt, (0, width - bt.shape[1]))
        row = []
        for label, env, keys in (("second launch", "0", None), ("in launch", "1", None),
                                 ("in launch min 128", "1", 128), ("min 512", "1", 512)):
            os.environ["OCTAVO_ATTN_SPLIT_MERGE"] = env
            ms = _decode_ms((q, kc, vc, qsl, sl, bt), width * 16, None, min_split_keys=keys)
            row.append(f"{label}: {ms * 1e3:6.1f}")
        os.environ.pop("OCTAVO_ATTN_SPLIT_MERGE")
        print(f"B={B:2d} ctx={ctx} | " + " | ".join(row), flush=True)


if __name__ == "__main__":
    tune = "--tune" in sys.argv
    print(torch.cuda.get_device_name(), torch.__version__)
    # One sweep alone: --small, --short, --w1, --chunk (the first given).
    alone = {"--small": small, "--short": short, "--w1": w1, "--chunk": chunk,
             "--merge": merge}
    for flag, sweep in alone.items():
        if flag in sys.argv:
            sweep(tune)
            sys.exit(0)
    if "--mixed" not in sys.argv and "--prefill" not in sys.argv:
        decode(tune)
    if "--mixed" not in sys.argv:
        prefill(tune)
    mixed()
