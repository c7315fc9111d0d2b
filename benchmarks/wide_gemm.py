"""The large-batch weight-only GEMM on the swap-AB layout (octavo/kernels/w4a16_swapab_wide.py)
against what the engine ran there before it: the swap-AB GEMM (batch on the MMA's N side) up to
128 rows and dequantize-then-cuBLAS above, with bf16 cuBLAS as the peer, at Llama-3.1-8B's
gate_up and down (the projections the swap-AB layout holds), microseconds per call from HBM.

    PYTHONPATH=. python benchmarks/wide_gemm.py [--m 64 128 192 256] [--bits 4] [--sweep]
        [--shapes gate_up down] [--json out.json]

Timings: CUDA graphs over enough weight copies that L2 holds none, CUDA-event means
(``benchmarks.common.graph_timed``); bf16 scales and zero points, bf16 activations.
``--sweep`` adds the wide kernel's tiles (rows per program, K step, stages, K split, 16-bit
or float32 dequantization) besides its default.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import (  # noqa: E402
    device_info,
    git_commit,
    graph_timed,
    print_json_result,
    time_each,
)
from benchmarks.quantized_gemm import (  # noqa: E402
    SHAPES,
    _bf16_copies,
    _int_copies,
    _summary,
    _weight_bytes,
)
from benchmarks.workloads import device_limits  # noqa: E402


def candidates(sweep: bool) -> list[dict]:
    """The wide kernel's configurations: its default first."""
    out = [{}, {"h16": False}]
    if sweep:
        out += [{"block_k": 128}, {"num_stages": 4}, {"num_stages": 2}, {"waves": 2},
                {"block_m": 64}, {"block_m": 64, "waves": 2}, {"block_m": 64, "block_k": 128}]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, nargs="+", default=[64, 128, 192, 256])
    ap.add_argument("--bits", type=int, nargs="+", default=[4])
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--shapes", nargs="+", default=["gate_up", "down"])
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import torch

    from octavo.kernels import int_weight_layout
    from octavo.kernels.w4a16_swapab import dequantize_swapab, w4a16_swapab
    from octavo.kernels.w4a16_swapab_wide import w4a16_swapab_wide

    bandwidth, _, limits = device_limits()
    dev = torch.device("cuda")
    g = args.group
    peers = {
        "swapab": lambda x, p, b: w4a16_swapab(x, *p, g, b),
        "dequant": lambda x, p, b: x @ dequantize_swapab(*p, g, b, x.dtype),
        "engine": lambda x, p, b: int_weight_layout.linear(x, *p, g, b,
                                                           int_weight_layout.SWAPAB),
    }
    rows = []
    for name in args.shapes:
        k, n = SHAPES[name]
        dense = _bf16_copies(k, n, dev)
        for bits in args.bits:
            packs = _int_copies(k, n, bits, g, dev, "swapab")
            nbytes = _weight_bytes(k, n, bits, g)
            for m in args.m:
                x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                t_bf16 = graph_timed([lambda w=w, x=x: x @ w for w in dense])
                row = {"shape": name, "bits": bits, "K": k, "N": n, "M": m,
                       "bf16_us": round(t_bf16, 2)}
                for key, fn in peers.items():
                    if key == "swapab" and m > 128:
                        continue
                    try:
                        row[f"{key}_us"] = round(graph_timed(
                            [lambda p=p, x=x, fn=fn, b=bits: fn(x, p, b) for p in packs]), 2)
                    except Exception as e:  # noqa: BLE001 - recorded, the run goes on
                        row[f"{key}_error"] = f"{type(e).__name__}: {e}"[:160]
                cands = candidates(args.sweep)
                res = time_each(graph_timed, cands, lambda c, x=x, b=bits, ps=packs: [
                    lambda p=p: w4a16_swapab_wide(x, *p, g, b, **c) for p in ps])
                default, row["wide"] = _summary(res, cands[0], t_bf16, nbytes, bandwidth)
                row["wide_us"] = default
                best = row["wide"]["best"]
                print(f"w{bits} {name} M={m}: bf16 {t_bf16:.1f}  " + "  ".join(
                    f"{key} {row.get(key + '_us')}" for key in peers)
                    + f"  wide {default}  best {best['us']} {best['cfg']} "
                    f"(x{row['wide']['best_speedup']} of bf16)", flush=True)
                errors = [r for r in res if "error" in r]
                if errors:
                    print(f"  {len(errors)} configurations failed, first: {errors[0]}")
                rows.append(row)
            del packs
        del dense
        torch.cuda.empty_cache()
    print_json_result({"benchmark": "wide_gemm", "device": device_info(), "limits": limits,
                       "commit": git_commit(), "group": g, "rows": rows}, args.json)


if __name__ == "__main__":
    main()
