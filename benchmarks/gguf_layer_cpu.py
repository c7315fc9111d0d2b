"""One GGUF layer's product on the CPU, from DRAM: a real file's tensors through Octavo's
quantized kernel (``gguf_linear``) as the engine lays them out, timed per call.

    PYTHONPATH=. python benchmarks/gguf_layer_cpu.py FILE TENSOR... [--threads 1,2] [--m 1]

Each tensor is repacked as the engine would (16-row interleaved where this CPU's kernel reads
that layout) and copied until the copies pass 256 MB, and the calls cycle through the copies,
so the weights come from DRAM as in a decode step (one layer called repeatedly would sit in L3
and measure that instead). Per thread count: the median of 5 passes over the copies, in us a
call and GB/s of the bytes the kernel reads (weights, scales, mins).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

# The checkout after PYTHONPATH's entries: a tree given there (a `git archive` export, for
# an A/B) is the octavo imported; before the installed packages.
sys.path.insert(1 + len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import device_info, git_commit, print_json_result  # noqa: E402

COPIES_BYTES = 256e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file", help="a GGUF file")
    ap.add_argument("tensors", nargs="+", help="tensor names, e.g. blk.0.ffn_down.weight")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--m", type=int, default=1, help="activation rows (1: batch-1 decode)")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args(argv)

    import numpy as np
    import torch
    from gguf import GGUFReader

    from octavo.kernels import cpu as cpu_kernels
    from octavo.quantization import gguf_blocks
    from octavo.quantization.gguf import interleave_weights

    ops = cpu_kernels.load()
    if ops is None:
        print("the CPU kernels are not built here")
        return 1
    tensors = {t.name: t for t in GGUFReader(args.file).tensors}
    rows = []
    for name in args.tensors:
        t = tensors[name]
        fmt = gguf_blocks.format_name(int(t.tensor_type))
        k, n = int(t.shape[0]), int(t.shape[1])
        raw = torch.from_numpy(np.array(t.data).reshape(n, -1).copy())
        packed = gguf_blocks.repack(raw, fmt, k, interleave_weights())
        nbytes = sum(p.numel() * p.element_size() for p in packed)
        copies = [tuple(p.clone() for p in packed)
                  for _ in range(max(1, int(COPIES_BYTES // nbytes)))]
        x = torch.randn(args.m, k)
        for threads in map(int, args.threads.split(",")):
            torch.set_num_threads(threads)
            for q, s, m in copies[:3]:
                ops.gguf_linear(x, q, s, m, k, 0)
            passes = []
            for _ in range(5):
                t0 = time.perf_counter()
                for q, s, m in copies:
                    ops.gguf_linear(x, q, s, m, k, 0)
                passes.append((time.perf_counter() - t0) / len(copies))
            sec = statistics.median(passes)
            row = {"tensor": name, "format": fmt, "out": n, "in": k, "m": args.m,
                   "threads": threads, "us": sec * 1e6, "gb_s": nbytes / sec / 1e9}
            rows.append(row)
            print(f"{name} {fmt} {n}x{k} M={args.m} threads={threads}: {row['us']:.0f} us, "
                  f"{row['gb_s']:.1f} GB/s", flush=True)
    print_json_result({"benchmark": "one GGUF layer on the CPU, from DRAM", "file": args.file,
                       "device": device_info(), "commit": git_commit(), "rows": rows},
                      args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
