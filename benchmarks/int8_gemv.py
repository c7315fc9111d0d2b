"""The 8-bit integer GEMV on the rows layout (octavo/kernels/int8_gemv.py) against the along-K
8-bit GEMV it replaces at one and two rows, and the FP8 GEMV on the same byte count: Llama-3.1-8B
projections, microseconds per call from HBM.

PYTHONPATH=. python benchmarks/int8_gemv.py [--m 1] [--sweep] [--scale-copies] [--json out.json]
(``--m`` above 2: the rows layout's tensor-core GEMM against the along-K GEMM.)

Each timing is a CUDA graph sweeping enough copies of the weight that L2 holds none (CUDA
events, median of replays), g128 scales and zeros in fp16, bf16 activations. gate_up runs with
the fused activation store where the kernel has one (rows and FP8: ``glu``). The rows kernel
runs g128 (symmetric and not, exact q - z or 1.0-offset sums) and one group per row (its
full K steps), and g128 on bytes pre-tiled by ``fp8_tiled.tile_fp8_weight`` (each 128-wide
step one contiguous block). ``--sweep`` times the rows kernel's g128 tiles (BLOCK_N x BLOCK_K, warps, waves, steps in flight, exact or
1.0-offset sums) besides its plan.
"""

from __future__ import annotations

import argparse
import itertools
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
from octavo.kernels import int8_gemv as rows_mod  # noqa: E402
from octavo.kernels.fp8_gemv import fp8_gemv  # noqa: E402
from octavo.kernels.w4a16_gemv import w4a16_gemv  # noqa: E402

SHAPES = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672),
          "down": (14336, 4096)}
GROUP = 128


def _sweep_plans(name: str) -> list[dict]:
    """g128 tiles of 128-wide K steps, with waves (programs per SM the K split aims for) 1, 2
    and 4: session 33's sweep held waves at 1 (gate_up 2), which left qkv / o / down at 1.1-1.5
    programs per SM, the busiest SM running twice the average (a lead, not yet measured)."""
    plans = []
    for bn, warps, stages, waves in itertools.product((32, 64, 128), (4, 8), (2, 3),
                                                      (1, 2, 4)):
        plans.append({"block_n": bn, "block_k": 128, "num_warps": warps, "waves": waves,
                      "stages": stages})
    return plans


def _weights(k: int, n: int) -> tuple[int, list[torch.Tensor], torch.Tensor]:
    """(copies, that many random rows-layout weights uint8 [N, K], g128 fp16 scales): enough
    copies that a sweep over them reads HBM."""
    copies = flush_copies(n * k)
    g = torch.Generator(device="cuda").manual_seed(0)
    rows_w = [torch.randint(0, 256, (n, k), device="cuda", dtype=torch.uint8, generator=g)
              for _ in range(copies)]
    return copies, rows_w, torch.rand(k // GROUP, n, device="cuda").half() * 0.01


def _reporter(out: list, name: str, m: int, nbytes: int, copies: int, peak: float | None):
    """report(kernel, config, ms): one timing of ``copies`` weights of ``nbytes`` each, as a
    row of ``out`` and a printed line."""
    def report(kernel: str, cfg: str, ms: float) -> None:
        r = sweep_rate(nbytes, ms, copies, peak)
        frac = r.pop("frac")
        out.append({"shape": name, "m": m, "kernel": kernel, "config": cfg, **r})
        print(f"{name:8s} m={m} {kernel:10s} {cfg:60s} {r['us']:8.2f} us {r['tbps']:.2f} "
              f"TB/s{frac}", flush=True)
    return report


def measure(name: str, m: int, sweep: bool, peak: float | None,
            scale_copies: bool = False) -> list[dict]:
    """``scale_copies``: each weight copy with its own g128 scales, as every layer has in the
    engine (by default one scales tensor serves every copy and stays in L2; a hypothesis for
    why session 34's microbenchmark gains did not reach the engine)."""
    k, n = SHAPES[name]
    glu = name == "gate_up"
    copies, rows_w, scales = _weights(k, n)
    copy_scales = [torch.rand_like(scales) * 0.01 if scale_copies else scales
                   for _ in range(copies)]
    zeros = torch.randint(0, 256, (k // GROUP, n), device="cuda").half()
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    out = []
    report = _reporter(out, name, m, n * k, copies, peak)

    def rows_run(zero, **t):
        def run():
            for w, sc in zip(rows_w, copy_scales):
                rows_mod.int8_gemv(x, w, sc, zero, GROUP, glu=glu, **t)
        return run

    for zero, label in ((128.0, "sym"), (zeros, "asym")):
        for exact in (False, True):
            report("rows", f"plan g128 {label} exact={exact}",
                   graph_median_ms(rows_run(zero, exact=exact)))
    channel = torch.rand(1, n, device="cuda").half() * 0.01  # one group per row

    def channel_run(exact):
        def run():
            for w in rows_w:
                rows_mod.int8_gemv(x, w, channel, 128.0, k, glu=glu, exact=exact)
        return run

    for exact in (False, True):
        report("rows", f"plan per channel sym exact={exact}", graph_median_ms(channel_run(exact)))
    from octavo.kernels.fp8_tiled import tile_fp8_weight

    for bn in (32, 64):  # g128 on bytes pre-tiled [N / bn, K / 128, bn, 128]
        tiles = [tile_fp8_weight(w, bn, 128, glu=glu) for w in rows_w]

        def tiled_run(tiles=tiles, bn=bn):
            for w in tiles:
                rows_mod.int8_gemv(x, w, scales, 128.0, GROUP, glu=glu, tiled=(bn, 128))

        report("rows", f"g128 sym tiled {bn}x128", graph_median_ms(tiled_run))
        tiles.clear()
    if sweep:
        for t in _sweep_plans(name):
            try:
                report("rows", f"sym {t}", graph_median_ms(rows_run(128.0, **t)))
            except Exception as e:  # noqa: BLE001 - a plan the compiler refuses
                print(f"{name} {t}: {type(e).__name__}: {str(e)[:120]}")
    along_c = [rows_mod.as_along_k(w).contiguous() for w in rows_w]  # its own layout

    def along_contig():
        for w, sc in zip(along_c, copy_scales):
            w4a16_gemv(x, w, sc, zeros, GROUP, 8)

    report("along_k", "8-bit GEMV g128 (its layout)", graph_median_ms(along_contig))
    along_c.clear()
    fp8 = [w.view(torch.float8_e4m3fn) for w in rows_w]
    for w in fp8:  # no NaN codes
        w.view(torch.uint8).bitwise_and_(0x77)
    fscale = torch.rand(n, device="cuda")

    def fp8_run():
        for w in fp8:
            fp8_gemv(x, w, fscale, glu=glu)

    report("fp8", "FP8 GEMV plan", graph_median_ms(fp8_run))
    return out


def measure_gemm(name: str, m: int, sweep: bool, peak: float | None) -> list[dict]:
    """Batches above the GEMV's two rows: ``int8_rows_gemm`` on the rows layout (per channel,
    the engine's default for such 8-bit layers, and g128) against the along-K GEMM on its own
    layout, the two that decide a layer's layout at 3-128 rows (session 34: per-channel rows
    lost at batch 64, 6.974 against 6.527 ms a token). ``--sweep``: the rows GEMM's tiles."""
    from octavo.kernels import int8_rows_gemm as rows_gemm
    from octavo.kernels.w4a16_gemm import _gemm as along_gemm

    k, n = SHAPES[name]
    copies, rows_w, scales = _weights(k, n)
    channel = torch.rand(1, n, device="cuda").half() * 0.01
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    out = []
    report = _reporter(out, name, m, n * k, copies, peak)

    def rows_run(sc, group, **t):
        def run():
            for w in rows_w:
                rows_gemm.int8_rows_gemm(x, w, sc, 128.0, group, **t)
        return run

    report("rows_gemm", "plan per channel", graph_median_ms(rows_run(channel, k)))
    report("rows_gemm", "plan g128", graph_median_ms(rows_run(scales, GROUP)))
    if sweep:
        for bm, bn, bk, warps, stages in itertools.product(
                (16, 32, 64), (64, 128, 256), (64, 128), (4, 8), (2, 3, 4)):
            t = {"block_m": bm, "block_n": bn, "block_k": bk, "num_warps": warps,
                 "num_stages": stages}
            try:
                report("rows_gemm", f"per channel {t}",
                       graph_median_ms(rows_run(channel, k, **t)))
            except Exception as e:  # noqa: BLE001 - a tile the compiler refuses
                print(f"{name} {t}: {type(e).__name__}: {str(e)[:120]}")
    along_c = [rows_mod.as_along_k(w).contiguous() for w in rows_w]  # its own layout
    zeros = torch.full((k // GROUP, n), 128.0, device="cuda").half()
    zeros_c = torch.full((1, n), 128.0, device="cuda").half()

    def along_run(sc, z, group):
        def run():
            for w in along_c:
                along_gemm(x, w, sc, z, group, 8)
        return run

    report("along_k", "GEMM per channel (its layout)",
           graph_median_ms(along_run(channel, zeros_c, k)))
    report("along_k", "GEMM g128 (its layout)", graph_median_ms(along_run(scales, zeros, GROUP)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--scale-copies", action="store_true",
                    help="each weight copy with its own g128 scales (none left in L2)")
    ap.add_argument("--json")
    args = ap.parse_args()
    peak = published_hbm_tbps(torch.cuda.get_device_name())
    rows = []
    for name in args.shapes.split(","):
        if args.m <= rows_mod.MAX_M:
            rows += measure(name, args.m, args.sweep, peak, args.scale_copies)
        else:
            rows += measure_gemm(name, args.m, args.sweep, peak)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
