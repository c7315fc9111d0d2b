"""The CUDA C++ integer kernel's launch-plan sweep of ``benchmarks/quantized_gemm.py``
(``--cuda-sweep``: octavo/kernels/swapab_mma.py, 1-16 rows), on its Llama-3.1-8B shapes and
weight copies: run it through that script."""

from __future__ import annotations

from benchmarks.common import device_info, git_commit, print_json_result
from benchmarks.quantized_gemm import SHAPES, _int_copies, _weight_bytes


def cuda_sweep(args, timed, bandwidth, limits) -> None:
    """The CUDA swap-AB kernel over launch plans, per Llama-8B shape, M and bits (--bits)."""
    import torch

    from octavo.kernels.swapab_mma import swapab_mma

    dev = torch.device("cuda")
    if args.stages:
        plans = [{"warps_per_sm": w, "steps": 4, "most_warps": 8, "stages": sg}
                 for sg in args.stages for w in (4, 6, 8, 12, 16)]
    else:
        plans = [{"warps_per_sm": w, "steps": st, "most_warps": mw}
                 for w in (4, 6, 10, 16) for st in (2, 4) for mw in (4, 8)]
    rows = []
    for bits in args.bits:
        for name, (k, n) in SHAPES.items():
            packs = _int_copies(k, n, bits, args.group, dev, "swapab")
            nbytes = _weight_bytes(k, n, bits, args.group)
            for m in args.m:
                x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                results = []
                for cfg in plans:
                    t = timed([lambda p=p, x=x, cfg=cfg, b=bits: swapab_mma(
                        x, *p, args.group, b, **cfg) for p in packs])
                    results.append({**cfg, "us": round(t, 2),
                                    "hbm_fraction": round(nbytes / (t * 1e-6) / bandwidth, 3)})
                best = min(results, key=lambda r: r["us"])
                default = next((r for r in results if r["warps_per_sm"] == 6
                                and r["steps"] == 4 and r["most_warps"] == 8
                                and not r.get("stages")), best)
                row = {"bits": bits, "shape": name, "M": m, "best": best, "default": default,
                       "all": results}
                rows.append(row)
                print(f"{bits}-bit {name} M={m}: default {default['us']} us "
                      f"({default['hbm_fraction']:.0%}), best {best}", flush=True)
            del packs
            torch.cuda.empty_cache()
    print_json_result({"benchmark": "quantized_gemm_cuda_sweep", "device": device_info(),
                       "limits": limits, "commit": git_commit(), "rows": rows}, args.json)
