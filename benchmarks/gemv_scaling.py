"""Where one-row decode GEMMs lose their time: each kernel's time against the bytes it reads.

Every projection of a batch-1 decode step is one launch that should stream its weight at the
HBM rate. For each kernel this times one row (M = 1) against weights [N, K] of growing N at
fixed K, twice:

- from HBM: a sweep over enough copies that each call reads its weight from HBM (as in a
  decode step): the floor (the fastest point: launch ramp, tail, split-K reduction, what
  does not shrink with the bytes) and a least-squares line t = fixed + bytes / rate through
  the largest weights' points: the streaming rate (against the device's HBM figure);
- from L2: one copy called over and over (weights up to ~40 MB stay in the 50 MB L2), where
  the memory is no longer what bounds the kernel: if a kernel takes about as long from L2 as
  from HBM, its own instructions and latencies bound it, not the weight bytes.

Kernels: bf16 (cuBLAS, the CUDA-core GEMV, dense_mma), float8 e4m3 with row scales (the FP8
GEMV, dense_mma's float8 kernels), 4-bit g128 (the along-K GEMV, the swap-AB CUDA kernel) and
8-bit g128 (the along-K GEMV). Times are CUDA-graph replays (benchmarks/common.graph_timed),
as the engine's decode steps run.

Also accepted by --kernels, not run by default (``VARIANTS``): the integer GEMVs loading
their weights two or three steps ahead (``w4_gemv_p2``, ``w8_gemv_p3``...), and the swap-AB
CUDA kernel's plan at N warps per SM (``w4_mma_wN``), without tile splits over CTAs too
(``w4_mma_wN_ns``), the FP8 GEMV on a pre-tiled weight (``fp8_gemv_tiled``; ``_glu``: both
with the GLU store, as gate_up runs).

    python benchmarks/gemv_scaling.py [--k 4096] [--n 1024 2048 ...] [--kernels ...] [--m 1]
        [--json F]

``--m``: rows of x (1 by default; the kernels that take more, e.g. nf4_cuda_a*).
"""

from __future__ import annotations

import argparse
import os
import re
import sys

# The checkout after PYTHONPATH's entries: a tree given there (a `git archive` export, for
# an A/B) is the octavo imported; before the installed packages.
sys.path.insert(1 + len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import device_info, flush_copies, git_commit, print_json_result  # noqa: E402
from benchmarks.common import graph_timed as timed  # noqa: E402
from benchmarks.quantized_gemm import _weight_bytes, fp8_weight, int_weights  # noqa: E402
from benchmarks.workloads import device_limits  # noqa: E402

KERNELS = ("bf16_cublas", "bf16_gemv", "bf16_mma", "fp8_gemv", "fp8_mma", "w4_gemv",
           "w4_mma", "w8_gemv")
# nf4_gemv: bitsandbytes NF4 (blocks of 64) through ``bnb4_gemv.bnb4_gemv``, a gather per
# nibble from the 16 codes; nf4_gemv256: a gather per byte from the 256 code pairs;
# nf4_dequant: the path before both (``bnb_weight.dequantize_packed`` per call, F.linear);
# nf4_cuda: the CUDA C++ GEMV (``bnb4_cuda``, codes in shared memory), nf4_cuda_r{R} at R
# rows a block, nf4_cuda_a{A} with A weight rows a warp in flight (OCTAVO_BNB4_CUDA_AHEAD);
# nf4_dequant_triton: what batches past the GEMVs run (``bnb4_gemv.dequantize_4bit``, then
# cuBLAS); nf4_gemm: the fused tensor-core GEMM for those batches (``bnb4_gemm``, codes
# decoded by selects, OCTAVO_BNB4_GEMM_MAX_M); nf4_dequant_select: the same with the select-tree dequantizer
# (``dequantize_4bit_select``, OCTAVO_BNB4_DEQUANT=select).
NF4 = ("nf4_gemv", "nf4_gemv256", "nf4_dequant", "nf4_cuda", "nf4_cuda_r8", "nf4_cuda_r32",
       "nf4_cuda_r128", "nf4_cuda_a1", "nf4_cuda_a8", "nf4_dequant_triton", "nf4_dequant_select", "nf4_gemm")
L2_MAX_BYTES = 40 << 20  # the L2 timing only where one copy stays resident
# Variants timed on request (--kernels), not by default: the integer GEMVs loading their
# weights two or three steps ahead instead of one (*_p2, *_p3), swapab_mma's plan at other
# warps per SM (w4_mma_w{warps}) and without tile splits over CTAs (w4_mma_w{warps}_ns).
VARIANT_WARPS = (2, 3, 4, 6, 8, 10, 12)
# fp8_gemv_x0 / _x1: the float8 GEMV reading its activations as before session 27 (a split
# tile through shared memory) or as four strided planes (octavo.kernels.fp8_gemv._x_planes).
# fp8_mma_f16: dense_mma's float8 kernel fed fp16 activations (one cvt per two weights, no
# bit placement); fp8_mma[_f16]_w{warps}s{steps}: its plan at other warps per SM and steps.
# fp8_gemv_tiled: the float8 GEMV at its default plan on the weight tiled once for that plan's
# blocks (octavo.kernels.fp8_tiled: a tile's step one contiguous block); fp8_gemv_glu /
# fp8_gemv_tiled_glu: the same two with the GLU store (silu(gate) * up, N / 2 outputs).
FP8_TILED = ("fp8_gemv_tiled", "fp8_gemv_glu", "fp8_gemv_tiled_glu")
FP8_MMA_PLANS = tuple(f"_w{w}s{s}" for w in (8, 12, 16, 24, 32) for s in (1, 2, 4))
VARIANTS = ("w4_gemv_p2", "w8_gemv_p2", "w4_gemv_p3", "w8_gemv_p3", "fp8_gemv_x0",
            "fp8_gemv_x1", "fp8_mma_f16") + FP8_TILED + tuple(
    f"w4_mma_w{w}{ns}" for ns in ("", "_ns") for w in VARIANT_WARPS) + tuple(
    f"fp8_mma{f}{p}" for f in ("", "_f16") for p in FP8_MMA_PLANS)
# fp8_block_gemv: 128 x 128 block-scaled float8 (``fp8_block_gemm.fp8_block_gemv``, its
# plan ``fp8_gemv.group_plan``); fp8_block_gemv_{block_n}_{block_k}_{warps}_{waves}_{stages}
# forces a plan (block_k dividing 128).
# fp8_block_fold: the same weights through ``fp8_block_gemv.fp8_block_gemv_folded`` (scales
# folded into the activations, the row-scaled GEMV's plan); *_glu: both with the GLU store;
# fp8_block_fold_{block_n}_{block_k}_{warps}_{waves}_{stages}: the folded kernel at a plan.
FP8_BLOCK = ("fp8_block_gemv", "fp8_block_gemv_glu", "fp8_block_fold", "fp8_block_fold_glu"
             ) + tuple(
    f"fp8_block_fold_{bn}_{bk}_{w}_{v}_{s}" for bn in (8, 16, 32) for bk in (256, 512, 1024)
    for w in (4, 8) for v in (1, 2) for s in (2, 3)) + tuple(
    f"fp8_block_gemv_{bn}_{bk}_{w}_{v}_{s}" for bn in (16, 32, 64, 128) for bk in (64, 128)
    for w in (4, 8) for v in (1, 2, 4) for s in (2, 3))
VARIANTS += FP8_BLOCK + NF4
_FP8_BLOCK = re.compile(r"fp8_block_gemv_(\d+)_(\d+)_(\d+)_(\d+)_(\d+)")
_VARIANT = re.compile(r"w4_mma_w(\d+)(_ns)?")
_FP8_MMA = re.compile(r"fp8_mma(_f16)?(?:_w(\d+)s(\d+))?")


def variant(kernel: str) -> dict | None:
    """swapab_mma's keyword arguments for a variant's name (None for the other kernels)."""
    match = _VARIANT.fullmatch(kernel)
    if match is None:
        return None
    return {"warps_per_sm": int(match[1]), "split_ctas": not match[2]}


def weight_bytes(kernel: str, k: int, n: int, group: int = 128) -> float:
    """Bytes one call reads for its weight (and scales / zero points)."""
    if kernel.startswith("bf16"):
        return 2.0 * k * n
    if kernel.startswith("fp8_block"):
        return k * n + 4.0 * -(-n // 128) * -(-k // 128)
    if kernel.startswith("nf4"):
        return k * n / 2 + 4.0 * n * k / 64
    if kernel.startswith("fp8"):
        return k * n + 4.0 * n
    return _weight_bytes(k, n, int(kernel[1]), group)


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares y = a + b x: (a, b)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - b * mx, b


STREAM_POINTS = 3  # the largest weights: the line through them is the streaming regime


def stream_fit(points: list[dict]) -> tuple[float, float]:
    """(fixed microseconds, bytes per second) of the line through the HBM points of the
    ``STREAM_POINTS`` largest weights (small ones sit on each kernel's floor, off the line)."""
    points = sorted(points, key=lambda p: p["bytes"])[-STREAM_POINTS:]
    fixed, us_per_byte = fit_line([p["bytes"] for p in points], [p["hbm_us"] for p in points])
    return fixed, (1e6 / us_per_byte if us_per_byte > 0 else float("inf"))


def make_weight(kernel: str, k: int, n: int, dev):
    """One weight as ``call(x, weight)`` takes it."""
    import torch

    if kernel.startswith("bf16"):  # [n, k] as the engine holds it (bf16_cublas: F.linear)
        return torch.randn(n, k, device=dev, dtype=torch.bfloat16)
    if kernel in FP8_TILED and "_tiled" in kernel:
        from octavo.kernels.fp8_tiled import tile_fp8_weight, tiled_plan

        blocks = tiled_plan(n, k)
        if blocks is None:
            raise ValueError(f"the plan's blocks do not divide N={n}, K={k}")
        weight, scale = fp8_weight(k, n, dev)
        return tile_fp8_weight(weight, *blocks, glu=kernel.endswith("_glu")), scale, blocks
    if kernel.startswith("nf4"):
        from octavo.quantization import bnb_format as fmt
        from octavo.quantization.bnb_weight import byte_table

        packed, absmax = fmt.quantize_4bit(torch.randn(n, k, device=dev) * 0.05, "nf4", 64)
        code = fmt.code_table("nf4", dev).float().contiguous()
        return (packed.reshape(n, k // 2).contiguous(), absmax.float().reshape(n, k // 64),
                byte_table(code), code, tuple(code.tolist()))  # the codes as numbers: no sync
    if kernel.startswith("fp8_block"):
        weight, _ = fp8_weight(k, n, dev)
        return weight, torch.rand(-(-n // 128), -(-k // 128), device=dev) * 0.01
    if kernel.startswith("fp8"):
        return fp8_weight(k, n, dev)
    layout = "swapab" if kernel.endswith("mma") or variant(kernel) else "along_k"
    return int_weights(k, n, int(kernel[1]), 128, dev, layout)


def call(kernel: str, x, w):
    if kernel == "bf16_cublas":
        import torch.nn.functional as F

        return F.linear(x, w)
    if kernel == "bf16_gemv":
        from octavo.kernels.dense_gemv import dense_gemv

        return dense_gemv(x, w)
    if kernel == "bf16_mma":
        from octavo.kernels.dense_mma import dense_mma

        return dense_mma(x, w)
    if kernel.startswith("fp8_mma"):
        from octavo.kernels.dense_mma import dense_mma

        match = _FP8_MMA.fullmatch(kernel)
        plan = ({"warps_per_sm": int(match[2]), "steps": int(match[3])} if match[2] else {})
        return dense_mma(x, w[0], None, w[1], **plan)
    if kernel.startswith("nf4_gemv"):
        from octavo.kernels.bnb4_gemv import bnb4_gemv

        return bnb4_gemv(x, w[0], w[1], w[2] if kernel.endswith("256") else w[3], 64)
    if kernel.startswith("nf4_cuda"):
        from octavo.kernels.bnb4_cuda import bnb4_gemv_cuda

        rows = int(kernel.rsplit("_r", 1)[1]) if "_r" in kernel else None
        if "_a" in kernel:  # read at each call
            os.environ["OCTAVO_BNB4_CUDA_AHEAD"] = kernel.rsplit("_a", 1)[1]
            os.environ.setdefault("OCTAVO_BNB4_CUDA_MAX_M", "16")
        return bnb4_gemv_cuda(x, w[0], w[1], w[3], 64, rows=rows)
    if kernel == "nf4_gemm":
        from octavo.kernels.bnb4_gemm import bnb4_gemm

        return bnb4_gemm(x, w[0], w[1], w[4], 64)
    if kernel == "nf4_dequant_select":
        import torch.nn.functional as F

        from octavo.kernels.bnb4_gemv import dequantize_4bit_select

        return F.linear(x, dequantize_4bit_select(w[0], w[1], w[4], 64, x.dtype))
    if kernel == "nf4_dequant_triton":
        import torch.nn.functional as F

        from octavo.kernels.bnb4_gemv import dequantize_4bit

        return F.linear(x, dequantize_4bit(w[0], w[1], w[2], 64, x.dtype))
    if kernel == "nf4_dequant":
        import torch.nn.functional as F

        from octavo.quantization.bnb_weight import dequantize_packed

        return F.linear(x, dequantize_packed(w[0], w[1], None, 64, x.dtype, table=w[2]))
    if kernel.startswith("fp8_block"):
        from octavo.kernels import fp8_gemv
        from octavo.kernels.fp8_block_gemm import fp8_block_gemv

        glu = kernel.endswith("_glu")
        if kernel.startswith("fp8_block_fold"):
            from octavo.kernels.fp8_block_gemv import fp8_block_gemv_folded

            plan = kernel.removeprefix("fp8_block_fold").strip("_").removesuffix("glu")
            tiles = tuple(int(v) for v in plan.split("_") if v) or None
            return fp8_block_gemv_folded(x, *w, (128, 128), glu=glu, tiles=tiles)
        match = _FP8_BLOCK.fullmatch(kernel)
        if match is None:
            return fp8_block_gemv(x, *w, (128, 128), glu=glu)
        bn, bk, warps, waves, stages = (int(g) for g in match.groups())
        return fp8_gemv._launch(x, w[0], w[1], None, bn, bk, warps, waves, None, None,
                                stages, block=(128, 128))
    if kernel in FP8_TILED:
        from octavo.kernels.fp8_gemv import fp8_gemv

        return fp8_gemv(x, w[0], w[1], glu=kernel.endswith("_glu"),
                        tiled=w[2] if "_tiled" in kernel else None)
    if kernel.startswith("fp8_gemv"):
        from octavo.kernels.fp8_gemv import fp8_gemv

        return fp8_gemv(x, *w, **({"x_load": int(kernel[-1])} if "_x" in kernel else {}))
    if kernel == "w4_mma" or variant(kernel):
        from octavo.kernels.swapab_mma import swapab_mma

        return swapab_mma(x, *w, 128, 4, **(variant(kernel) or {}))
    from octavo.kernels.w4a16_gemm import w4a16_gemm

    return w4a16_gemm(x, *w, 128, int(kernel[1]), path="gemv",
                      **({"prefetch": int(kernel[-1])} if "_p" in kernel else {}))


def measure(kernel: str, k: int, ns: list[int], dev, bandwidth: float, m: int = 1) -> dict:
    import torch

    x = torch.randn(m, k, device=dev,
                    dtype=torch.float16 if "_f16" in kernel else torch.bfloat16)
    points = []
    for n in ns:
        nbytes = weight_bytes(kernel, k, n)
        copies = [make_weight(kernel, k, n, dev) for _ in range(flush_copies(nbytes))]
        t_hbm = timed([lambda w=w: call(kernel, x, w) for w in copies])
        t_l2 = (timed([lambda w=copies[0]: call(kernel, x, w)] * 16)
                if nbytes <= L2_MAX_BYTES else None)
        points.append({"n": n, "bytes": nbytes, "hbm_us": round(t_hbm, 2),
                       "hbm_fraction": round(nbytes / (t_hbm * 1e-6) / bandwidth, 3),
                       "l2_us": t_l2 and round(t_l2, 2)})
        print(f"{kernel} K={k} N={n}: {t_hbm:.2f} us from HBM "
              f"({points[-1]['hbm_fraction']:.0%})"
              + (f", {t_l2:.2f} us from L2" if t_l2 else ""), flush=True)
        del copies
        torch.cuda.empty_cache()
    fixed, rate = stream_fit(points)
    floor = min(p["hbm_us"] for p in points)
    out = {"kernel": kernel, "k": k, "points": points, "floor_us": floor,
           "fixed_us": round(fixed, 2), "stream_tb_s": round(rate / 1e12, 2),
           "stream_fraction": round(rate / bandwidth, 3)}
    print(f"{kernel} K={k}: floor {floor:.2f} us; the largest weights: fixed {fixed:.2f} us + "
          f"bytes at {rate / 1e12:.2f} TB/s ({rate / bandwidth:.0%} of HBM)", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, nargs="+", default=[4096])
    ap.add_argument("--n", type=int, nargs="+",
                    default=[1024, 2048, 4096, 8192, 16384, 28672])
    ap.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=KERNELS + VARIANTS)
    ap.add_argument("--m", type=int, default=1, help="rows of x (default 1)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import torch

    bandwidth, _, limits = device_limits()
    dev = torch.device("cuda")
    results = []
    for k in args.k:
        for kernel in args.kernels:
            try:
                results.append(measure(kernel, k, args.n, dev, bandwidth, args.m))
            except Exception as e:  # noqa: BLE001 - recorded, the other kernels go on
                print(f"{kernel} K={k}: {type(e).__name__}: {e}"[:300], flush=True)
                results.append({"kernel": kernel, "k": k,
                                "error": f"{type(e).__name__}: {e}"[:300]})
    print(f"{'kernel':22} {'K':>6} {'floor us':>9} {'fixed us':>9} {'TB/s':>6} {'of HBM':>7}")
    for r in results:
        if "error" not in r:
            print(f"{r['kernel']:22} {r['k']:>6} {r['floor_us']:>9} {r['fixed_us']:>9} "
                  f"{r['stream_tb_s']:>6} {r['stream_fraction']:>7.0%}")
    print_json_result({"benchmark": "gemv_scaling", "device": device_info(), "limits": limits,
                       "commit": git_commit(), "m": args.m, "results": results}, args.json)


if __name__ == "__main__":
    main()
