"""Decode attention on the GPU: the CUDA stream-K kernel (octavo/kernels/streamk_cuda.py) over
its launch plans against the Triton stream-K kernel the engine runs, at W1 / W2 / W4's decode
shapes, as TB/s of K/V read and the fraction of the device's HBM bandwidth.

PYTHONPATH=. python benchmarks/streamk_attention.py [--cases w1_b256 ...] [--json PATH]

Each case's caches are copied until one sweep reads >= 256 MB, so every launch reads its K/V
from HBM as a decode step's layers do (a small batch's cache would otherwise stay in L2); one
CUDA graph of the sweep is replayed (no launch gaps between the kernels but their own). The
work lists are built once per case, as the engine builds one per step for all layers. Each
plan's output is checked against the Triton kernel's (max abs difference) and, for the
small cases, against paged_attention_ref.
"""

from __future__ import annotations

import argparse
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmarks.common import (  # noqa: E402
    device_info,
    git_commit,
    graph_timed,
    print_json_result,
    published_hbm_tbps,
)

SWEEP_BYTES = 256 << 20
# name: (batch, context range, heads, KV heads)
CASES = {
    "w1_b256": (256, (100, 2000), 16, 8),
    "w1_b128": (128, (500, 2000), 16, 8),
    "w1_b64": (64, (800, 2000), 16, 8),
    "w1_b16": (16, (1000, 2000), 16, 8),
    "w4_b32": (32, (200, 384), 16, 8),
    "w2_b256": (256, (100, 2000), 32, 8),
}


def make_case(batch, ctx, heads, kv_heads, d=128, bs=16, seed=0, dev="cuda"):
    rnd = random.Random(seed)
    lens = [rnd.randint(*ctx) for _ in range(batch)]
    nblk = [-(-n // bs) for n in lens]
    total = sum(nblk) + 4
    perm = torch.randperm(total, device=dev).to(torch.int32)
    bt = torch.zeros(batch, max(nblk) + 1, dtype=torch.int32, device=dev)
    u = 0
    for b, n in enumerate(nblk):
        bt[b, :n] = perm[u:u + n]
        u += n
    kv_bytes = sum(lens) * kv_heads * d * 2 * 2
    copies = max(1, -(-SWEEP_BYTES // kv_bytes))
    caches = [(torch.randn(total, bs, kv_heads, d, device=dev, dtype=torch.bfloat16),
               torch.randn(total, bs, kv_heads, d, device=dev, dtype=torch.bfloat16))
              for _ in range(copies)]
    q = torch.randn(batch, heads, d, device=dev, dtype=torch.bfloat16)
    qsl = torch.arange(batch + 1, device=dev, dtype=torch.int32)
    sl = torch.tensor(lens, device=dev, dtype=torch.int32)
    return q, caches, qsl, sl, bt, kv_bytes


def run_case(name, plans, ctas, peak):
    from octavo.kernels import streamk_cuda
    from octavo.kernels.paged_attention_ref import paged_attention_ref
    from octavo.kernels.paged_attention_streamk import (
        decode_tiles,
        streamk_config,
        streamk_decode,
    )

    batch, ctx, heads, kv_heads = CASES[name]
    q, caches, qsl, sl, bt, kv_bytes = make_case(batch, ctx, heads, kv_heads)
    scale = 128**-0.5
    order = torch.argsort(sl, descending=True, stable=True).to(torch.int32)
    bs = caches[0][0].shape[1]
    cfg = streamk_config(heads // kv_heads, 128, q.dtype, True)
    tiles_t = decode_tiles(qsl, sl, bt, bs, cfg.block_n, order)
    outs = [torch.empty_like(q) for _ in caches]

    def rate(us):
        tbps = kv_bytes / (us * 1e-6) / 1e12
        return {"us": round(us, 2), "tbps": round(tbps, 3),
                "of_hbm": peak and round(tbps / peak, 3)}

    os.environ["OCTAVO_ATTN_CUDA"] = "0"
    fns = [lambda kc=kc, vc=vc, o=o: streamk_decode(q, kc, vc, qsl, sl, bt, scale, o,
                                                     tiles=tiles_t, config=cfg)
           for (kc, vc), o in zip(caches, outs)]
    triton_us = graph_timed(fns)
    want = outs[0].clone()
    row = {"case": name, "batch": batch, "context": ctx, "heads": heads, "kv_heads": kv_heads,
           "kv_mb": round(kv_bytes / 2**20, 1), "triton": rate(triton_us), "cuda": []}
    if batch <= 64:
        ref = paged_attention_ref(q, caches[0][0], caches[0][1], qsl, sl, bt, scale)
        row["triton_vs_ref"] = float((want.float() - ref.float()).abs().max())
    for warps, stages in plans:
        tiles_c = decode_tiles(qsl, sl, bt, bs, 16 * warps, order)
        for c in ctas:
            progs = streamk_cuda.num_programs(q.device, kv_heads, c)
            try:
                kw = {"programs": progs, "warps": warps, "stages": stages}
                fns = [lambda kc=kc, vc=vc, o=o, tc=tiles_c, kw=kw:
                       streamk_cuda.streamk_decode_cuda(q, kc, vc, qsl, tc, scale, o, **kw)
                       for (kc, vc), o in zip(caches, outs)]
                us = graph_timed(fns)
                diff = float((outs[0].float() - want.float()).abs().max())
                r = {"warps": warps, "stages": stages, "ctas_per_sm": c, **rate(us),
                     "max_diff_vs_triton": diff}
                if "triton_vs_ref" in row:
                    r["max_diff_vs_ref"] = float((outs[0].float() - ref.float()).abs().max())
            except Exception as e:  # noqa: BLE001 - recorded, the sweep goes on
                r = {"warps": warps, "stages": stages, "ctas_per_sm": c,
                     "error": f"{type(e).__name__}: {e}"[:300]}
            row["cuda"].append(r)
    ok = [r for r in row["cuda"] if "us" in r]
    best = min(ok, key=lambda r: r["us"]) if ok else None
    row["best"] = best
    print(f"{name}: {row['kv_mb']} MB, Triton {triton_us:.1f} us "
          f"({row['triton']['of_hbm']} of HBM); CUDA best {best}", flush=True)
    del caches, outs
    torch.cuda.empty_cache()
    return row


def main() -> None:
    from octavo.kernels import streamk_cuda

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--ctas", nargs="+", type=int, default=[1, 2, 3])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA device")
    info = device_info()
    peak = published_hbm_tbps(info.get("gpu", ""))
    plans = sorted(streamk_cuda.BUILT)
    rows = [run_case(name, plans, args.ctas, peak) for name in args.cases]
    print_json_result({"benchmark": "streamk_attention", "device": info, "commit": git_commit(),
                       "hbm_tbps": peak, "rows": rows}, args.json)


if __name__ == "__main__":
    main()
