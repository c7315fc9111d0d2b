"""Row-scaled FP8 dense layers (``quantization="fp8"``, per-channel checkpoints) at decode
batches past the GEMV: every path the engine could take, per Llama-3.1-8B projection.

At 16 rows the engine's row-scaled path (per-token activation quantization, then
``torch._scaled_mm`` with row-wise scales) ran 0.91x bf16 on an H200 where block-scaled
layers (``fp8_group_quant`` + the blockwise recipe) ran 1.15x (session 45). This times, in us
(CUDA-graph replays over enough weight copies that each call reads HBM):

- ``bf16``: ``F.linear`` on the dequantized bf16 weight; ``bf16_mma``: the CUDA dense kernel
  the engine runs for bf16 at up to 32 rows (``dense_mma``), where it takes the shape;
- ``rowwise``: ``fp8.scaled_mm_linear`` without OCTAVO_FP8_TENSORWISE (quantizer + row-wise
  ``_scaled_mm``: the engine's path at 9+ rows before session 45); ``rowwise_mm``: its
  ``_scaled_mm`` alone, ``quant``: its quantizer alone (``quant_2048``: in the 2,048-wide
  steps it took before session 45);
- ``tensorwise_mm``: ``_scaled_mm`` with one scale per operand (pre-quantized);
- ``blockwise``: ``fp8_group_quant`` + the blockwise recipe on all-ones 128 x 128 scales
  (what the GEMM kernel itself costs; row scales would still need applying);
- ``unit``: ``fp8.scaled_mm_linear`` with OCTAVO_FP8_TENSORWISE (quantizer, ``_scaled_mm``
  with unit scales into float32, ``outer_scale``: the engine's path at 9+ rows since
  session 45);
- ``mma``: the CUDA float8 kernel (``dense_mma`` with the row scales; the engine's 2-8 rows).

Session 45's first run also timed fused_moe's down launch as a weight-only row-scaled GEMM
(8 tiles): 1.3-5x slower than bf16 everywhere, so it was dropped.

    python benchmarks/fp8_rows_gemm.py [--m 8 16 32 64 256] [--json F]
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
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, nargs="+", default=[8, 16, 32, 64])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F

    from octavo.kernels import dense_mma
    from octavo.kernels.fp8_block_gemm import block_scaled_mm
    from octavo.kernels.fp8_quant import fp8_quant
    from octavo.quantization.fp8 import scaled_mm_linear

    dev = torch.device("cuda")
    fp8 = torch.float8_e4m3fn
    rows = []
    for name in args.shapes:
        n, k = SHAPES[name]
        copies = []
        for _ in range(flush_copies(n * k)):
            w = (torch.randn(n, k, device=dev) * 64).clamp(-448, 448).to(fp8)
            copies.append((w, torch.rand(n, device=dev) * 1e-3 + 1e-4))
        dense = [(w.float() * s[:, None]).to(torch.bfloat16)
                 for w, s in copies[:flush_copies(2 * n * k)]]
        ones = torch.ones(n // 128, k // 128, device=dev)
        for m in args.m:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            xq, xs = fp8_quant(x, None, 1e-12, "clamp")
            row = {"shape": name, "n": n, "k": k, "m": m}
            row["bf16"] = timed([partial(F.linear, x, d) for d in dense])
            if dense_mma.fits(x, dense[0]) and dense_mma.available(dev):
                row["bf16_mma"] = timed([partial(dense_mma.dense_mma, x, d) for d in dense])
            for key, flag in (("rowwise", "0"), ("unit", "1")):
                os.environ["OCTAVO_FP8_TENSORWISE"] = flag
                row[key] = timed([partial(scaled_mm_linear, x, w, s, None) for w, s in copies])
            row["quant"] = timed([partial(fp8_quant, x, None, 1e-12, "clamp")] * 8)
            row["quant_2048"] = timed([partial(fp8_quant, x, None, 1e-12, "clamp", 2048)] * 8)
            row["rowwise_mm"] = timed([partial(torch._scaled_mm, xq, w.t(), xs, s.view(1, -1),
                                               out_dtype=torch.bfloat16) for w, s in copies])
            one = torch.ones((), device=dev)
            row["tensorwise_mm"] = timed([partial(torch._scaled_mm, xq, w.t(), one, one,
                                                  out_dtype=torch.bfloat16)
                                          for w, _ in copies])
            if block_scaled_mm(x, copies[0][0], ones, (128, 128)) is not None:
                row["blockwise"] = timed([partial(block_scaled_mm, x, w, ones, (128, 128))
                                          for w, _ in copies])
            if dense_mma.fits(x, copies[0][0], None, copies[0][1]) \
                    and dense_mma.available(dev, fp8=True):
                row["mma"] = timed([partial(dense_mma.dense_mma, x, w, None, s)
                                    for w, s in copies])
            timings = {key: v for key, v in row.items() if isinstance(v, float)}
            best = min((v, key) for key, v in timings.items() if not key.startswith("quant"))
            row["best"] = best[1]
            print(f"{name:8} m={m:3} " + " ".join(f"{key} {v:.2f}" for key, v in timings.items())
                  + f" | best {best[1]}", flush=True)
            rows.append(row)
        del copies, dense
        torch.cuda.empty_cache()
    print_json_result({"benchmark": "fp8_rows_gemm", "device": device_info(),
                       "commit": git_commit(), "rows": rows}, args.json)


if __name__ == "__main__":
    main()
