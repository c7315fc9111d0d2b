"""Launch one decode GEMM kernel a few times at a Llama-3.1-8B projection shape, for a
profiler that picks one launch by name (``ncu -k regex:NAME --launch-skip 3 --launch-count 1``).

    python scripts/gemm_kernel_once.py --kernel int_gemv|swapab|dense_gemv|cublas \
        [--shape gate_up] [--m 1] [--bits 4] [--launches 5]

or one of benchmarks/gemv_scaling.py's kernels at one row (bf16_mma, fp8_gemv, fp8_mma,
w4_mma: the CUDA swap-AB kernel, w8_gemv, ...).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import gemv_scaling  # noqa: E402
from benchmarks.quantized_gemm import SHAPES, int_weights  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernel", required=True,
                    choices=["int_gemv", "swapab", "dense_gemv", "cublas", "int_gemm",
                             *gemv_scaling.KERNELS])
    ap.add_argument("--shape", default="gate_up", choices=sorted(SHAPES))
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--launches", type=int, default=5)
    args = ap.parse_args()
    import torch

    from octavo.kernels.w4a16_gemm import w4a16_gemm

    dev = torch.device("cuda")
    k, n = SHAPES[args.shape]
    x = torch.randn(args.m, k, device=dev, dtype=torch.bfloat16)
    if args.kernel in gemv_scaling.KERNELS:
        w = gemv_scaling.make_weight(args.kernel, k, n, dev)

        def run():
            return gemv_scaling.call(args.kernel, x[:1], w)
    elif args.kernel in ("dense_gemv", "cublas"):
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        if args.kernel == "dense_gemv":
            from octavo.kernels.dense_gemv import dense_gemv

            def run():
                return dense_gemv(x, w)
        else:
            def run():
                return torch.nn.functional.linear(x, w)
    else:
        layout = "swapab" if args.kernel == "swapab" else "along_k"
        qw, s, z = int_weights(k, n, args.bits, args.group, dev, layout)
        kw = {"path": {"swapab": "swapab", "int_gemv": "gemv"}.get(args.kernel, "gemm")}

        def run():
            return w4a16_gemm(x, qw, s, z, args.group, args.bits, **kw)
    for _ in range(args.launches):
        run()
    torch.cuda.synchronize()
    print(f"{args.kernel} {args.shape} M={args.m}: {args.launches} launches")


if __name__ == "__main__":
    main()
