"""Float (bf16 / fp16) GEMM for decode batches of 1-32 rows in CUDA C++
(``octavo/kernels/cuda/dense_mma.cuh``, its kernels built from ``dense_mma.cu`` and, for
float8 weights, ``dense_mma_fp8.cu``): ``y = x @ W.T (+ b)`` with W in nn.Linear's [N, K]
layout as loaded, on the tensor cores' ``mma.sync`` with the weights as the A operand.

Why: on an H200 a Qwen3-0.6B decode step at batch 2-32 spends ~27 us per layer in its four
projections (cuBLAS and the Triton skinny GEMM) for 31.5 MB of weights, 6.5 us at HBM speed:
those kernels are bound by launch and latency, not bandwidth. This is ``swapab_mma`` without
the dequantization: each lane loads 16 bytes of two weight rows straight into the registers
the mma takes (the K order inside a 32-wide step is chosen so, the activations loaded the
same way), one chunk of loads ahead of the products; the first chunk's weights are loaded
before ``griddepcontrol.wait`` (no kernel of the step writes weights), so under programmatic
dependent launch they stream while the previous kernel ends. A warp computes NT tiles of 16
output features for MT tiles of 8 rows (NT = 2: a warp's activation loads serve two weight
tiles); K is split over the warps of a CTA (summed in shared memory) and over CTAs (the CTA
with the last ticket sums the partials, ``octavo.kernels.split_k``) so that the launch holds
about ``WARPS_PER_SM`` warps per SM. Bias is added once, in the final store.

Measured on an H200 (docs/benchmarks.md session 19; ``benchmarks/skinny_gemm.py --paths`` /
``--cuda-sweep`` time it against the others): one Qwen3-0.6B layer's four projections
14.4 / 15.9 / 23.8 us at 1 / 8 / 32 rows against the engine's previous kernels' ~16.2 /
22.7 / 24.6; W4 (``benchmarks/ab_latency.py``) 6-16% less time per token at batches 1-16.
``octavo.kernels.float_linear`` sends it weights of at most 16 MB (Llama-8B's are no faster
than cuBLAS).

Float8 (e4m3) weights with a float32 scale per output feature (the FP8 layers of
``octavo.quantization.fp8_linear``) run through the same kernel template, built as its own
module (``FP8_SOURCE``, ``FP8_VARIANTS``): a lane's 16-byte load is 16 weights, converted
exactly to the activations' 16-bit type in registers (fp16: ``cvt.rn.f16x2.e4m3x2``; bf16:
the bits placed, 3-4 integer operations per two weights), the activations left unrounded,
the scale applied in the final store.
"""

from __future__ import annotations

import dataclasses

import torch

from octavo import envs
from octavo.kernels import cuda_module
from octavo.kernels import pdl as pdl_mod
from octavo.kernels.split_k import MAX_CTA_WARPS as MAX_WARPS
from octavo.kernels.split_k import WarpPlan, over_warps
from octavo.kernels.split_k import buffers as split_k_buffers
from octavo.kernels.split_k import counters as split_k_counters
from octavo.kernels.triton_utils import num_compute_units

SOURCE = "dense_mma.cu"
# The float8 kernels, their own module: a model of 16-bit weights builds (10-20 s) and loads
# only its own.
FP8_SOURCE = "dense_mma_fp8.cu"
# 32 rows at most: 8 batch tiles (33-64 rows, one feature tile per warp) were built and lost
# to cuBLAS on an H200 (one Qwen3-0.6B layer 34.5-37.1 us at 40-64 rows against 25.2-25.3;
# docs/benchmarks.md session 52): each warp then loads 4x its weights' bytes of activations.
MAX_M = 32
_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16"}
FP8 = torch.float8_e4m3fn
# (MT, NT, STEPS) built (cuda/dense_mma.cu): the register budget of two chunks of operands,
# (2 NT + MT) STEPS uint4 twice, within 255 registers and no spills. Registers per thread
# (ptxas, sm_90, bf16 = fp16): m1 n1 s1/2/4/8 48/72/120/222, m1 n2 s1/2/4 64/114/198,
# m2 n1 s1/2/4 62/94/158, m2 n2 s1/2/4 90/138/234, m4 n1 s1/2/4 94/146/240, m4 n2 s1/2 124/192.
VARIANTS = frozenset(
    [(1, 1, s) for s in (1, 2, 4, 8)] + [(mt, nt, s) for mt, nt in ((1, 2), (2, 1), (2, 2), (4, 1))
                                         for s in (1, 2, 4)] + [(4, 2, 1), (4, 2, 2)])
# Float8 weights, one feature tile per warp: a step is 64 K values, its activations two uint4
# per batch tile. Registers (ptxas, sm_90, bf16 / fp16): m1 s1/2/4 61/91/158 / 61/90/154, m2
# s1/2/4 80/128/230 / 80/128/227, m4 s1/2 126/218 / 124/208.
FP8_VARIANTS = frozenset([(1, 1, s) for s in (1, 2, 4)] + [(2, 1, s) for s in (1, 2, 4)]
                         + [(4, 1, 1), (4, 1, 2)])


def _variants(fp8: bool) -> frozenset:
    return FP8_VARIANTS if fp8 else VARIANTS


def step_k(fp8: bool) -> int:
    """K values of one step (four lanes' 16-byte loads of a weight row)."""
    return 64 if fp8 else 32


def batch_tiles(m: int) -> int:
    """MT: tiles of 8 rows for ``m`` rows (1, 2 or 4)."""
    return 1 if m <= 8 else (2 if m <= 16 else 4)


def supports(m: int, k: int, n: int, dtype: torch.dtype, fp8: bool = False) -> bool:
    return (1 <= m <= MAX_M and dtype in _DTYPES and k > 0 and k % step_k(fp8) == 0
            and n % 16 == 0)


def fits(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
         scale: torch.Tensor | None = None) -> bool:
    """Whether ``dense_mma(x, weight, bias, scale)`` runs as the tensors are: a supported
    shape and dtype, the weight contiguous with 16-byte aligned rows (x's dtype; or float8
    e4m3 with ``scale`` float32 [N], on compute capability 8.9+), the bias (if any) [N] of x's
    dtype. (x of any layout: the call copies it where its rows are not 16-byte aligned.)"""
    if not x.is_cuda or weight.dim() != 2 or x.dim() == 0 or x.shape[-1] != weight.shape[1]:
        return False
    n, k = weight.shape
    fp8 = weight.dtype == FP8
    if fp8:
        if (scale is None or scale.dtype != torch.float32 or scale.numel() != n
                or not scale.is_contiguous()
                or torch.cuda.get_device_capability(x.device) < (8, 9)):
            return False
    elif weight.dtype != x.dtype or scale is not None:
        return False
    return (supports(x.numel() // max(1, k), k, n, x.dtype, fp8)
            and weight.is_contiguous() and weight.data_ptr() % 16 == 0
            and (bias is None or (bias.dtype == x.dtype and bias.shape == (n,)
                                  and bias.is_contiguous())))


@dataclasses.dataclass(frozen=True)
class Plan:
    split: WarpPlan  # K over warps and CTAs
    mt: int  # tiles of 8 rows per warp
    nt: int  # tiles of 16 features per warp
    tiles: int  # CTAs along N
    fp8: bool = False  # float8 e4m3 weights (steps of 64 K values)

    def kernel(self, dtype: torch.dtype) -> str:
        weights = "_e4m3" if self.fp8 else ""
        return f"dense_mma_{_DTYPES[dtype]}{weights}_m{self.mt}_n{self.nt}_s{self.split.steps}"


# The launch plan, from ``benchmarks/skinny_gemm.py --cuda-sweep`` on an H200 (24 plans per
# shape at 1, 8 and 32 rows, weights read from HBM; docs/benchmarks.md session 19): 4 warps
# per SM, the longest chunks built, one feature tile per warp was the best or within 10% on
# Qwen3-0.6B's projections at every row count (one layer 14.4 / 15.9 / 23.8 us at 1 / 8 / 32
# rows against the best plans' 14.0 / 14.9 / 22.9); 6 warps per SM with two feature tiles
# from 9 rows (the first guess) took 17.0 / 19.1 / 57.1.
WARPS_PER_SM = 4
NT = 1  # tiles of 16 features per warp: two lost at every row count in the sweep
# Float8 weights: (warps per SM, steps) per batch tiles, from ``benchmarks/quantized_gemm.py
# --fp8-cuda --m 1 8 16 32`` on an H200 (Llama-3.1-8B's four projections, weights read from
# HBM; docs/benchmarks.md session 20): the conversion makes the loop issue-bound, so more warps
# per SM than for 16-bit weights. One layer at 1 / 8 rows 79.7 / 83.2 us (4 warps per SM, the
# longest chunks: 95.4 / 98.5); 16 rows 106.8 (113.6).
FP8_PLAN = {1: (16, 2), 2: (8, 2), 4: (4, 2)}


def default_steps(mt: int, nt: int, k: int, fp8: bool = False) -> int:
    """The longest chunks built for (MT, NT) that K allows."""
    return next((s for s in (8, 4, 2, 1)
                 if (mt, nt, s) in _variants(fp8) and (k // step_k(fp8)) % s == 0), 1)


def plan(m: int, k: int, n: int, sms: int, warps_per_sm: int | None = None,
         steps: int | None = None, most_warps: int = MAX_WARPS, nt: int | None = None,
         fp8: bool = False) -> Plan:
    """The launch for ``m`` rows: about ``warps_per_sm`` warps per SM over N / (16 nt) tiles,
    each warp a whole number of chunks of ``steps`` K steps (``split_k.over_warps``)."""
    mt = batch_tiles(m)
    nt = nt or NT
    sk = step_k(fp8)
    if fp8 and warps_per_sm is None and steps is None:
        warps_per_sm, steps = FP8_PLAN[mt]
        if (k // sk) % steps:
            steps = None
    warps_per_sm = warps_per_sm or WARPS_PER_SM
    steps = steps or default_steps(mt, nt, k, fp8)
    if (mt, nt, steps) not in _variants(fp8) or n % (16 * nt) or k % (sk * steps):
        raise ValueError(f"dense_mma: no kernel for M={m} (MT={mt}), NT={nt}, {steps} steps "
                         f"at K={k}, N={n}{' (float8 weights)' if fp8 else ''}")
    tiles = n // (16 * nt)
    # over_warps counts 32-wide steps: a float8 step is two of them.
    split = over_warps(k * 32 // sk, tiles, steps, sms, warps_per_sm, min(most_warps, MAX_WARPS))
    split = dataclasses.replace(split, k_per_warp=split.k_per_warp * sk // 32)
    return Plan(split, mt, nt, tiles, fp8)


def available(device: torch.device, fp8: bool = False) -> bool:
    """Whether the engine's float layers (``fp8``: its float8 layers) use this kernel on
    ``device``: built (nvcc, an NVIDIA GPU) and not turned off (``OCTAVO_CUDA_DENSE=0``,
    ``OCTAVO_CUDA_FP8=0``)."""
    return ((envs.cuda_fp8() if fp8 else envs.cuda_dense())
            and cuda_module.module(FP8_SOURCE if fp8 else SOURCE, device) is not None)


def dense_mma(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
              scale: torch.Tensor | None = None, warps_per_sm: int | None = None,
              steps: int | None = None, most_warps: int = MAX_WARPS,
              nt: int | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for x [..., K] of at most MAX_M rows (float32
    accumulation, rounded once to x's dtype); for a float8 weight, of ``weight * scale[:,
    None]`` (scale float32 [N]). The tuning arguments exist for the benchmarks."""
    if not fits(x, weight, bias, scale):
        raise ValueError(f"dense_mma: x {tuple(x.shape)} {x.dtype}, weight "
                         f"{tuple(weight.shape)} {weight.dtype}, bias "
                         f"{None if bias is None else (tuple(bias.shape), bias.dtype)}, scale "
                         f"{None if scale is None else (tuple(scale.shape), scale.dtype)} "
                         "is not supported")
    shape = x.shape
    n, k = weight.shape
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    x2 = cuda_module.aligned_rows(x2)
    mod = cuda_module.loaded(FP8_SOURCE if weight.dtype == FP8 else SOURCE, x2.device)
    p = plan(m, k, n, num_compute_units(x2.device), warps_per_sm, steps, most_warps, nt,
             weight.dtype == FP8)
    out, partial = split_k_buffers(m, n, p.split.splits, x2)
    cnt = split_k_counters(x2.device, p.tiles)
    args = cuda_module.arguments(x2, weight, bias, scale, out, partial, cnt, m, n, k,
                                 x2.stride(0), p.split.k_per_warp)
    mod.launch(p.kernel(x2.dtype), (p.tiles, p.split.splits, 1), 32 * p.split.warps, args,
               pdl=pdl_mod.enabled(x2.device))
    return out.reshape(*shape[:-1], n)
