"""Decode-batch float GEMMs: octavo/kernels/skinny_gemm.py and, for M <= 2,
octavo/kernels/dense_gemv.py against cuBLAS (``F.linear``) at the Qwen3-0.6B and Llama-3.1-8B
projection shapes, bf16, M = 1..16, on the GPU, in one call.

Weights are replicated so one sweep reads several times the L2 (each call reads its weight
from HBM, as a decode step does); a sweep is captured in a CUDA graph (as the engine's decode
steps are) and timed by CUDA events over replays. Prints microseconds per call, the speedup
over cuBLAS and the fraction of HBM bandwidth; ``--sweep`` / ``--sweep-gemv`` time tile
configurations of the skinny GEMM / the GEMV.

    python benchmarks/skinny_gemm.py [--m 1 4 16] [--sweep] [--sweep-gemv] [--json out.json]
    python benchmarks/skinny_gemm.py --paths cublas skinny gemv cuda --m 1 2 4 8 16 32
    python benchmarks/skinny_gemm.py --cuda-sweep --m 1 8 16 32   # dense_mma's launch plans

``--paths`` times the kernels side by side (``cuda``: the CUDA C++ GEMM of
octavo/kernels/dense_mma.py, whatever ``OCTAVO_CUDA_DENSE`` says; ``gemv`` only at the rows
the GEMV takes) and sums one layer's projections per path; ``--cuda-sweep`` times that
kernel's plans (warps per SM x K steps per chunk x feature tiles per warp).
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

# The checkout after PYTHONPATH's entries: a tree given there (a `git archive` export, for
# an A/B) is the octavo imported; before the installed packages.
sys.path.insert(1 + len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import (  # noqa: E402
    device_info,
    flush_copies,
    git_commit,
    print_json_result,  # noqa: E402
    time_each,  # noqa: E402
)
from benchmarks.common import graph_timed as timed
from benchmarks.workloads import device_limits  # noqa: E402

# (N, K) of each projection (nn.Linear weight layout).
SHAPES = {
    "qwen3-0.6b": {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024),
                   "down": (1024, 3072), "lm_head": (151936, 1024)},
    "llama-3.1-8b": {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
                     "down": (4096, 14336)},
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, nargs="+", default=[1, 2, 4, 8, 16],
                    help="rows; up to 64 (the engine sends the skinny GEMM at most 16)")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--sweep-gemv", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--paths", nargs="+", choices=sorted(PATHS), default=None,
                    help="time these kernels side by side per shape and M (a table)")
    ap.add_argument("--cuda-sweep", action="store_true",
                    help="the CUDA dense GEMM over launch plans per shape and M")
    args = ap.parse_args()
    if args.paths:
        return paths_table(args)
    if args.cuda_sweep:
        return cuda_sweep(args)
    import torch
    import torch.nn.functional as F

    from octavo.kernels.dense_gemv import MAX_M as GEMV_MAX_M
    from octavo.kernels.dense_gemv import dense_gemv
    from octavo.kernels.skinny_gemm import skinny_gemm

    bandwidth, _, limits = device_limits()
    dev = torch.device("cuda")
    rows = []
    # split_k None: the kernel's own choice (about four programs per SM, which splits every
    # shape here); 1 and 2 keep the wide shapes' programs whole (fewer, longer programs and
    # no partial sums to reduce).
    cfgs = ([None] + [dict(block_n=bn, block_k=bk, num_warps=w, num_stages=s, split_k=sk)
                      for bn, bk, w, s, sk in itertools.product(
                          (16, 32, 64), (64, 128, 256), (4,), (3, 4, 6), (None, 1, 2))]
            if args.sweep else [None])
    gemv_cfgs = ([None] + [dict(block_n=bn, block_k=bk, num_warps=w, waves=v)
                           for bn, bk, w, v in itertools.product((4, 8, 16), (256, 512),
                                                                 (4, 8), (2, 4))]
                 if args.sweep_gemv else [None])
    for model, shapes in SHAPES.items():
        for name, (n, k) in shapes.items():
            ws = _weight_copies(n, k)
            for m in args.m:
                x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                t_ref = timed([lambda w=w, x=x: F.linear(x, w) for w in ws])
                default, best, _ = _time_configs(timed, skinny_gemm, x, ws, cfgs, "")
                err = (skinny_gemm(x, ws[0]).float() - F.linear(x, ws[0]).float()).abs().max()
                gemv = None
                if m <= GEMV_MAX_M:
                    gemv, gemv_best, gemv_all = _time_configs(timed, dense_gemv, x, ws,
                                                              gemv_cfgs, "gemv ")
                    gemv_err = float((dense_gemv(x, ws[0]).float()
                                      - F.linear(x, ws[0]).float()).abs().max())
                row = {"model": model, "shape": name, "N": n, "K": k, "M": m,
                       "cublas_us": round(t_ref, 2), "skinny_us": round(default, 2),
                       "speedup": round(t_ref / default, 2),
                       "skinny_hbm_fraction": round(n * k * 2 / (default * 1e-6) / bandwidth, 3),
                       "cublas_hbm_fraction": round(n * k * 2 / (t_ref * 1e-6) / bandwidth, 3),
                       "max_abs_diff": float(err)}
                if args.sweep:
                    row["best_us"], row["best_cfg"] = round(best[0], 2), best[1]
                if gemv is not None:
                    row.update(gemv_us=round(gemv, 2), gemv_speedup=round(t_ref / gemv, 2),
                               gemv_hbm_fraction=round(n * k * 2 / (gemv * 1e-6) / bandwidth, 3),
                               gemv_max_abs_diff=gemv_err)
                    if args.sweep_gemv:
                        row["gemv_best_us"] = round(gemv_best[0], 2)
                        row["gemv_best_cfg"] = gemv_best[1]
                        row["gemv_sweep"] = gemv_all
                rows.append(row)
                print(" ".join(f"{a}={b}" for a, b in row.items() if a not in
                               ("N", "K", "skinny_hbm_fraction", "cublas_hbm_fraction",
                                "gemv_max_abs_diff", "max_abs_diff")),
                      flush=True)
            del ws
            torch.cuda.empty_cache()
    per_layer = {}
    for label, sel in _layers(rows, args.m):
        c, s = sum(r["cublas_us"] for r in sel), sum(r["skinny_us"] for r in sel)
        per_layer[label] = {"cublas_us": round(c, 1), "skinny_us": round(s, 1),
                            "speedup": round(c / s, 2)}
        if all("gemv_us" in r for r in sel):
            g = sum(r["gemv_us"] for r in sel)
            per_layer[label].update(gemv_us=round(g, 1), gemv_speedup=round(c / g, 2))
        print(f"one {label} layer's GEMMs: {per_layer[label]}")
    result = {"benchmark": "skinny_gemm", "device": device_info(), "limits": limits,
              "commit": git_commit(), "rows": rows, "per_layer": per_layer}
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    else:
        print_json_result(result)


def _layers(rows, ms):
    """(label, the rows of one layer's projections: the LM head apart) per model and M."""
    for model in SHAPES:
        for m in ms:
            yield f"{model} M={m}", [r for r in rows if r["model"] == model and r["M"] == m
                                     and r["shape"] != "lm_head"]


def _gemv(x, w):
    from octavo.kernels.dense_gemv import dense_gemv

    return dense_gemv(x, w)


def _skinny(x, w):
    from octavo.kernels.skinny_gemm import skinny_gemm

    return skinny_gemm(x, w)


def _cuda(x, w, **plan):
    from octavo.kernels.dense_mma import dense_mma

    return dense_mma(x, w, **plan)


def _cublas(x, w):
    import torch.nn.functional as F

    return F.linear(x, w)


PATHS = {"cublas": _cublas, "skinny": _skinny, "gemv": _gemv, "cuda": _cuda}


def _weight_copies(n: int, k: int):
    """Enough bf16 [N, K] weights that a sweep over them reads several times the L2."""
    import torch

    return [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / 32
            for _ in range(flush_copies(k * n * 2))]


def paths_table(args) -> None:
    """Microseconds per call of each of ``args.paths`` per shape and M, the fraction of HBM
    bandwidth and the largest difference from cuBLAS; one layer's sum per path."""
    import torch

    from octavo.kernels.dense_gemv import MAX_M as GEMV_MAX_M

    bandwidth, _, limits = device_limits()
    rows = []
    print(f"{'model':13} {'shape':8} {'M':>3} " + " ".join(f"{p + '_us':>10}" for p in args.paths)
          + "  hbm fraction of the best", flush=True)
    for model, shapes in SHAPES.items():
        for name, (n, k) in shapes.items():
            ws = _weight_copies(n, k)
            for m in args.m:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                ref = _cublas(x, ws[0]).float()
                row = {"model": model, "shape": name, "N": n, "K": k, "M": m}
                for path in args.paths:
                    if path == "gemv" and m > GEMV_MAX_M:
                        continue
                    fn = PATHS[path]
                    try:
                        t = timed([lambda w=w, fn=fn, x=x: fn(x, w) for w in ws])
                    except Exception as e:  # noqa: BLE001 - recorded, the table goes on
                        row[f"{path}_error"] = f"{type(e).__name__}: {e}"[:160]
                        continue
                    row[f"{path}_us"] = round(t, 2)
                    row[f"{path}_hbm_fraction"] = round(n * k * 2 / (t * 1e-6) / bandwidth, 3)
                    row[f"{path}_max_abs_diff"] = float((fn(x, ws[0]).float() - ref).abs().max())
                rows.append(row)
                times = [row.get(f"{p}_us") for p in args.paths]
                best = min((t for t in times if t is not None), default=None)
                print(f"{model:13} {name:8} {m:>3} "
                      + " ".join(f"{t if t is not None else '-':>10}" for t in times)
                      + (f"  {n * k * 2 / (best * 1e-6) / bandwidth:.2f}" if best else ""),
                      flush=True)
            del ws
            torch.cuda.empty_cache()
    per_layer = {}
    for label, sel in _layers(rows, args.m):
        per_layer[label] = {f"{p}_us": round(sum(r[f"{p}_us"] for r in sel), 1)
                            for p in args.paths if sel and all(f"{p}_us" in r for r in sel)}
        print(f"one {label} layer's GEMMs: {per_layer[label]}")
    print_json_result({"benchmark": "skinny_gemm_paths", "device": device_info(),
                       "limits": limits, "commit": git_commit(), "paths": args.paths,
                       "rows": rows, "per_layer": per_layer}, args.json)


def cuda_sweep(args) -> None:
    """The CUDA dense GEMM (octavo/kernels/dense_mma.py) over launch plans per shape and M:
    the default plan, the best and every plan (a plan with no built kernel is recorded as an
    error)."""
    import torch

    from octavo.kernels.dense_mma import WARPS_PER_SM

    bandwidth, _, limits = device_limits()
    plans = [None] + [{"warps_per_sm": w, "steps": st, "nt": nt}
                      for w in (4, 6, 8, 12) for st in (2, 4, 8) for nt in (1, 2)]
    rows = []
    for model, shapes in SHAPES.items():
        for name, (n, k) in shapes.items():
            if name == "lm_head":
                continue
            ws = _weight_copies(n, k)
            for m in args.m:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                results = time_each(timed, plans, lambda cfg, x=x, ws=ws: [
                    lambda w=w: _cuda(x, w, **(cfg or {})) for w in ws])
                ok = [r for r in results if "us" in r]
                for r in ok:
                    r["hbm_fraction"] = round(n * k * 2 / (r["us"] * 1e-6) / bandwidth, 3)
                best = min(ok, key=lambda r: r["us"])
                default = results[0]
                t_ref = timed([lambda w=w, x=x: _cublas(x, w) for w in ws])
                rows.append({"model": model, "shape": name, "N": n, "K": k, "M": m,
                             "cublas_us": round(t_ref, 2), "default": default, "best": best,
                             "all": results})
                print(f"{model} {name} M={m}: cublas {t_ref:.2f} us, default "
                      f"{default.get('us')} us, best {best['us']} us {best['cfg']} "
                      f"({best['hbm_fraction']:.0%} of HBM)", flush=True)
            del ws
            torch.cuda.empty_cache()
    # Per plan, one layer's sum at each M: the plan to make the default.
    totals = {}
    for label, sel in _layers(rows, args.m):
        sums = [[cfg, round(sum(r["all"][i]["us"] for r in sel), 1)]
                for i, cfg in enumerate(plans) if all("us" in r["all"][i] for r in sel)]
        totals[label] = sums
        default = next((us for cfg, us in sums if cfg is None), None)
        best = min(sums, key=lambda c: c[1], default=None)
        print(f"one {label} layer: default plan (warps_per_sm={WARPS_PER_SM}) {default} us, "
              f"best {best}")
    print_json_result({"benchmark": "skinny_gemm_cuda_sweep", "device": device_info(),
                       "limits": limits, "commit": git_commit(), "rows": rows,
                       "layer_totals": totals}, args.json)


def _time_configs(timed, fn, x, ws, cfgs, label):
    """Microseconds of ``fn(x, w, **cfg)`` over the weight copies per configuration (None:
    the defaults): (the defaults' time, the best (us, cfg), [[cfg, us] of the others]).
    A configuration that does not fit is printed and skipped."""
    results = time_each(timed, cfgs, lambda cfg: [lambda w=w: fn(x, w, **(cfg or {}))
                                                   for w in ws])
    default, best, others = None, None, []
    for r in results:
        if "error" in r:
            print(f"  {label}{r['cfg']}: {r['error'].split(':')[0]}", flush=True)
            continue
        if r["cfg"] is None:
            default = r["us"]
        else:
            others.append([r["cfg"], r["us"]])
        if best is None or r["us"] < best[0]:
            best = (r["us"], r["cfg"])
    return default, best, others


if __name__ == "__main__":
    main()
