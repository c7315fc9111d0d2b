"""Read benchmarks/large_int_gemm.py's JSON and print the environment that selects the CUDA
large-batch kernel's fastest correct form on the layers the engine routes to it (gate_up and
down) at the given rows, e.g. ``OCTAVO_INT_LARGE_BF16_MATH=1 OCTAVO_INT_LARGE_DEEP=0``: a
device call's script runs the engine with it.

    python scripts/pick_wgmma_form.py RESULT.json [--m 256]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.large_int_gemm import CUDA_FORMS  # noqa: E402  (the benchmark's columns)

# Column -> (bf16_math, deep).
FORMS = {key: (bf16_math, deep) for key, bf16_math, deep in CUDA_FORMS}
LAYERS = ("gate_up", "down")


def pick(result: dict, m: int, max_err: float = 5e-3) -> str:
    """The form whose gate_up + down time at ``m`` rows is least among those that ran within
    ``max_err`` of dequantize-then-cuBLAS on both (the float form where none did)."""
    rows = [r for r in result["rows"] if r["M"] == m and r["shape"] in LAYERS]
    best, best_us = "cuda", float("inf")
    for key in FORMS:
        if len(rows) == len(LAYERS) and all(
                r.get(f"{key}_us") and r.get(f"{key}_rel_err", 1.0) < max_err for r in rows):
            us = sum(r[f"{key}_us"] for r in rows)
            if us < best_us:
                best, best_us = key, us
    bf16, deep = FORMS[best]
    return f"OCTAVO_INT_LARGE_BF16_MATH={int(bf16)} OCTAVO_INT_LARGE_DEEP={int(deep)}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json")
    ap.add_argument("--m", type=int, default=256)
    args = ap.parse_args()
    with open(args.json) as f:  # the benchmark's --json file: its result object
        print(pick(json.load(f), args.m))


if __name__ == "__main__":
    main()
