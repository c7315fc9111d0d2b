"""Weight-only integer GEMM (octavo/kernels/w4a16_gemm.py) against a bf16 cuBLAS GEMM at the
Llama-3.1-8B decode shapes, on the GPU, in one call.

Each layer's weights are replicated over enough copies that one sweep over them is several
times the L2 (so each call reads its weight from HBM, as in a real decode step where every
layer's weight is read once); a sweep is captured in a CUDA graph (as the engine's decode
steps are, so host launch time does not count) and times are CUDA-event means over replays.
Prints per shape and M: microseconds, speedup over bf16, and the weight bytes / time as a
fraction of the HBM bandwidth.

    python benchmarks/quantized_gemm.py [--bits 4 8] [--group 128] [--json out.json]
    python benchmarks/quantized_gemm.py --paths default gemm swapab --m 16 32 64 128
    python benchmarks/quantized_gemm.py --sweep   # tile configurations per shape and M
    python benchmarks/quantized_gemm.py --sweep --paths swapab --bits 4 --m 16 32 64 128
    python benchmarks/quantized_gemm.py --bits 4 --paths default swapab cuda --m 1 4 16
    python benchmarks/quantized_gemm.py --cuda-sweep --m 1 16   # the CUDA kernel's plans
    python benchmarks/quantized_gemm.py --fp8 --m 1 2          # the FP8 GEMV's tiles
    python benchmarks/quantized_gemm.py --fp8 --fp8-splits --m 1  # ... its split-K counts
    python benchmarks/quantized_gemm.py --fp8 --fp8-stages --m 1  # ... steps in flight
    python benchmarks/quantized_gemm.py --fp8-cuda --m 1 8 16 32  # float8 dense_mma's plans
"""

from __future__ import annotations

import argparse
import functools
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

# Llama-3.1-8B projections as (K, N): q/k/v merged, o, gate/up merged, down.
SHAPES = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672),
          "down": (14336, 4096)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bits", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--m", type=int, nargs="+", default=[1, 16, 64, 256])
    ap.add_argument("--json", default=None)
    ap.add_argument("--paths", nargs="+", default=["default"],
                    help="w4a16_gemm paths to time side by side: default (the dispatch), gemv, "
                         "gemm, dequant, swapab (its own packed layout), swapab_dequant "
                         "(dequantize that layout, then cuBLAS), cuda (the CUDA C++ kernel on "
                         "that layout, octavo/kernels/swapab_mma.py, M <= 16), layout "
                         "(the engine's dispatch "
                         "for a layer in the swap-AB layout), dequant_only / "
                         "swapab_dequant_only (the dequantization alone: its HBM fraction "
                         "counts the float weight written); keys w{bits}_{path}_us "
                         "(w{bits}_us for default)")
    ap.add_argument("--sweep", action="store_true",
                    help="time every candidate tile configuration (4-bit) and report the best")
    ap.add_argument("--swapab-only", action="store_true",
                    help="with --sweep: time only the swap-AB kernel's candidates")
    ap.add_argument("--gemv-only", action="store_true",
                    help="with --sweep at M <= 4: time only the GEMV's candidates")
    ap.add_argument("--dequant-sweep", action="store_true",
                    help="time the two dequantization kernels (the large-batch path) over "
                         "tile configurations; HBM fraction of the packed weight read plus "
                         "the float weight written")
    ap.add_argument("--cuda-sweep", action="store_true",
                    help="the CUDA swap-AB kernel (--bits) over launch plans: warps per SM, "
                         "K steps per chunk, warps per CTA (--stages: chunks in flight "
                         "through shared memory instead, 4-step chunks)")
    ap.add_argument("--stages", type=int, nargs="+", default=None,
                    help="with --cuda-sweep: stages to sweep (0 = the registers' pipeline) "
                         "over warps per SM 4-16 at 4-step chunks and CTAs of up to 8 warps")
    ap.add_argument("--fp8-cuda", action="store_true",
                    help="float8 weights through the CUDA dense_mma kernel: its launch plans "
                         "against bf16 cuBLAS, torch._scaled_mm and the FP8 GEMV")
    ap.add_argument("--fp8", action="store_true",
                    help="FP8 weights at M <= 4: the FP8 GEMV (a sweep of its tiles) against "
                         "torch._scaled_mm with per-token activation scales, as the engine "
                         "runs W8A8, and bf16")
    ap.add_argument("--fp8-splits", action="store_true",
                    help="with --fp8: sweep forced split-K counts on the planned tiles instead")
    ap.add_argument("--fp8-stages", action="store_true",
                    help="with --fp8: sweep tiles up to 32 KB with weights one or two steps "
                         "ahead (fp8_gemv's stages) instead")
    args = ap.parse_args()
    import torch


    bandwidth, _, limits = device_limits()
    dev = torch.device("cuda")

    if args.sweep:
        return sweep(args, timed, bandwidth, limits)
    if args.fp8:
        return fp8_sweep(args, timed, bandwidth, limits)
    if args.fp8_cuda:
        return fp8_cuda_sweep(args, timed, bandwidth, limits)
    if args.dequant_sweep:
        return dequant_sweep(args, timed, bandwidth, limits)
    if args.cuda_sweep:
        from benchmarks import quantized_gemm_cuda

        return quantized_gemm_cuda.cuda_sweep(args, timed, bandwidth, limits)

    rows = []
    for name, (k, n) in SHAPES.items():
        dense = _bf16_copies(k, n, dev)
        packs = {}  # (bits, path): weight copies in the layout the path reads
        for bits in args.bits:
            for layout in {_layout(path) for path in args.paths}:
                packs[bits, layout] = _int_copies(k, n, bits, args.group, dev, layout)
        for m in args.m:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            t_bf16 = timed([lambda w=w, x=x: torch.nn.functional.linear(x, w) for w in dense])
            row = {"shape": name, "K": k, "N": n, "M": m, "bf16_us": round(t_bf16, 1),
                   "bf16_hbm_fraction": round(k * n * 2 / (t_bf16 * 1e-6) / bandwidth, 3)}
            for bits in args.bits:
                nbytes = _weight_bytes(k, n, bits, args.group)
                for path in args.paths:
                    kw = {} if path == "default" else {"path": path}
                    key = f"w{bits}" if path == "default" else f"w{bits}_{path}"
                    try:
                        t_q = timed([lambda p=p, x=x, b=bits, path=path, kw=kw: _run(
                            path, x, p, args.group, b, kw) for p in packs[bits, _layout(path)]])
                    except Exception as e:  # noqa: BLE001 - recorded, the run goes on
                        row[f"{key}_error"] = f"{type(e).__name__}: {e}"[:160]
                        continue
                    row[f"{key}_us"] = round(t_q, 1)
                    row[f"{key}_speedup"] = round(t_bf16 / t_q, 2)
                    moved = nbytes + (k * n * 2 if path.endswith("dequant_only") else 0)
                    row[f"{key}_hbm_fraction"] = round(moved / (t_q * 1e-6) / bandwidth, 3)
            rows.append(row)
            print(" ".join(f"{key}={val}" for key, val in row.items()), flush=True)
        del dense, packs
        torch.cuda.empty_cache()
    totals = {}
    for m in args.m:
        sel = [r for r in rows if r["M"] == m]
        totals[m] = {"bf16_us": round(sum(r["bf16_us"] for r in sel), 1)}
        for bits in args.bits:
            for path in args.paths:
                key = f"w{bits}" if path == "default" else f"w{bits}_{path}"
                if any(f"{key}_us" not in r for r in sel):
                    continue
                tq = sum(r[f"{key}_us"] for r in sel)
                totals[m][f"{key}_us"] = round(tq, 1)
                totals[m][f"{key}_speedup"] = round(totals[m]["bf16_us"] / tq, 2)
        print(f"one Llama-8B layer's GEMMs at M={m}: {totals[m]}")
    print_json_result({"benchmark": "quantized_gemm", "device": device_info(), "limits": limits,
                       "commit": git_commit(), "group": args.group, "paths": args.paths,
                       "rows": rows,
                       "per_layer": totals}, args.json)


def _int_copies(k: int, n: int, bits: int, group: int, dev, layout: str) -> list:
    """Enough packed [K, N] weights in ``layout`` that a sweep over them reads several times
    the L2 (each call then reads its weight from HBM)."""
    copies = flush_copies(k * n * bits // 8)
    return [int_weights(k, n, bits, group, dev, layout) for _ in range(copies)]


def _weight_bytes(k: int, n: int, bits: int, group: int) -> float:
    """Bytes of a packed [K, N] integer weight with bf16 scales and zero points per group."""
    return k * n * bits / 8 + 2 * (k // group) * n * 2


def _layout(path: str) -> str:
    return "swapab" if path.startswith("swapab") or path in ("layout", "cuda") else "along_k"


def _run(path: str, x, p, group: int, bits: int, kw: dict):
    """One timed call of ``path`` on packed weights ``p`` (qweight, scales, zeros)."""
    from octavo.kernels import int_weight_layout
    from octavo.kernels.w4a16_gemm import dequantize, w4a16_gemm
    from octavo.kernels.w4a16_swapab import dequantize_swapab

    if path == "cuda":
        from octavo.kernels.swapab_mma import swapab_mma

        return swapab_mma(x, *p, group, bits)
    if path == "layout":  # what the engine runs for a layer in the swap-AB layout
        return int_weight_layout.linear(x, *p, group, bits, int_weight_layout.SWAPAB)
    if path == "swapab_dequant":
        return x @ dequantize_swapab(*p, group, bits, x.dtype)
    if path == "swapab_dequant_only":  # the dequantization alone (its share of the above)
        return dequantize_swapab(*p, group, bits, x.dtype)
    if path == "dequant_only":
        return dequantize(*p, group, bits, x.dtype)
    return w4a16_gemm(x, *p, group, bits, **kw)


def int_weights(k: int, n: int, bits: int, group: int, device, layout: str = "along_k"):
    """Dummy integer weights [K, N] in ``layout`` with bf16 scales and zero points, as the
    engine holds them: (qweight, scales, zeros)."""
    import torch

    groups = k // group
    return (_pack(layout, torch.randint(0, 2**bits, (k, n), device=device), bits),
            (torch.rand(groups, n, device=device) * 0.01).to(torch.bfloat16),
            torch.full((groups, n), 2 ** (bits - 1), device=device, dtype=torch.bfloat16))


def _pack(layout: str, q, bits: int):
    """Integer weights [K, N] in a packed layout (``_layout``)."""
    if layout == "swapab":
        from octavo.kernels.w4a16_swapab import pack_swapab

        return pack_swapab(q, bits)
    from octavo.kernels.w4a16_gemm import pack_along_k

    return pack_along_k(q, bits)


def _candidates(m: int) -> list[dict]:
    """Tile configurations to try at batch ``m`` (4-bit, group 128)."""
    if m <= 4:
        out = [{"path": "gemv"}, {"path": "gemv", "paired": False}]
        # Columns per thread (block_n / (128 x warps) x 4), packed rows per step, programs
        # per SM.
        out += [{"path": "gemv", "block_n": bn, "num_warps": w, "block_p": bp, "waves": wv}
                for wv in (1, 2, 4) for bn, w, bp in (
                    (256, 2, 4), (512, 2, 4), (512, 4, 2), (512, 4, 4), (512, 4, 8),
                    (1024, 2, 2), (1024, 4, 2), (1024, 4, 4), (1024, 8, 4), (2048, 4, 2))]
        out += [{"path": "gemm", "reload": False}]
        # Occupancy (ncu at M = 1 on gate_up: 127 registers, 4 programs of 4 warps per SM,
        # 0.61 instructions issued per cycle per scheduler): register caps, more programs.
        out += [{"path": "gemv", "maxnreg": r, "waves": wv} for r in (64, 80, 96)
                for wv in (4, 6, 8)]
        out += [{"path": "gemv", "block_p": 2, "maxnreg": r, "waves": wv} for r in (64, 80)
                for wv in (6, 8)]
        out += [{"path": "gemv", "block_n": 1024, "num_warps": 8, "waves": wv}
                for wv in (2, 4)]
        # Narrow tiles (more tiles, fewer K splits): cheaper now that the last program reads
        # 16 partials per round trip to L2 (session 16).
        out += [{"path": "gemv", "block_n": bn, "num_warps": w, "block_p": bp, "waves": wv}
                for wv in (4, 8, 16) for bn, w, bp in (
                    (128, 1, 4), (128, 1, 8), (256, 1, 4), (256, 2, 2), (256, 2, 8))]
        out += [{"path": "gemv", "waves": wv} for wv in (2, 3, 6, 8)]
        # 8 packed rows per step won on qkv / o at some K splits only (session 12): the splits.
        out += [{"path": "gemv", "block_p": 8, "split_k": sk} for sk in (8, 16, 24, 32, 48, 64)]
        # Weights two steps ahead instead of one: more bytes in flight per program, so fewer
        # K splits (a shorter reduction) for the same loads in flight.
        out += [{"path": "gemv", "prefetch": 2, "waves": wv} for wv in (1, 2, 3, 4)]
        out += [{"path": "gemv", "prefetch": 2, "block_p": bp, "split_k": sk}
                for bp in (4, 8) for sk in (4, 8, 16, 32)]
        return out
    out = [{"path": "gemm"}, {"path": "dequant"}]
    for bm, bn, bk in ((16, 64, 128), (32, 64, 128), (64, 64, 128), (64, 128, 64),
                       (64, 128, 128), (128, 128, 64)):
        if bm > 2 * m and bm > 16:
            continue
        for w, st in ((4, 3), (8, 3)):
            out.append({"path": "gemm", "block_m": bm, "block_n": bn, "block_k": bk,
                        "num_warps": w, "num_stages": st})
    out += [{"path": "gemm", "split_k": sk} for sk in (1, 2, 4, 8)]
    return out


def _swapab_candidates(m: int) -> list[dict]:
    """Tile configurations of the swap-AB kernel (its default first)."""
    out = [{"path": "swapab"}]
    out += [{"path": "swapab", "block_m": bm, "block_k": bk, "num_stages": st}
            for bm in (16, 32, 64) if bm <= max(16, 2 * m)
            for bk in (64, 128) for st in (2, 3, 4)]
    out += [{"path": "swapab", "split_k": sk} for sk in (1, 4, 8, 16)]
    out += [{"path": "swapab", "waves": wv} for wv in (2, 8)]
    # ncu at M = 1 and 16 on gate_up: 242 registers, 2 programs per SM, 1.7 warps per
    # scheduler, 72% of cycles with no eligible warp.
    out += [{"path": "swapab", "maxnreg": r, "waves": wv} for r in (128, 168)
            for wv in (2, 3, 4)]
    out += [{"path": "swapab", "maxnreg": 128, "block_k": 64, "num_stages": st, "waves": wv}
            for st in (3, 4) for wv in (3, 4)]
    # Tiles of 16 / 32 rows on mma.sync (one warp per 16 rows; 168 registers at 32 rows).
    out += [{"path": "swapab", "block_r": br, "waves": wv} for br in (16, 32)
            for wv in (2, 4, 6, 8, 12)]
    out += [{"path": "swapab", "block_r": 32, "num_stages": st, "waves": wv}
            for st in (2, 4) for wv in (4, 8)]
    return out


def sweep(args, timed, bandwidth, limits) -> None:
    import torch

    from octavo.kernels.w4a16_gemm import w4a16_gemm

    dev = torch.device("cuda")
    group = args.group
    rows = []
    for bits, (name, (k, n)) in [(b, s) for b in args.bits for s in SHAPES.items()]:
        dense = _bf16_copies(k, n, dev)
        packed = _int_copies(k, n, bits, group, dev, "along_k")
        # The swap-AB kernel's tiles too (--paths ... swapab), on its own packed layout.
        swapab = None
        if "swapab" in args.paths:
            swapab = [(_pack("swapab", torch.randint(0, 2**bits, (k, n), device=dev), bits),
                       sc, zp) for _, sc, zp in packed]
        for m in args.m:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            t_bf16 = timed([lambda w=w, x=x: torch.nn.functional.linear(x, w) for w in dense])
            nbytes = _weight_bytes(k, n, bits, group)
            row = {"shape": name, "bits": bits, "K": k, "N": n, "M": m,
                   "bf16_us": round(t_bf16, 2)}
            line = f"w{bits} {name} M={m} bf16={t_bf16:.1f}us"
            if not args.swapab_only:
                cands = [c for c in _candidates(m)
                         if not args.gemv_only or c.get("path") == "gemv"]
                results = time_each(timed, cands, lambda c, x=x, b=bits, ps=packed: [
                    lambda p=p: w4a16_gemm(x, p[0], p[1], p[2], group, b, **dict(c))
                    for p in ps])
                default, summary = _summary(results, cands[0], t_bf16, nbytes, bandwidth)
                row.update(default_us=default, **summary)
                best = row["best"]
                line += (f" default={default}us best={best['us']}us {best['cfg']} "
                         f"x{row['best_speedup']} hbm={row['best_hbm_fraction']}")
            if swapab is not None:
                res = time_each(timed, _swapab_candidates(m), lambda c, x=x, b=bits, ps=swapab: [
                    lambda p=p: w4a16_gemm(x, p[0], p[1], p[2], group, b, **dict(c))
                    for p in ps])
                _, row["swapab"] = _summary(res, _swapab_candidates(m)[0], t_bf16, nbytes,
                                            bandwidth)
                sb = row["swapab"]["best"]
                line += (f" | swapab best={sb['us']}us {sb['cfg']} "
                         f"x{row['swapab']['best_speedup']}")
            rows.append(row)
            print(line, flush=True)
        del dense, packed, swapab
        torch.cuda.empty_cache()
    print_json_result({"benchmark": "quantized_gemm_sweep", "device": device_info(),
                       "limits": limits, "commit": git_commit(), "group": group, "rows": rows},
                      args.json)


# (layout, tile arguments); the first of each layout is the default.
DEQUANT_CANDIDATES = (
    [("along_k", {"block_p": bp, "block_n": bn, "num_warps": w}) for bp, bn, w in (
        (4, 128, 4), (2, 256, 4), (4, 256, 4), (8, 128, 4), (2, 512, 4), (4, 512, 8),
        (8, 256, 8), (16, 128, 4))]
    + [("swapab", {"block_k": bk, "num_warps": w}) for bk, w in (
        (128, 4), (64, 4), (256, 4), (128, 8), (256, 8), (64, 2))])


def _dequant_calls(packs: dict, group: int, bits: int, cfg: dict) -> list:
    """One dequantization per weight copy of ``cfg``'s layout, with its tile arguments."""
    import torch

    from octavo.kernels.w4a16_gemm import dequantize
    from octavo.kernels.w4a16_swapab import dequantize_swapab

    fn = dequantize if cfg["layout"] == "along_k" else dequantize_swapab
    kw = {a: v for a, v in cfg.items() if a != "layout"}
    return [lambda p=p: fn(*p, group, bits, torch.bfloat16, **kw) for p in packs[cfg["layout"]]]


def dequant_sweep(args, timed, bandwidth, limits) -> None:
    import torch

    dev = torch.device("cuda")
    rows = []
    for bits, (name, (k, n)) in [(b, s) for b in args.bits for s in SHAPES.items()]:
        moved = _weight_bytes(k, n, bits, args.group) + k * n * 2  # + the bf16 weight written
        packs = {layout: _int_copies(k, n, bits, args.group, dev, layout)
                 for layout in ("along_k", "swapab")}
        res = time_each(timed, [{"layout": lay, **kw} for lay, kw in DEQUANT_CANDIDATES],
                        functools.partial(_dequant_calls, packs, args.group, bits))
        for r in res:
            if "us" in r:
                r["hbm_fraction"] = round(moved / (r["us"] * 1e-6) / bandwidth, 3)
        row = {"shape": name, "bits": bits, "K": k, "N": n, "results": res}
        for layout in ("along_k", "swapab"):
            mine = [r for r in res if r["cfg"]["layout"] == layout]  # the default first
            ok = [r for r in mine if "us" in r]
            if ok:
                row[f"{layout}_default"] = mine[0] if "us" in mine[0] else None
                row[f"{layout}_best"] = min(ok, key=lambda r: r["us"])
        rows.append(row)
        print(f"w{bits} {name}: " + " | ".join(
            f"{lay} default {row[f'{lay}_default'] and row[f'{lay}_default']['us']}us "
            f"best {row[f'{lay}_best']['us']}us {row[f'{lay}_best']['cfg']} "
            f"hbm {row[f'{lay}_best']['hbm_fraction']}"
            for lay in ("along_k", "swapab") if f"{lay}_best" in row), flush=True)
        packs = None
        torch.cuda.empty_cache()
    print_json_result({"benchmark": "quantized_gemm_dequant_sweep", "device": device_info(),
                       "limits": limits, "commit": git_commit(), "group": args.group,
                       "rows": rows}, args.json)


def _summary(results: list[dict], default_cfg: dict, t_bf16: float, nbytes: float,
             bandwidth: float) -> tuple[float | None, dict]:
    """A sweep's verdict for one shape: the default configuration's time (None if it failed)
    and the best candidate with its speedup over bf16 and fraction of HBM bandwidth for
    ``nbytes`` of weights, plus every result."""
    ok = [r for r in results if "us" in r]
    best = min(ok, key=lambda r: r["us"])
    default = ok[0]["us"] if ok and ok[0]["cfg"] == default_cfg else None
    return default, {"best": best, "best_speedup": round(t_bf16 / best["us"], 2),
                     "best_hbm_fraction": round(nbytes / (best["us"] * 1e-6) / bandwidth, 3),
                     "all": results}


def _fp8_candidates(splits: bool = False, stages: bool = False) -> list[dict]:
    if stages:  # the default, then tiles up to 32 KB with one or two steps ahead
        return [{}] + [{"block_n": bn, "block_k": bk, "num_warps": w, "waves": wv,
                        "stages": st}
                       for bn in (8, 16, 32) for bk in (256, 512, 1024) for w in (4, 8)
                       for wv in (1, 2) for st in (2, 3)
                       if 4096 <= bn * bk <= 32768]
    if splits:  # the default, then split-K forced on the tiles the plans use
        return [{}] + [{"block_n": bn, "block_k": bk, "num_warps": w, "split_k": sk}
                       for bn, bk, w in ((32, 256, 4), (16, 512, 8), (32, 512, 8),
                                         (16, 256, 4)) for sk in (1, 2, 3, 4, 6, 8)]
    out = [{}, {"x_load": 0}, {"x_load": 1}]  # the default tiles, activations read each way
    out += [{"block_n": bn, "block_k": bk, "num_warps": w, "waves": wv}
            for bn in (16, 32, 64) for bk in (256, 512) for w in (4, 8) for wv in (1, 2, 4)
            if bn * bk <= 16384]
    return out


def _bf16_copies(k: int, n: int, dev) -> list:
    """bf16 weights as the engine holds a float linear's: [n, k], timed through
    ``F.linear``, over enough copies to read HBM. Until session 36 this was ``x @ w`` on a
    [k, n] weight: another cuBLAS layout, whose kernel choice at 128 rows made Llama-8B's
    gate_up take 115 us against F.linear's 70 (docs/benchmarks.md, session 36)."""
    import torch

    return [torch.randn(n, k, device=dev, dtype=torch.bfloat16)
            for _ in range(flush_copies(k * n * 2))]



def fp8_weight(k: int, n: int, dev) -> tuple:
    """A dummy float8 weight [n, k] spread over the e4m3 range, and float32 row scales."""
    import torch

    from octavo.quantization.fp8_linear import FP8

    return ((torch.randn(n, k, device=dev) * 64).clamp(-448, 448).to(FP8),
            torch.rand(n, device=dev) * 0.01)


def _fp8_copies(k: int, n: int, dev) -> list:
    """(float8 weight [n, k], float32 row scales) copies: one sweep over them reads HBM."""
    return [fp8_weight(k, n, dev) for _ in range(flush_copies(k * n))]


def _scaled_mm_w8a8(x, w, s):
    """W8A8 as the engine runs it at large batches: x quantized per token, torch._scaled_mm."""
    import torch

    from octavo.quantization.fp8_linear import activation_scale, quantize_fp8

    xs = activation_scale(x.float(), per_token=True)
    return torch._scaled_mm(quantize_fp8(x.float(), xs), w.t(), scale_a=xs,
                            scale_b=s.reshape(1, -1), out_dtype=torch.bfloat16)


def fp8_cuda_sweep(args, timed, bandwidth, limits) -> None:
    import torch

    from octavo.kernels import dense_mma
    from octavo.kernels.fp8_gemv import fp8_gemv

    dev = torch.device("cuda")
    plans = [{}] + [{"warps_per_sm": w, "steps": s} for w in (4, 8, 16) for s in (1, 2, 4)]
    rows = []
    for name, (k, n) in SHAPES.items():
        dense = _bf16_copies(k, n, dev)
        weights = _fp8_copies(k, n, dev)
        for m in [m for m in args.m if m <= dense_mma.MAX_M]:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            t_bf16 = timed([lambda w=w, x=x: torch.nn.functional.linear(x, w) for w in dense])
            t_mm = timed([lambda p=p, x=x: _scaled_mm_w8a8(x, *p) for p in weights])
            t_gemv = (timed([lambda p=p, x=x: fp8_gemv(x, p[0], p[1]) for p in weights])
                      if m <= 2 else None)
            results = time_each(timed, plans, lambda c, x=x, ws=weights: [
                lambda p=p: dense_mma.dense_mma(x, p[0], None, p[1], **c) for p in ws])
            default, summary = _summary(results, plans[0], t_bf16, k * n, bandwidth)
            row = {"shape": name, "K": k, "N": n, "M": m, "bf16_us": round(t_bf16, 2),
                   "scaled_mm_us": round(t_mm, 2), "gemv_us": t_gemv and round(t_gemv, 2),
                   "cuda_default_us": default, **summary}
            rows.append(row)
            _print_fp8_row(row, f"gemv={t_gemv and round(t_gemv, 1)}us cuda={default}us")
        del dense, weights
        torch.cuda.empty_cache()
    print_json_result({"benchmark": "fp8_cuda_sweep", "device": device_info(),
                       "limits": limits, "commit": git_commit(), "rows": rows}, args.json)


def _print_fp8_row(row: dict, paths: str) -> None:
    best = row["best"]
    print(f"fp8 {row['shape']} M={row['M']} bf16={row['bf16_us']:.1f}us "
          f"scaled_mm={row['scaled_mm_us']:.1f}us {paths} best={best['us']}us {best['cfg']} "
          f"x{row['best_speedup']} hbm={row['best_hbm_fraction']}", flush=True)


def fp8_sweep(args, timed, bandwidth, limits) -> None:
    import torch

    from octavo.kernels.fp8_gemv import fp8_gemv

    dev = torch.device("cuda")
    rows = []
    for name, (k, n) in SHAPES.items():
        dense = _bf16_copies(k, n, dev)
        weights = _fp8_copies(k, n, dev)

        for m in [m for m in args.m if m <= 2]:  # fp8_gemv.MAX_M
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            t_bf16 = timed([lambda w=w, x=x: torch.nn.functional.linear(x, w) for w in dense])
            t_mm = timed([lambda p=p, x=x: _scaled_mm_w8a8(x, *p) for p in weights])
            candidates = _fp8_candidates(args.fp8_splits, args.fp8_stages)
            results = time_each(timed, candidates, lambda c, x=x, ws=weights: [
                lambda p=p: fp8_gemv(x, p[0], p[1], **c) for p in ws])
            default, summary = _summary(results, candidates[0], t_bf16, k * n, bandwidth)
            row = {"shape": name, "K": k, "N": n, "M": m, "bf16_us": round(t_bf16, 2),
                   "scaled_mm_us": round(t_mm, 2), "gemv_default_us": default, **summary}
            rows.append(row)
            _print_fp8_row(row, f"gemv={default}us")
        del dense, weights
        torch.cuda.empty_cache()
    print_json_result({"benchmark": "fp8_gemv_sweep", "device": device_info(),
                       "limits": limits, "commit": git_commit(), "rows": rows}, args.json)


if __name__ == "__main__":
    main()
