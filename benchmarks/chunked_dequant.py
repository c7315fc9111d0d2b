"""Large-batch W4A16: dequantize-then-cuBLAS in N-chunks small enough to stay in L2.

Past 128 rows a 4-bit layer dequantizes its whole weight to bf16 (2 bytes a weight written to
HBM) and cuBLAS reads it back (2 more): W2 with W4A16 runs at 0.84x bf16 (issue 12's target
0.9x). Dequantizing ``--chunks`` output columns at a time and multiplying each chunk at once
might keep those bytes in L2 (50 MB on an H100 / H200). This times, per Llama-3.1-8B
projection and batch, in us (CUDA-graph replays over enough weight copies that every call
reads its packed weights from HBM):

- ``bf16``: ``F.linear`` on a bf16 [N, K] weight (what a bf16 model runs);
- ``whole``: the engine's path, the whole weight dequantized then one matmul (along-K layout
  through ``w4a16_gemm.dequantize``, swap-AB through ``w4a16_swapab.dequantize_swapab``);
- ``chunkC``: C output columns at a time, the chunks' products concatenated.

Each chunked result is checked against the whole one.

    python benchmarks/chunked_dequant.py [--m 128 256 512] [--chunks 1024 2048 4096 8192]
        [--json F]
"""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial

# The checkout after PYTHONPATH's entries: a tree given there (a `git archive` export, for
# an A/B) is the octavo imported; before the installed packages.
sys.path.insert(1 + len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import device_info, flush_copies, git_commit, print_json_result  # noqa: E402
from benchmarks.common import graph_timed as timed  # noqa: E402

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
          "down": (4096, 14336)}
GROUP = 128


def dequant(layout, q, s, z, dtype, c0=0, c1=None):
    """Columns [c0, c1) of the weight as a [K, c1 - c0] bf16 tensor (a view for swap-AB)."""
    if layout == "swapab":
        from octavo.kernels.w4a16_swapab import _per, dequantize_swapab

        c1 = c1 or q.shape[0] * _per(4)
        r0, r1 = c0 // _per(4), c1 // _per(4)  # whole ROWS x per tiles: chunk multiples of 64
        return dequantize_swapab(q[r0:r1], s[:, c0:c1], z[:, c0:c1], GROUP, 4, dtype)
    from octavo.kernels.w4a16_gemm import dequantize

    c1 = c1 or q.shape[1]
    return dequantize(q[:, c0:c1], s[:, c0:c1], z[:, c0:c1], GROUP, 4, dtype)


def whole(layout, x, q, s, z):
    return x @ dequant(layout, q, s, z, x.dtype)


def chunked(layout, n, chunk, x, q, s, z):
    import torch

    return torch.cat([x @ dequant(layout, q, s, z, x.dtype, c, min(n, c + chunk))
                      for c in range(0, n, chunk)], dim=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, nargs="+", default=[128, 256, 512])
    ap.add_argument("--chunks", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    ap.add_argument("--shapes", nargs="+", default=["gate_up", "down", "qkv"],
                    choices=list(SHAPES))
    ap.add_argument("--layouts", nargs="+", default=["swapab", "along_k"],
                    choices=["swapab", "along_k"])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F

    from benchmarks.quantized_gemm import int_weights

    dev = torch.device("cuda")
    rows = []
    for name in args.shapes:
        n, k = SHAPES[name]
        dense = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 1e-2
                 for _ in range(flush_copies(2 * n * k))]
        for layout in args.layouts:
            copies = [int_weights(k, n, 4, GROUP, dev, layout)
                      for _ in range(flush_copies(n * k // 2))]
            for m in args.m:
                x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                row = {"shape": name, "layout": layout, "n": n, "k": k, "m": m}
                row["bf16"] = timed([partial(F.linear, x, d) for d in dense])
                row["whole"] = timed([partial(whole, layout, x, *c) for c in copies])
                want = whole(layout, x, *copies[0]).float()
                for chunk in args.chunks:
                    if chunk >= n:
                        continue
                    got = chunked(layout, n, chunk, x, *copies[0]).float()
                    err = ((got - want).norm() / want.norm()).item()
                    assert err < 1e-2, (name, layout, m, chunk, err)
                    row[f"chunk{chunk}"] = timed([partial(chunked, layout, n, chunk, x, *c)
                                                  for c in copies])
                print(f"{name:8} {layout:8} m={m:4} " + " ".join(
                    f"{key} {v:.1f}" for key, v in row.items() if isinstance(v, float)),
                    flush=True)
                rows.append(row)
            del copies
        del dense
        torch.cuda.empty_cache()
    print_json_result({"benchmark": "chunked_dequant", "device": device_info(),
                       "commit": git_commit(), "rows": rows}, args.json)


if __name__ == "__main__":
    main()
