"""FP8 x FP8 (W8A8, e4m3) GEMM for decode batches of 1-8 rows in CUDA C++
(``octavo/kernels/cuda/e4m3_mma.cu``): ``y = sx * sw * (q(x) @ W^T)``, the float8 weight
[N, K] as loaded with a float32 scale per output row, the activations quantized to e4m3 inside
the kernel by ``octavo.kernels.fp8_quant``'s rule (per token or per tensor, dynamic or static;
bit for bit the same values), the products on the float8 tensor cores (mma.sync m16n8k32,
compute capability 8.9+).

Why: a batch-1 decode step of an FP8 model reads each weight once, so its GEMMs should stream
at the HBM rate. The kernels that keep the activations in 16 bits convert every weight before
its product (the FP8 GEMV: 6 instructions per 4 weights, 69-72% of HBM on an H200; the bf16
mma kernel: 3-4 integer operations per two weights, 60%), and that conversion bounds them.
Here the weight bytes are the mma's A operand as loaded and the quantized activations its B
operand: a 64-wide K step of a 16-row tile is two 16-byte loads per lane and two mma
instructions, so the loop is bound by the weight bytes alone. The price is the activations'
quantization, which W8A8 checkpoints and ``quantization="fp8"`` declare anyway (the
``torch._scaled_mm`` path of larger batches does the same): every CTA reads the activations'
rows for their amax (from L2) and quantizes only its own K range into shared memory.

The launch: tiles of 16 weight rows, one warp per tile and K range; K split over CTAs only
as far as needed for about ``WARPS_PER_SM`` warps per SM, the splits' float32 partials added
by the warp that takes a tile's last ticket (``octavo.kernels.split_k``); where there are
more tiles than that, a warp walks several as one pipelined sequence of chunks.
"""

from __future__ import annotations

import dataclasses

import torch

from octavo import envs
from octavo.kernels import cuda_module
from octavo.kernels import pdl as pdl_mod
from octavo.kernels.split_k import MAX_CTA_WARPS
from octavo.kernels.split_k import buffers as split_k_buffers
from octavo.kernels.split_k import counters as split_k_counters
from octavo.kernels.triton_utils import num_compute_units

SOURCE = "e4m3_mma.cu"
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
MAX_M = 8
STEP_K = 64  # K values of one step (a lane's 16-byte load)
STEPS_BUILT = (2, 4, 8)  # K steps per chunk (cuda/e4m3_mma.cu's variants)
SHARED_LIMIT = 48 * 1024  # the quantized activations of a CTA's K range: M * K bytes
_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16"}
# The flags of cuda/e4m3_mma.cu.
STATIC, PER_TENSOR, REPLACE = 1, 2, 4
# The plan's defaults, to be set from benchmarks/gemv_scaling.py on an H200.
WARPS_PER_SM = 16
STEPS = 4


def supports(m: int, k: int, n: int, dtype: torch.dtype) -> bool:
    return 1 <= m <= MAX_M and dtype in _DTYPES and k > 0 and k % STEP_K == 0 and n % 16 == 0


@dataclasses.dataclass(frozen=True)
class Plan:
    steps: int  # K steps of 64 per chunk
    splits: int  # K ranges (CTAs along y)
    k_per_split: int
    warps: int  # per CTA
    ctas: int  # along x: the CTA groups of one K range
    shared_bytes: int

    def kernel(self, dtype: torch.dtype) -> str:
        return f"e4m3_mma_{_DTYPES[dtype]}_s{self.steps}"


def plan(m: int, k: int, n: int, sms: int, warps_per_sm: int = WARPS_PER_SM,
         steps: int | None = None, most_warps: int = MAX_CTA_WARPS) -> Plan:
    """Split K into whole chunks so that N / 16 tiles make about ``warps_per_sm`` warps per
    SM, the quantized activations of a split fitting the shared memory; a warp per (tile,
    split), several tiles per warp where the tiles alone exceed that."""
    steps = steps or STEPS
    while (k // STEP_K) % steps:
        steps //= 2
    if steps not in STEPS_BUILT and steps > 1:
        raise ValueError(f"e4m3_mma: no kernel of {steps} steps")
    if steps < 2:
        raise ValueError(f"e4m3_mma: K={k} is not a multiple of {2 * STEP_K}")
    chunk = STEP_K * steps
    chunks = k // chunk
    tiles = n // 16
    target = sms * warps_per_sm
    splits = max(1, min(chunks, round(target / tiles)))
    while True:
        per_split = -(-chunks // splits)
        splits = -(-chunks // per_split)
        if m * per_split * chunk <= SHARED_LIMIT or per_split == 1:
            break
        splits += 1
    # Warps per K range: one per tile, or fewer walking several tiles each.
    per_warp = max(1, tiles * splits // target)
    group = -(-tiles // per_warp)
    warps = min(most_warps, group)
    ctas = -(-group // warps)
    return Plan(steps, splits, per_split * chunk, warps, ctas, m * per_split * chunk)


def available(device: torch.device) -> bool:
    """Whether the engine's FP8 layers use this kernel on ``device``: compute capability 8.9+,
    built (nvcc) and not turned off (``OCTAVO_E4M3_MMA=0``)."""
    return (envs.e4m3_mma() and device.type == "cuda"
            and torch.cuda.get_device_capability(device) >= (8, 9)
            and cuda_module.module(SOURCE, device) is not None)


def flags(static: bool, per_tensor: bool, small: str) -> int:
    assert small in ("clamp", "replace"), small
    return (STATIC if static else 0) | (PER_TENSOR if per_tensor else 0) | (
        REPLACE if small == "replace" else 0)


def e4m3_mma_ref(x2: torch.Tensor, weight: torch.Tensor, w_scale: torch.Tensor,
                 x_scale: torch.Tensor | None = None, min_scale: float = 1e-12,
                 small: str = "clamp", per_tensor: bool = False) -> torch.Tensor:
    """The reference in float64: x quantized as ``fp8_quant_ref`` does (one scale over every
    row where ``per_tensor``), times the dequantized weight, rounded once to x's dtype."""
    from octavo.kernels.fp8_quant import fp8_quant_ref  # the rule, in torch

    if per_tensor and x_scale is None:
        amax = x2.float().abs().amax().reshape(1, 1) / FP8_MAX
        s = amax.clamp(min=min_scale) if small == "clamp" else torch.where(
            amax > 0, amax, torch.full_like(amax, min_scale))
        xq, xs = fp8_quant_ref(x2, s, min_scale, small)
    else:
        xq, xs = fp8_quant_ref(x2, x_scale, min_scale, small)
    xd = xq.double() * xs.double()
    wd = weight.double() * w_scale.reshape(-1, 1).double()
    return (xd @ wd.t()).to(x2.dtype)


def e4m3_mma(x2: torch.Tensor, weight: torch.Tensor, w_scale: torch.Tensor,
             x_scale: torch.Tensor | None = None, min_scale: float = 1e-12,
             small: str = "clamp", per_tensor: bool = False,
             warps_per_sm: int | None = None, steps: int | None = None) -> torch.Tensor:
    """``x2`` [M, K] (M <= 8, bf16 / fp16) times the e4m3 ``weight`` [N, K] with float32
    ``w_scale`` [N]: the activations quantized per row (``per_tensor``: one scale over the
    rows; ``x_scale``: a static float32 scale), ``small`` the rule for a zero amax
    (``fp8_quant``'s). The tuning arguments exist for the benchmarks."""
    m, k = x2.shape
    n = weight.shape[0]
    if not (supports(m, k, n, x2.dtype) and weight.dtype == FP8 and weight.shape[1] == k
            and weight.is_contiguous() and weight.data_ptr() % 16 == 0
            and w_scale.dtype == torch.float32 and w_scale.numel() == n):
        raise ValueError(f"e4m3_mma: x {tuple(x2.shape)} {x2.dtype}, weight "
                         f"{tuple(weight.shape)} {weight.dtype}, scale "
                         f"{tuple(w_scale.shape)} {w_scale.dtype} is not supported")
    x2 = cuda_module.aligned_rows(x2)
    w_scale = w_scale.reshape(-1).contiguous()
    if x_scale is not None:
        x_scale = x_scale.reshape(-1)[:1].to(torch.float32).contiguous()
    mod = cuda_module.loaded(SOURCE, x2.device)
    p = plan(m, k, n, num_compute_units(x2.device), warps_per_sm or WARPS_PER_SM, steps)
    out, partial = split_k_buffers(m, n, p.splits, x2)
    cnt = split_k_counters(x2.device, n // 16)
    args = cuda_module.arguments(x2, weight, w_scale, x_scale, out, partial, cnt, m, n, k,
                                 x2.stride(0), p.k_per_split, float(min_scale),
                                 flags(x_scale is not None, per_tensor, small))
    mod.launch(p.kernel(x2.dtype), (p.ctas, p.splits, 1), 32 * p.warps, args,
               pdl=pdl_mod.enabled(x2.device), shared_bytes=p.shared_bytes)
    return out
