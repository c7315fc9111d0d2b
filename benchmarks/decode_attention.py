"""Decode attention alone (octavo.kernels.paged_attention), K/V read from HBM as in an
engine step, at the workloads' batch shapes.

PYTHONPATH=. python benchmarks/decode_attention.py [--cases w1,w4_32,...] [--layouts token head]
    [--splits 8:512 ...] [--json out.json]

Each case is a batch of decodes at the shapes the workloads run (Qwen3-0.6B: 16 heads over 8
KV heads; Llama-3.1-8B: 32 over 8; head_dim 128, bf16, 16-token blocks, shuffled block ids).
One CUDA graph launches the kernel over enough copies of the caches (>= 256 MB together)
that none is still in the 50 MB L2 when its turn comes; time per launch = graph time /
copies (CUDA events). Figures: us per launch and the K/V bytes over that time (TB/s, and the
fraction of the device's published bandwidth). ``--layouts``: the caches' storage order,
"token" [block, token, kv_head, dim] (the engine's) or "head" [block, kv_head, token, dim]
seen through the same strided view (measured no faster on the H200, session 24).
``--splits``: the split policy, against the default. ``--cases eq_128,...,eq_2048``:
equal contexts of 128-2,048 keys (batch 256), the kernel's rate against context length.
``--streamk [WAVES ...]``: also time stream-K decode attention
(octavo/kernels/paged_attention_streamk.py) at WAVES programs per SM (none given: its
default); with ``--longest-first`` also over the rows in falling context order. Its work list
(``decode_tiles``) is built once per case, outside the timing, as an engine step builds it
once for every layer; OCTAVO_ATTN_STREAMK=1 makes the default rows stream-K the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys

import torch

# The checkout after PYTHONPATH's entries: a tree given there (a `git archive` export, for
# an A/B) is the octavo imported; before the installed packages.
sys.path.insert(1 + len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import graph_median_ms, published_hbm_tbps  # noqa: E402
from octavo.envs import attn_streamk  # noqa: E402
from octavo.kernels.paged_attention import paged_attention  # noqa: E402
from octavo.kernels.paged_attention_streamk import decode_tiles, streamk_config  # noqa: E402

# name: (heads, kv_heads, batch, context range, max_seq_len bound)
CASES = {
    "w1": (16, 8, 128, (100, 2000), 4096),  # W1's batch-128 steps, contexts ~100-2,000
    "w1_256": (16, 8, 256, (300, 1200), 4096),
    "w4_32": (16, 8, 32, (128, 384), 4096),  # W4 batch 32 (prompt 128 + up to 256 out)
    "w4_8": (16, 8, 8, (128, 384), 4096),
    "w4_1": (16, 8, 1, (128, 384), 4096),
    "l8b_1": (32, 8, 1, (128, 384), 4096),  # issue 12's Llama-3.1-8B batch 1
    "l8b_16": (32, 8, 16, (128, 384), 4096),
    "w2_256": (32, 8, 256, (400, 800), 4096),  # W2's batch-256 steps (~616)
    "long_4": (16, 8, 4, (8000, 8192), 8192),
    "long_2": (16, 8, 2, (16000, 16384), 16384),  # two long requests: stream-K's from 2
}
# Equal contexts at W1's shape and batch 256: the rate against context length shows each
# program's fixed cost (q, block table, setup, store), which W1's short contexts pay most.
CASES.update({f"eq_{n}": (16, 8, 256, (n, n), 4096) for n in (128, 256, 512, 1024, 2048)})


def make(heads, kv_heads, batch, ctx, seed=0, bs=16, d=128, dtype=torch.bfloat16,
         layout="token", longest_first=False):
    rnd = random.Random(seed)
    lens = [rnd.randint(*ctx) for _ in range(batch)]
    if longest_first:  # the batch's rows in falling context order
        lens.sort(reverse=True)
    blocks = [-(-n // bs) for n in lens]
    total = sum(blocks) + 1
    perm = torch.randperm(total, device="cuda").to(torch.int32)
    bt = torch.zeros(batch, max(blocks), dtype=torch.int32, device="cuda")
    used = 0
    for b, n in enumerate(blocks):
        bt[b, :n] = perm[used:used + n]
        used += n
    if layout == "head":  # stored head-major, the kernels see the strided view
        kc = torch.randn(total, kv_heads, bs, d, device="cuda", dtype=dtype).transpose(1, 2)
        vc = torch.randn(total, kv_heads, bs, d, device="cuda", dtype=dtype).transpose(1, 2)
    else:
        kc = torch.randn(total, bs, kv_heads, d, device="cuda", dtype=dtype)
        vc = torch.randn_like(kc)
    q = torch.randn(batch, heads, d, device="cuda", dtype=dtype)
    qsl = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
    sl = torch.tensor(lens, dtype=torch.int32, device="cuda")
    kv_bytes = sum(lens) * kv_heads * d * 2 * kc.element_size()
    return q, kc, vc, qsl, sl, bt, kv_bytes, total * bs * kv_heads * d * 2 * kc.element_size()


def time_launch(case, env: dict, copies_min_bytes=256 << 20, reps=20,
                layout="token", splits=None, min_split_keys=None,
                longest_first=False) -> tuple[float, int]:
    heads, kv_heads, batch, ctx, bound = CASES[case]
    q, kc, vc, qsl, sl, bt, kv_bytes, cache_bytes = make(heads, kv_heads, batch, ctx,
                                                         layout=layout,
                                                         longest_first=longest_first)
    copies = max(1, -(-copies_min_bytes // cache_bytes))
    kcs = [kc] + [kc.clone() for _ in range(copies - 1)]  # clone keeps the strides
    vcs = [vc] + [vc.clone() for _ in range(copies - 1)]
    assert all(c.stride() == kc.stride() for c in kcs + vcs)
    out = torch.empty_like(q)
    scale = 128 ** -0.5
    old = {k: os.environ.get(k) for k in env}
    os.environ.update({k: v for k, v in env.items() if v is not None})
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
    try:
        tiles = None
        if attn_streamk() and splits is None:  # one work list, as an engine step's layers
            block_n = streamk_config(heads // kv_heads, q.shape[2], q.dtype, True).block_n
            tiles = decode_tiles(qsl, sl, bt, kc.shape[1], block_n, max_seq_len=bound)

        def run():
            for i in range(copies):
                paged_attention(q, kcs[i], vcs[i], qsl, sl, bt, scale, out=out,
                                max_query_len=1, max_seq_len=bound, num_splits=splits,
                                min_split_keys=min_split_keys, decode_tiles=tiles)

        return graph_median_ms(run, reps) * 1e3 / copies, kv_bytes
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--pdl", choices=["0", "1"], help="OCTAVO_PDL for every launch")
    ap.add_argument("--layouts", nargs="*", default=["token"], choices=["token", "head"])
    ap.add_argument("--splits", nargs="*", default=[],
                    help="also time SPLITS:MIN_KEYS (num_splits, min_split_keys): each "
                         "context cut into parts of at least MIN_KEYS keys, at most SPLITS "
                         "of them, merged in the launch")
    ap.add_argument("--longest-first", action="store_true",
                    help="also time the default with the batch's rows in falling context "
                         "order")
    ap.add_argument("--streamk", nargs="*", type=int,
                    help="also time stream-K decode attention at these programs per SM "
                         "(none given: its default), and with --longest-first over the "
                         "rows in falling context order")
    ap.add_argument("--json")
    args = ap.parse_args()
    name = torch.cuda.get_device_name()
    peak = published_hbm_tbps(name)
    rows = []
    for case, layout in ((c, lay) for c in args.cases.split(",") for lay in args.layouts):
        env = {"OCTAVO_PDL": args.pdl}
        if args.streamk is not None:  # the default rows: the per-request launch
            env["OCTAVO_ATTN_STREAMK"] = None
        us, kv_bytes = time_launch(case, env, layout=layout)
        frac = f" ({kv_bytes / us / 1e6 / peak:.0%} of HBM)" if peak else ""
        print(f"{case:8s} {layout:5s} KV {kv_bytes / 1e6:8.1f} MB  default {us:8.1f} us "
              f"{kv_bytes / us / 1e6:.2f} TB/s{frac}", flush=True)
        row = {"case": case, "layout": layout, "shape": CASES[case], "kv_mb": kv_bytes / 1e6,
               "us": us, "tbps": kv_bytes / us / 1e6, "splits": []}
        for spec in args.splits:
            sp, keys = (int(v) for v in spec.split(":"))
            t, _ = time_launch(case, env, layout=layout, splits=sp, min_split_keys=keys)
            row["splits"].append({"splits": sp, "min_keys": keys, "us": t,
                                  "tbps": kv_bytes / t / 1e6, "speedup": us / t})
            print(f"{case:8s} {layout:5s} splits {sp:2d} min keys {keys:5d}: {t:8.1f} us "
                  f"{kv_bytes / t / 1e6:.2f} TB/s x{us / t:.2f}", flush=True)
        if args.longest_first:
            t, _ = time_launch(case, env, layout=layout, longest_first=True)
            row["longest_first"] = {"us": t, "tbps": kv_bytes / t / 1e6, "speedup": us / t}
            print(f"{case:8s} {layout:5s} longest first: {t:8.1f} us "
                  f"{kv_bytes / t / 1e6:.2f} TB/s x{us / t:.2f}", flush=True)
        if args.streamk is not None:
            row["streamk"] = []
            for waves in args.streamk or [None]:
                for lf in (False, True) if args.longest_first else (False,):
                    sk_env = dict(env, OCTAVO_ATTN_STREAMK="1",
                                  OCTAVO_ATTN_STREAMK_WAVES=None if waves is None
                                  else str(waves))
                    t, _ = time_launch(case, sk_env, layout=layout, longest_first=lf)
                    row["streamk"].append({"waves": waves, "longest_first": lf, "us": t,
                                           "tbps": kv_bytes / t / 1e6, "speedup": us / t})
                    print(f"{case:8s} {layout:5s} stream-K waves {waves or 'default'}"
                          f"{' longest first' if lf else ''}: {t:8.1f} us "
                          f"{kv_bytes / t / 1e6:.2f} TB/s x{us / t:.2f}", flush=True)
        rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "peak_tbps": peak, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
