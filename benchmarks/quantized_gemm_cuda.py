"""The CUDA C++ integer kernels' launch-plan sweeps of ``benchmarks/quantized_gemm.py``
(``--cuda-sweep``: octavo/kernels/swapab_mma.py, 1-16 rows; ``--wide-sweep``:
octavo/kernels/swapab_wide.py, 17-512 rows), on its Llama-3.1-8B shapes and weight copies:
run them through that script."""

from __future__ import annotations

from benchmarks.common import device_info, git_commit, print_json_result, time_each
from benchmarks.quantized_gemm import SHAPES, _bf16_copies, _int_copies, _weight_bytes


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


def wide_sweep(args, timed, bandwidth, limits) -> None:
    """The CUDA wide-tile 4-bit kernel over its launch plans per Llama-8B shape and M, with
    bf16 cuBLAS and dequantize-then-cuBLAS (the engine's path past 128 rows) beside it."""
    import torch

    from octavo.kernels.swapab_wide import swapab_wide
    from octavo.kernels.w4a16_swapab import dequantize_swapab

    dev = torch.device("cuda")
    from octavo.kernels.swapab_wide import BUILT

    plans = [{"nt": nt, "warps": w, "wsmem": ws, "ctas_per_sm": c}
             for nt, w, _, ws in sorted(BUILT) for c in (1, 2, 3)]
    rows = []
    for name, (k, n) in SHAPES.items():
        dense = _bf16_copies(k, n, dev)
        packs = _int_copies(k, n, 4, args.group, dev, "swapab")
        for m in args.m:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            t_bf16 = timed([lambda w=w, x=x: torch.nn.functional.linear(x, w) for w in dense])
            t_deq = timed([lambda p=p, x=x: x @ dequantize_swapab(*p, args.group, 4, x.dtype)
                           for p in packs])
            results = time_each(timed, plans, lambda cfg, x=x, ps=packs: [
                lambda p=p: swapab_wide(x, *p, args.group, 4, **cfg) for p in ps])
            ok = [r for r in results if "us" in r]
            best = min(ok, key=lambda r: r["us"]) if ok else None
            default = next((r for r in ok if r["cfg"]["nt"] == (4 if m <= 32 else 8)
                            and r["cfg"]["ctas_per_sm"] == 2 and r["cfg"]["warps"] == 4
                            and not r["cfg"]["wsmem"]), None)
            row = {"shape": name, "K": k, "N": n, "M": m, "bf16_us": round(t_bf16, 1),
                   "dequant_cublas_us": round(t_deq, 1), "default": default, "best": best,
                   "all": results}
            rows.append(row)
            print(f"{name} M={m}: bf16 {t_bf16:.1f} us, dequantize + cuBLAS {t_deq:.1f}, wide "
                  f"default {default and default['us']}, best {best}", flush=True)
        del dense, packs
        torch.cuda.empty_cache()
    print_json_result({"benchmark": "quantized_gemm_wide_sweep", "device": device_info(),
                       "limits": limits, "commit": git_commit(), "rows": rows}, args.json)
