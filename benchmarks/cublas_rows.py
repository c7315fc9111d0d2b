"""bf16 cuBLAS GEMMs (``F.linear``, what the engine runs for float linears past the decode
kernels' 32 rows) across batch sizes, to find the row counts where cuBLAS's choice of kernel
is slower than at a larger count: session 35 measured Llama-3.1-8B's gate_up (4096 -> 28672)
at 103-105 us for 128 rows against 74 us for 192 (benchmarks/wide_gemm.py's bf16 column, two
calls). Session 36 found the likely cause: that column ran ``x @ w`` on a [K, N] weight,
another cuBLAS layout; through F.linear on the engine's [N, K] weight (this script) gate_up
took 69.5 us at 128 rows and 78.5 at 192, and padding W2's 113-128-row steps to 192 changed
nothing.

    PYTHONPATH=. python benchmarks/cublas_rows.py [--shape llama-3.1-8b] [--m 64 72 ... 256]
        [--json out.json]

For each projection and row count: us per call from HBM (weight copies past L2, a CUDA graph,
CUDA-event means), and where a larger row count in the list is faster, that count and its
time: the rows to pad to. Also the time of the GEMM split in two halves along N (another
kernel choice for cuBLAS).
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
    flush_copies,
    git_commit,
    graph_timed,
    print_json_result,
)
from benchmarks.skinny_gemm import SHAPES  # noqa: E402


def slower_than_larger(times: dict[int, float]) -> dict[int, tuple[int, float]]:
    """Row counts whose time exceeds that of some larger count: {m: (the fastest larger
    count, its time)}."""
    out = {}
    ms = sorted(times)
    for i, m in enumerate(ms):
        larger = [(times[b], b) for b in ms[i + 1:]]
        if larger:
            t, b = min(larger)
            if t < times[m]:
                out[m] = (b, t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="llama-3.1-8b", choices=sorted(SHAPES))
    ap.add_argument("--m", type=int, nargs="+", default=list(range(64, 257, 16)))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F

    dev = torch.device("cuda")
    rows = []
    for name, (n, k) in SHAPES[args.shape].items():
        ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16)
              for _ in range(flush_copies(n * k * 2))]
        parts = [(w[: n // 2], w[n // 2:]) for w in ws]  # row-contiguous views
        times, halves = {}, {}
        for m in args.m:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            times[m] = graph_timed([lambda w=w, x=x: F.linear(x, w) for w in ws])
            halves[m] = graph_timed([lambda a=a, b=b, x=x: (F.linear(x, a), F.linear(x, b))
                                     for a, b in parts])
        worse = slower_than_larger(times)
        for m in args.m:
            row = {"shape": name, "N": n, "K": k, "M": m, "us": round(times[m], 2),
                   "halves_us": round(halves[m], 2)}
            if m in worse:
                row["faster_padded_to"], row["padded_us"] = worse[m][0], round(worse[m][1], 2)
            rows.append(row)
            print(f"{name:8s} M={m:4d} {times[m]:8.2f} us  two halves {halves[m]:8.2f} us"
                  + (f"  <- {worse[m][0]} rows take {worse[m][1]:.2f}" if m in worse else ""),
                  flush=True)
        del ws, parts
        torch.cuda.empty_cache()
    print_json_result({"benchmark": "cublas_rows", "device": device_info(),
                       "commit": git_commit(), "shape": args.shape, "rows": rows}, args.json)


if __name__ == "__main__":
    main()
