"""A mixture-of-experts layer's GPU kernels at Qwen3-30B-A3B's expert shape (128 experts, 8 a
token, hidden 2048, expert intermediate 768, bf16), at decode batches:

* routing and alignment: the torch ops (softmax, topk, renormalisation, casts,
  ``fused_moe.align_by_expert``) against ``moe_route.route_and_align``'s one launch, the
  router's matmul included in both;
* the grouped GEMMs (``fused_moe`` given the alignment) over tile configurations; with
  ``--bits 4`` or ``8``, the integer experts' (``fused_moe_int``: random packed values,
  bf16 scales and zeros of ``--group``), and their grouped GEMV (``OCTAVO_MOE_INT_GEMV``'s
  path) as the row "gemv"; with ``--fp8 rows`` or ``blocks``, FP8 experts (``fused_moe``'s
  FP8 path: float32 scales per row, or per 128 x 128 block as Qwen3-30B-A3B-FP8 ships).

Several layers' weights rotate (each call reads its experts from HBM, as a decode step does);
each layer copy has its own random routing. A sweep is captured in a CUDA graph and timed by
CUDA events over replays (``benchmarks.common.graph_timed``): microseconds per layer, and for
the GEMMs the fraction of HBM bandwidth their experts' weights take.

    python benchmarks/moe_kernel.py [--tokens 1 4 16 64] [--tiles 16,64,64,4,3 16,32,128,4,3]
        [--bits 4 --group 128] [--fp8 blocks]
"""

from __future__ import annotations

import argparse
import os
import sys

# The checkout after PYTHONPATH's entries: a tree given there (a `git archive` export, for
# an A/B) is the octavo imported; before the installed packages.
sys.path.insert(1 + len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import (  # noqa: E402
    device_info,
    git_commit,
    graph_timed,
    print_json_result,
    published_hbm_tbps,
)

DEFAULT_TILES = ["16,64,64,4,3", "16,32,64,4,3", "16,32,128,4,3", "16,16,128,4,3",
                 "16,64,128,4,3", "16,32,128,4,4", "16,32,256,4,3", "16,16,256,2,3"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--inter", type=int, default=768)
    ap.add_argument("--layers", type=int, default=6, help="weight copies rotated per sweep")
    ap.add_argument("--tiles", nargs="+", default=DEFAULT_TILES,
                    help="BLOCK_M,BLOCK_N,BLOCK_K,warps,stages of the grouped GEMMs")
    ap.add_argument("--bits", type=int, default=16, choices=[4, 8, 16],
                    help="expert weights: bf16 (16) or packed integers")
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--fp8", choices=["rows", "blocks"], default=None,
                    help="FP8 experts with scales per row or per 128 x 128 block")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F

    from octavo.kernels import fused_moe as fm
    from octavo.kernels import moe_route

    dev = torch.device("cuda")
    dt = torch.bfloat16
    e, k, h, inter, layers = args.experts, args.topk, args.hidden, args.inter, args.layers
    g = torch.Generator(device=dev).manual_seed(0)
    gate = [torch.randn(e, h, device=dev, dtype=dt, generator=g) / h ** 0.5 for _ in range(layers)]
    float_layers = layers if args.bits == 16 and not args.fp8 else 0  # bf16, where timed
    w13 = [torch.randn(e, 2 * inter, h, device=dev, dtype=dt, generator=g) / h ** 0.5
           for _ in range(float_layers)]
    w2 = [torch.randn(e, h, inter, device=dev, dtype=dt, generator=g) / inter ** 0.5
          for _ in range(float_layers)]
    expert_bytes = (2 * inter * h + h * inter) * 2
    if args.bits < 16:
        from octavo.kernels import fused_moe_int as fmi

        experts = [_int_experts(e, h, inter, args.bits, args.group, dev, g)
                   for _ in range(layers)]
        # values, then a bf16 scale and zero per group and output
        expert_bytes = (3 * inter * h) * (args.bits / 8 + 4 / args.group)
    if args.fp8:
        block = (128, 128) if args.fp8 == "blocks" else None
        fp8 = [_fp8_experts(e, h, inter, block, dev, g) for _ in range(layers)]
        expert_bytes = 3 * inter * h  # one byte a weight (the scales: 0.02% or less)

    def grouped(i, x, weights, ids, **kw):  # layer copy i's grouped launches
        if args.fp8:
            return fm.fused_moe(x, fp8[i].w13, fp8[i].w2, weights, ids, fp8=fp8[i], **kw)
        if args.bits < 16:
            return fmi.fused_moe_int(x, experts[i], weights, ids, **kw)
        return fm.fused_moe(x, w13[i], w2[i], weights, ids, **kw)

    peak = published_hbm_tbps(torch.cuda.get_device_name())
    rows = []
    for t in args.tokens:
        x = [torch.randn(t, h, device=dev, dtype=dt, generator=g) for _ in range(layers)]
        block_m = fm.default_tiles(t, k, e).block_m

        def torch_route(i, block_m=block_m, x=x):
            probs = torch.softmax(F.linear(x[i], gate[i]).float(), dim=-1)
            weights, ids = torch.topk(probs, k, dim=-1)
            weights = (weights / weights.sum(dim=-1, keepdim=True)).to(dt).float()
            return weights, fm.align_by_expert(ids, e, block_m)

        def kernel_route(i, block_m=block_m, x=x):
            return moe_route.route_and_align(F.linear(x[i], gate[i]), k, True, block_m, dt)

        route_us = {
            "torch": graph_timed([lambda i=i: torch_route(i) for i in range(layers)]),
            "moe_route": graph_timed([lambda i=i: kernel_route(i) for i in range(layers)]),
        }
        routed = [kernel_route(i) for i in range(layers)]
        touched = sum(int(torch.unique(r.ids).numel()) for r in routed) / layers
        nbytes = touched * expert_bytes
        gemm = []
        for spec in args.tiles:
            bm, bn, bk, warps, stages = (int(v) for v in spec.split(","))
            tiles = fm.MoeTiles(bm, bn, bk, warps, stages)
            aligns = [moe_route.align(r.ids, e, bm) for r in routed]
            fns = [lambda i=i, tiles=tiles, aligns=aligns, x=x, routed=routed: grouped(
                i, x[i], routed[i].weights, routed[i].ids, tiles=tiles,
                alignment=fm.Alignment(aligns[i].sorted_ids, aligns[i].tile_experts))
                for i in range(layers)]
            try:
                us = graph_timed(fns)
            except Exception as exc:  # a tile that does not compile or fit: say so, go on
                gemm.append({"tiles": spec, "error": f"{type(exc).__name__}: {exc}"[:200]})
                continue
            frac = nbytes / (us * 1e-6) / (peak * 1e12) if peak else None
            gemm.append({"tiles": spec, "us": round(us, 2),
                         "hbm_fraction": round(frac, 3) if frac else None})
        if args.bits < 16 and not args.fp8:  # the grouped CUDA-core GEMV (OCTAVO_MOE_INT_GEMV), no sorting
            us = graph_timed([lambda i=i, x=x, routed=routed: fmi._gemv_path(
                x[i], experts[i], routed[i].weights, routed[i].ids) for i in range(layers)])
            frac = nbytes / (us * 1e-6) / (peak * 1e12) if peak else None
            gemm.append({"tiles": "gemv", "us": round(us, 2),
                         "hbm_fraction": round(frac, 3) if frac else None})
        best = min((r for r in gemm if "us" in r), key=lambda r: r["us"])
        row = {"tokens": t, "experts_touched": touched, "expert_mb": round(nbytes / 1e6, 1),
               "route_us": {key: round(v, 2) for key, v in route_us.items()},
               "gemm": gemm, "best_tiles": best["tiles"]}
        rows.append(row)
        print(f"T={t}: {touched:.1f} experts ({nbytes / 1e6:.1f} MB); route torch "
              f"{route_us['torch']:.1f} us, moe_route {route_us['moe_route']:.1f} us")
        for r in gemm:
            print("   ", r)
    print_json_result({"benchmark": "moe_kernel", "device": device_info(), "commit": git_commit(),
                       "shape": {"experts": e, "topk": k, "hidden": h, "inter": inter,
                                 "bits": args.bits, "group": args.group, "fp8": args.fp8},
                       "rows": rows}, args.json)


def _fp8_experts(e, h, inter, block, dev, g):
    """Random stacked FP8 experts with float32 scales per row (block None) or block."""
    import torch

    from octavo.kernels import fused_moe as fm

    out = []
    for n, k in ((2 * inter, h), (h, inter)):
        w = (torch.randn(e, n, k, device=dev, generator=g) * 100).clamp(-448, 448).to(fm.FP8)
        shape = (e, n) if block is None else (e, -(-n // block[0]), -(-k // block[1]))
        out += [w, torch.rand(shape, device=dev, generator=g) * 1e-4]
    return fm.Fp8Experts(w13=out[0], s13=out[1], w2=out[2], s2=out[3], block=block)


def _int_experts(e, h, inter, bits, group, dev, g):
    """Random stacked integer experts (packed along K) with bf16 scales and zeros."""
    import torch

    from octavo.kernels import fused_moe_int as fmi

    pack = 32 // bits

    def packed(k, n):
        return torch.randint(-2**31, 2**31 - 1, (e, k // pack, n), device=dev,
                             dtype=torch.int32, generator=g)

    def groups(k, n, lo):
        return (torch.rand(e, k // group, n, device=dev, generator=g) * lo).to(torch.bfloat16)

    return fmi.IntExperts(packed(h, 2 * inter), groups(h, 2 * inter, 0.01),
                          groups(h, 2 * inter, 1 << bits), packed(inter, h),
                          groups(inter, h, 0.01), groups(inter, h, 1 << bits), group, group,
                          bits)


if __name__ == "__main__":
    main()
