"""How fast can this GPU read a one-row GEMV's weight in the pattern the FP8 GEMV reads it,
and how fast if each program's bytes were one contiguous range? The read ceilings, with no
arithmetic, next to the FP8 GEMV itself on the same weight.

PYTHONPATH=. python benchmarks/gemv_read_ceiling.py [--shapes 4096x28672 14336x4096]
    [--stages 2 3 4] [--json out.json]

For each weight [N, K] (float8: one byte a weight; ``KxN`` on the command line) and the FP8
GEMV's own plan (``octavo.kernels.fp8_gemv._plan``: BLOCK_N rows x BLOCK_K bytes a step, K
split over programs by the GEMV's own ``grid``), three timings, each a CUDA graph sweeping enough
copies that L2 holds none (CUDA events, median of replays):

- ``rows``: the GEMV's pattern without its arithmetic: program (tile, split) reads its
  BLOCK_N rows (K bytes apart) BLOCK_K bytes at a time over its K range, as int32 words.
- ``contiguous``: the same programs, the same bytes each, but each program's bytes one
  contiguous range (what a weight stored tile by tile would give).
- ``gemv``: ``fp8_gemv`` on the weight (bf16 activations, one row).

If ``rows`` reads at about the ``contiguous`` rate, the [N, K] layout is not what holds the
GEMV below the HBM rate; if ``gemv`` is well under ``rows``, its own pipeline is.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

# The checkout after PYTHONPATH's entries: a tree given there (a `git archive` export, for
# an A/B) is the octavo imported; before the installed packages.
sys.path.insert(1 + len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import (  # noqa: E402
    flush_copies,
    graph_median_ms,
    published_hbm_tbps,
    sweep_rate,
)
from octavo.kernels import fp8_gemv as gemv_mod  # noqa: E402
from octavo.kernels.triton_utils import tl, triton  # noqa: E402


@triton.jit
def _read_rows(w, out, words_per_row, words_per_split, BLOCK_N: tl.constexpr,
               BLOCK_W: tl.constexpr, STAGES: tl.constexpr):
    tile = tl.program_id(0)
    split = tl.program_id(1)
    rows = (tile * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    offs = tl.arange(0, BLOCK_W)
    start = split * words_per_split
    ptrs = w + rows[:, None] * words_per_row + start + offs[None, :]
    acc = tl.zeros([BLOCK_N, BLOCK_W], dtype=tl.int32)
    for i in tl.range(0, words_per_split, BLOCK_W, num_stages=STAGES):
        acc ^= tl.load(ptrs + i)
    tl.store(out + tile * tl.num_programs(1) + split, tl.sum(tl.sum(acc, axis=1), axis=0))


@triton.jit
def _read_contiguous(w, out, words_per_split, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr,
                     STAGES: tl.constexpr):
    tile = tl.program_id(0)
    split = tl.program_id(1)
    prog = tile * tl.num_programs(1) + split
    base = w + prog.to(tl.int64) * words_per_split * BLOCK_N
    offs = tl.arange(0, BLOCK_N * BLOCK_W)
    acc = tl.zeros([BLOCK_N * BLOCK_W], dtype=tl.int32)
    for i in tl.range(0, words_per_split * BLOCK_N, BLOCK_N * BLOCK_W, num_stages=STAGES):
        acc ^= tl.load(base + i + offs)
    tl.store(out + prog, tl.sum(acc, axis=0))


def measure(k: int, n: int, stages_list: list[int], peak: float | None,
            tiles_list: list[tuple[int, int]]) -> list[dict]:
    dev = torch.device("cuda")
    block_n, block_k, _, waves, _ = gemv_mod._plan(n, k)
    tiles, splits, k_per_split = gemv_mod.grid(n, k, block_n, block_k, waves, dev)
    assert k_per_split * splits == k, (k, block_k, splits)
    copies = flush_copies(n * k)
    ws = [torch.randint(-2**31, 2**31 - 1, (n, k // 4), device="cuda", dtype=torch.int32)
          for _ in range(copies)]
    out = torch.empty(4 * n, device="cuda", dtype=torch.int32)  # one word a program
    rows = []

    def report(pattern: str, cfg: str, ms: float) -> None:
        r = sweep_rate(n * k, ms, copies, peak)
        frac = r.pop("frac")
        rows.append({"k": k, "n": n, "pattern": pattern, "config": cfg, **r})
        print(f"K={k} N={n} {pattern:10s} {cfg:34s} {r['us']:8.2f} us  {r['tbps']:.2f} "
              f"TB/s{frac}", flush=True)

    plan = f"{block_n}x{block_k}, {tiles}x{splits} programs"
    for bn, bk in tiles_list:  # the same bytes read BLOCK_N x BLOCK_K other ways, rows only
        t, sp, kps = gemv_mod.grid(n, k, bn, bk, waves, dev)

        def run_other(bn=bn, bk=bk, t=t, sp=sp, kps=kps):
            for w in ws:
                _read_rows[(t, sp)](w, out, k // 4, kps // 4, BLOCK_N=bn, BLOCK_W=bk // 4,
                                    STAGES=2)

        if kps * sp == k and t * sp <= out.numel():
            report("rows", f"{bn}x{bk}, {t}x{sp} programs, stages 2",
                   graph_median_ms(run_other))
    for stages in stages_list:
        def run_rows(stages=stages):
            for w in ws:
                _read_rows[(tiles, splits)](w, out, k // 4, k_per_split // 4, BLOCK_N=block_n,
                                            BLOCK_W=block_k // 4, STAGES=stages)

        def run_contiguous(stages=stages):
            for w in ws:
                _read_contiguous[(tiles, splits)](w, out, k_per_split // 4, BLOCK_N=block_n,
                                                  BLOCK_W=block_k // 4, STAGES=stages)

        report("rows", f"{plan}, stages {stages}", graph_median_ms(run_rows))
        report("contiguous", f"{plan}, stages {stages}", graph_median_ms(run_contiguous))
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    fp8 = [w.view(torch.float8_e4m3fn) for w in ws]
    for w in fp8:  # no NaN codes: the GEMV's time does not depend on values
        w.view(torch.uint8).bitwise_and_(0x77)
    scale = torch.rand(n, device="cuda")

    def run_gemv():
        for w in fp8:
            gemv_mod.fp8_gemv(x, w, scale)

    report("gemv", plan, graph_median_ms(run_gemv))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["4096x28672", "14336x4096", "4096x6144"],
                    help="KxN weights (Llama-3.1-8B's gate_up, down, qkv)")
    ap.add_argument("--stages", nargs="+", type=int, default=[2, 3, 4])
    ap.add_argument("--tiles", nargs="*", default=["8x1024", "16x512", "64x128"],
                    help="other BLOCK_NxBLOCK_K row patterns timed (two stages)")
    ap.add_argument("--json")
    args = ap.parse_args()
    tiles_list = [tuple(int(v) for v in t.split("x")) for t in args.tiles]
    name = torch.cuda.get_device_name()
    peak = published_hbm_tbps(name)
    rows = []
    for shape in args.shapes:
        k, n = (int(v) for v in shape.lower().split("x"))
        rows += measure(k, n, args.stages, peak, tiles_list)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "gemv_read_ceiling", "device": name, "peak_tbps": peak,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
