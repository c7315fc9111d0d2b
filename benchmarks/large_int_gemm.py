"""Large-batch weight-only integer GEMM on the swap-AB layout (octavo/kernels/swapab_large.py,
Triton, and swapab_wgmma.py, CUDA, warp-specialized) against the engine's path past 128 rows
(the whole weight dequantized, then cuBLAS) and a bf16 GEMM, at the Llama-3.1-8B projections,
4-bit (``--bits 8``: 8-bit) g128, on the GPU, in one call.

Each call reads its weights from HBM (enough copies that a sweep over them is several times
the L2), a sweep is one CUDA graph, times are CUDA-event means over replays (us per call).
Every configuration's output is checked against the dequantize-then-cuBLAS one (relative
error) before it is timed.

    python benchmarks/large_int_gemm.py [--m 129 192 256 384 512] [--sweep] [--no-cuda]
        [--forms cuda ...] [--splits 1 2 4] [--bits 8] [--json F]

Where the CUDA kernel splits K, its forms' columns sum the partials as the engine does
(OCTAVO_INT_LARGE_SPLIT_SUM, default a second launch, ``split_sum``); ``cuda_cta`` /
``cuda_launch`` time the float form with each tile's last CTA / a second launch summing
(``--split-sums``), and ``sum_only`` the second launch alone.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(1 + len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import (  # noqa: E402
    device_info,
    flush_copies,
    git_commit,
    print_json_result,
)
from benchmarks.common import graph_timed as timed  # noqa: E402
from benchmarks.quantized_gemm import SHAPES, int_weights  # noqa: E402

GROUP = 128


# (column, bf16_math, deep) of the CUDA kernel's forms.
CUDA_FORMS = (("cuda", False, False), ("cuda_bf16", True, False), ("cuda_deep", False, True),
              ("cuda_bf16_deep", True, True))


def sweep_configs() -> list[dict]:
    """Tiles to try (the kernel's default first): batch rows, 64-column value blocks and warps
    per program, K per step and stages in flight."""
    from octavo.kernels import swapab_large as kernel

    default = (kernel.BLOCK_M, kernel.COLS, kernel.NUM_WARPS, kernel.BLOCK_K, kernel.NUM_STAGES)
    out = [{}]
    # 4-warp tiles leave room for two programs per SM (one's dequantization beside the
    # other's MMAs: the loop waits for its own MMAs before the next step's dequantization).
    for bm, cols, warps in ((256, 2, 8), (128, 4, 8), (128, 2, 4), (256, 1, 4), (128, 1, 4)):
        for bk, stages in ((32, 4), (64, 2), (64, 3), (128, 2)):
            if (bm, cols, warps, bk, stages) != default:  # the first entry already
                    out.append({"block_m": bm, "cols": cols, "num_warps": warps,
                            "block_k": bk, "num_stages": stages})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, nargs="+", default=[129, 192, 256, 384, 512])
    ap.add_argument("--sweep", action="store_true", help="every tile of sweep_configs()")
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES))
    ap.add_argument("--forms", nargs="+", default=[f[0] for f in CUDA_FORMS],
                    choices=[f[0] for f in CUDA_FORMS],
                    help="the CUDA kernel's forms to time (a fault in one spoils the process "
                         "for the rest: leave out those whose tests failed)")
    ap.add_argument("--no-cuda", action="store_true",
                    help="leave out the CUDA kernel (a fault there can leave the process's "
                         "CUDA context unusable for what follows)")
    ap.add_argument("--splits", type=int, nargs="*", default=[],
                    help="K splits to time the CUDA kernel's float form at, beside its own plan")
    ap.add_argument("--split-sums", nargs="*", default=["cta", "launch"],
                    choices=["cta", "launch"],
                    help="the CUDA kernel's K-split sums to time the float form with")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"],
                    help="the activations' (and the scales') dtype: float16 times the kernel's "
                         "fp16 form, as float16 checkpoints (AutoAWQ, AutoGPTQ) run")
    ap.add_argument("--bits", type=int, default=4, choices=[4, 8])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    bits = args.bits
    import torch

    act = getattr(torch, args.dtype)

    from octavo.kernels import int_weight_layout
    from octavo.kernels.split_sum import sum_splits
    from octavo.kernels.swapab_large import swapab_large
    from octavo.kernels.swapab_wgmma import plan as swapab_wgmma_plan
    from octavo.kernels.swapab_wgmma import swapab_wgmma
    from octavo.kernels.w4a16_swapab import dequantize_swapab

    dev = torch.device("cuda")
    configs = sweep_configs() if args.sweep else [{}]
    rows = []
    for name in args.shapes:
        k, n = SHAPES[name]
        dense = [torch.randn(n, k, device=dev, dtype=act)
                 for _ in range(flush_copies(k * n * 2))]
        packs = [tuple(t.to(act) if t.is_floating_point() else t
                       for t in int_weights(k, n, bits, GROUP, dev, "swapab"))
                 for _ in range(flush_copies(k * n * bits // 8))]
        for m in args.m:
            x = torch.randn(m, k, device=dev, dtype=act)
            row = {"shape": name, "K": k, "N": n, "M": m,
                   "bf16_us": round(timed([lambda w=w, x=x: torch.nn.functional.linear(x, w)
                                           for w in dense]), 1),
                   "whole_us": round(timed([lambda p=p, x=x: x @ dequantize_swapab(
                       *p, GROUP, bits, x.dtype) for p in packs]), 1),
                   # What the engine runs at these rows under this environment (to 128 rows
                   # the swap-AB GEMMs; past them dequantize-then-cuBLAS by default).
                   "engine_us": round(timed([lambda p=p, x=x: int_weight_layout.linear(
                       x, *p, GROUP, bits, int_weight_layout.SWAPAB) for p in packs]), 1),
                   "large": []}
            want = (x @ dequantize_swapab(*packs[0], GROUP, bits, x.dtype)).float()
            for cfg in configs:
                entry = {"cfg": cfg}
                try:
                    got = swapab_large(x, *packs[0], GROUP, bits, **cfg).float()
                    entry["rel_err"] = round(((got - want).norm() / want.norm()).item(), 6)
                    entry["us"] = round(timed([lambda p=p, cfg=cfg, x=x: swapab_large(
                        x, *p, GROUP, bits, **cfg) for p in packs]), 1)
                except Exception as e:  # noqa: BLE001 - recorded (shared memory, registers)
                    entry["error"] = f"{type(e).__name__}: {e}"[:160]
                row["large"].append(entry)
            # The warp-specialized CUDA kernel (swapab_wgmma), where it builds: its float and
            # its bf16x2 dequantization ("_bf16"), with one or two MMA groups in flight
            # ("_deep").
            for key, bf16_math, deep in CUDA_FORMS:
                if key not in args.forms:
                    continue
                try:
                    if args.no_cuda:
                        raise RuntimeError("left out (--no-cuda)")
                    got = swapab_wgmma(x, *packs[0], GROUP, bits, bf16_math=bf16_math,
                                       deep=deep).float()
                    row[f"{key}_rel_err"] = round(((got - want).norm() / want.norm()).item(), 6)
                    row[f"{key}_us"] = round(timed([
                        lambda p=p, x=x, b=bf16_math, d=deep: swapab_wgmma(
                            x, *p, GROUP, bits, bf16_math=b, deep=d) for p in packs]), 1)
                except Exception as e:  # noqa: BLE001 - recorded (no sm_90, no nvcc, a fault)
                    row[f"{key}_error"] = f"{type(e).__name__}: {e}"[:300]
            # The float form at given K splits (``--splits``, summed as the engine sums): what the
            # partials and their sum cost against the MMAs they spread (qkv / o / down split at
            # 256 rows), and whether a layer whose tiles nearly fill the SMs pays unsplit
            # (gate_up at 128 rows: 112 tiles).
            # "_launch" / "_cta": the partials summed by a second launch over every SM
            # (split_sum) / by each tile's last CTA; "cuda_launch" / "cuda_cta": at the plan's
            # splits.
            runs = [(f"cuda_split{z}", z, None) for z in args.splits]
            runs += [(f"cuda_split{z}_{mode}", z, mode) for z in args.splits if z > 1
                     for mode in args.split_sums]
            plan_splits = swapab_wgmma_plan(m, n, k, dev)[0]
            if plan_splits > 1:
                runs += [(f"cuda_{mode}", None, mode) for mode in args.split_sums]
                if "launch" in args.split_sums:
                    # The second launch alone (its partials made once): cuda_launch less this
                    # is the GEMM with its partial stores, without any sum.
                    parts = torch.randn(plan_splits, m, n, device=dev)
                    outs = torch.empty(m, n, device=dev, dtype=act)
                    row["sum_only_us"] = round(
                        timed([lambda a=parts, b=outs: sum_splits(a, b)]), 1)
            for key, splits, mode in runs if "cuda_us" in row else ():
                try:
                    row[f"{key}_us"] = round(timed([
                        lambda p=p, x=x, s=splits, u=mode: swapab_wgmma(
                            x, *p, GROUP, bits, split_k=s, split_sum=u) for p in packs]), 1)
                except Exception as e:  # noqa: BLE001 - recorded
                    row[f"{key}_error"] = f"{type(e).__name__}: {e}"[:300]
            ok = [e for e in row["large"] if "us" in e and e["rel_err"] < 5e-3]
            best = min(ok, key=lambda e: e["us"], default=None)
            default = row["large"][0]
            row["default_us"] = default.get("us")
            row["best"] = best
            rows.append(row)
            print(f"{name:8s} m={m:4d} bf16 {row['bf16_us']:7.1f} whole {row['whole_us']:7.1f} "
                  f"engine {row['engine_us']:7.1f} "
                  f"large {default.get('us', default.get('error'))} "
                  f"(err {default.get('rel_err')}) best "
                  f"{best and best['us']} {best and best['cfg']} cuda "
                  f"{row.get('cuda_us', row.get('cuda_error'))} (err {row.get('cuda_rel_err')})"
                  + "".join(f" {key} {row.get(f'{key}_us', row.get(f'{key}_error'))} "
                            f"(err {row.get(f'{key}_rel_err')})" for key, *_ in CUDA_FORMS[1:])
                  + "".join(f" {key.removeprefix('cuda_').rsplit('_', 1)[0]} {value}"
                            for key, value in row.items()
                            if key.startswith(("cuda_split", "cuda_launch", "cuda_cta",
                                               "sum_only"))),
                  flush=True)
        del dense, packs
        torch.cuda.empty_cache()
    per_layer = {}
    for m in args.m:
        sel = [r for r in rows if r["M"] == m]
        if len(sel) == len(args.shapes) and all(r["default_us"] for r in sel):
            per_layer[m] = {key: round(sum(r[f"{key}_us"] for r in sel), 1)
                            for key in ("bf16", "whole", "engine", "default",
                                        *(form[0] for form in CUDA_FORMS))
                            if all(r.get(f"{key}_us") for r in sel)}
            print(f"one layer's GEMMs at M={m}: {per_layer[m]}", flush=True)
    print_json_result({"benchmark": "large_int_gemm", "bits": bits, "dtype": args.dtype,
                       "device": device_info(),
                       "commit": git_commit(), "rows": rows, "per_layer": per_layer}, args.json)


if __name__ == "__main__":
    main()
