"""Block-scaled FP8 dense layers past the GEMV's 2 rows: the block GEMM's tiles against bf16.

For each Llama-3.1-8B projection (128 x 128 blocks, dummy weights) and row count, times (us,
CUDA-graph replays over enough weight copies that each call reads HBM):

- ``bf16``: ``F.linear`` on the dequantized bf16 weight (what a dequantized-at-load layer
  runs);
- ``dequant``: ``fp8_block_gemm.dequantize`` into bf16, then ``F.linear`` (the kept layer's
  path past OCTAVO_FP8_BLOCK_GEMM_MAX_M rows);
- ``scaled_mm``: ``fp8_block_gemm.block_scaled_mm`` (the activations rounded to FP8 per 128
  columns, then ``torch._scaled_mm``'s blockwise recipe: the kept layer's path past
  OCTAVO_FP8_BLOCK_GEMM_MAX_M rows);
- ``gemm``: ``fp8_block_gemm`` at its default tiles, and each candidate tile
  (BLOCK_M x BLOCK_N x BLOCK_K, warps, stages) of ``--tiles``.

It prints the fastest path per (projection, rows), the data for ``fp8_block_gemm.gemm_tiles``
and for OCTAVO_FP8_BLOCK_GEMM_MAX_M.

    python benchmarks/fp8_block_gemm.py [--m 3 16 64 256] [--tiles 64x128x128x4x3 ...]
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
TILES = ("16x32x128x4x4", "16x64x128x4x4", "32x64x128x4x4", "32x128x128x4x3",
         "64x64x64x4x3", "64x64x128x4x4", "64x128x128x4x3", "64x128x128x8x3",
         "128x64x128x4x3", "128x128x128x8x3", "128x128x64x8x4", "128x256x64x8x3")


def parse_tile(text: str):
    from octavo.kernels.fused_moe import MoeTiles

    bm, bn, bk, warps, stages = (int(v) for v in text.split("x"))
    return MoeTiles(bm, bn, bk, warps, stages)


def _dequant_linear(x, w, s, block):
    import torch.nn.functional as F

    from octavo.kernels.fp8_block_gemm import dequantize

    return F.linear(x, dequantize(w, s, block, x.dtype))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, nargs="+", default=[4, 16, 32, 64, 128, 256, 1024])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--tiles", nargs="+", default=list(TILES))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F

    from octavo.kernels.fp8_block_gemm import (
        block_scaled_mm,
        dequantize,
        fp8_block_gemm,
        gemm_tiles,
    )

    dev = torch.device("cuda")
    block = (128, 128)
    rows = []
    for name in args.shapes:
        n, k = SHAPES[name]
        copies = []
        for _ in range(flush_copies(n * k)):
            w = (torch.randn(n, k, device=dev) * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
            s = torch.rand(n // 128, k // 128, device=dev) * 1e-3
            copies.append((w, s))
        dense = [dequantize(w, s, block, torch.bfloat16) for w, s in copies[:flush_copies(2 * n * k)]]
        for m in args.m:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            row = {"shape": name, "n": n, "k": k, "m": m,
                   "default_tiles": "x".join(str(v) for v in gemm_tiles(m, x.dtype))}
            row["bf16"] = timed([partial(F.linear, x, d) for d in dense])
            row["dequant"] = timed([partial(_dequant_linear, x, w, s, block)
                                    for w, s in copies])
            if block_scaled_mm(x, *copies[0], block) is not None:
                row["scaled_mm"] = timed([partial(block_scaled_mm, x, w, s, block)
                                          for w, s in copies])
            row["gemm"] = timed([partial(fp8_block_gemm, x, w, s, block) for w, s in copies])
            for text in args.tiles:
                try:
                    row[text] = timed([partial(fp8_block_gemm, x, w, s, block, parse_tile(text))
                                       for w, s in copies])
                except Exception as e:  # noqa: BLE001 - a tile that does not fit: recorded
                    row[text] = f"{type(e).__name__}: {e}"[:120]
            timings = {key: v for key, v in row.items() if isinstance(v, float)}
            best = min((v, key) for key, v in timings.items()
                       if key not in ("bf16", "dequant", "scaled_mm"))
            row["best_tile"] = best[1]
            print(f"{name:8} m={m:4}: bf16 {row['bf16']:8.2f}  dequant {row['dequant']:8.2f}  "
                  f"scaled_mm {row.get('scaled_mm', float('nan')):8.2f}  gemm "
                  f"{row['gemm']:8.2f}  best tile {best[1]} {best[0]:8.2f} us", flush=True)
            rows.append(row)
        del copies, dense
        torch.cuda.empty_cache()
    print_json_result({"benchmark": "fp8_block_gemm", "device": device_info(),
                       "commit": git_commit(), "rows": rows}, args.json)


if __name__ == "__main__":
    main()
