"""FP8 (e4m3) weights times bf16 / fp16 activations for decode batches of 1-2 rows, with the
weights streamed into shared memory by Hopper's bulk copies (``cp.async.bulk``;
``octavo/kernels/cuda/bulk_gemv.cu``): ``y[m, n] = scale[n] * sum_k x[m, k] * w[n, k]``, the
same products as ``octavo.kernels.fp8_gemv`` (float32 FMAs of the exact weight values,
rounded once), optionally with the MLP's ``silu(gate) * up`` in the store (``glu``).

Why: a decode GEMV at batch 1 streams its weight once, so it runs at the rate its loads
reach. The Triton FP8 GEMV loads through registers; its programs keep ~8-16 KB in flight per
SM, and it streams at 3.40 TB/s (71% of an H200's HBM, docs/benchmarks.md session 21), where
Little's law at ~1 us of latency asks ~36 KB per SM for the full 4.8 TB/s. Here one producer
warp per CTA keeps ``STAGES`` chunks of ``ROWS`` rows x ``CHUNK`` bytes in flight (64 KB per
CTA at the default plan, two or three CTAs per SM) with one copy instruction per row and
chunk, and costs the consumer warps no registers or load instructions: they read the chunk
from shared memory, convert and multiply.

A CTA owns whole rows over all of K (no split), so the launch needs about two CTAs per SM
of rows to fill the GPU: ``takes`` says no to narrower weights (the Triton GEMV splits K).
"""

from __future__ import annotations

import torch

from octavo import envs
from octavo.kernels import cuda_module
from octavo.kernels import pdl as pdl_mod
from octavo.kernels.triton_utils import num_compute_units

SOURCE = "bulk_gemv.cu"
MAX_M = 2
FP8 = torch.float8_e4m3fn
_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16"}
# (rows, consumer warps, chunk bytes, stages) built (cuda/bulk_gemv.cu's plans).
PLANS = frozenset([(16, 4, 1024, 4), (8, 2, 1024, 4), (16, 4, 512, 6), (32, 8, 512, 4),
                   (16, 4, 2048, 3), (8, 4, 2048, 4), (16, 8, 1024, 4)])
DEFAULT_PLAN = (16, 4, 1024, 4)
MIN_CTAS_PER_SM = 1.5  # fewer row tiles than this per SM: the Triton GEMV (it splits K)


def shared_bytes(plan: tuple[int, int, int, int]) -> int:
    rows, _, chunk, stages = plan
    return rows * chunk * stages


def fits(x2: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
         glu: bool = False) -> bool:
    """Whether ``bulk_gemv`` runs these tensors: CUDA on compute capability 9.0+, x2 [M, K]
    of 1-2 rows in bf16 / fp16, the weight float8 e4m3 [N, K] contiguous and 16-byte aligned
    with K a multiple of 16, ``scale`` float32 [N] contiguous (``glu``: N even)."""
    if not (x2.is_cuda and x2.dim() == 2 and weight.dim() == 2 and weight.dtype == FP8
            and x2.dtype in _DTYPES and 1 <= x2.shape[0] <= MAX_M):
        return False
    n, k = weight.shape
    return (x2.shape[1] == k and k % 16 == 0 and k > 0 and weight.is_contiguous()
            and weight.data_ptr() % 16 == 0 and scale.dtype == torch.float32
            and scale.numel() == n and scale.is_contiguous() and (not glu or n % 2 == 0)
            and torch.cuda.get_device_capability(x2.device) >= (9, 0))


def tiles(n: int, plan: tuple[int, int, int, int], glu: bool) -> int:
    rows = plan[0]
    return -(-(n // 2) // (rows // 2)) if glu else -(-n // rows)


def takes(x2: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
          glu: bool = False) -> bool:
    """Whether the engine sends this call here: ``OCTAVO_FP8_BULK`` on, the tensors fit, the
    module built, and enough row tiles to fill the GPU without splitting K."""
    if not (envs.fp8_bulk() and fits(x2, weight, scale, glu)):
        return False
    if tiles(weight.shape[0], DEFAULT_PLAN, glu) < MIN_CTAS_PER_SM * num_compute_units(
            x2.device):
        return False
    return cuda_module.module(SOURCE, x2.device) is not None


def kernel_name(dtype: torch.dtype, m: int, plan: tuple[int, int, int, int], glu: bool) -> str:
    rows, warps, chunk, stages = plan
    return (f"bulk_gemv_e4m3_{_DTYPES[dtype]}_m{m}_r{rows}_w{warps}_c{chunk}_s{stages}"
            + ("_glu" if glu else ""))


def bulk_gemv(x2: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
              glu: bool = False, plan: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """``x2 [M, K] @ (weight [N, K] * scale [N])^T`` in x2's dtype (M <= 2); ``glu``: the
    weight is an MLP's [gate | up] (N = 2I) and the result ``silu(gate) * up`` [M, I].
    ``plan``: (rows, consumer warps, chunk bytes, stages), one of ``PLANS``."""
    scale = scale.reshape(-1)
    if not fits(x2, weight, scale, glu):
        raise ValueError(f"bulk_gemv: x {tuple(x2.shape)} {x2.dtype}, weight "
                         f"{tuple(weight.shape)} {weight.dtype}, scale {tuple(scale.shape)} "
                         f"{scale.dtype} is not supported")
    plan = plan or DEFAULT_PLAN
    if plan not in PLANS:
        raise ValueError(f"bulk_gemv: plan {plan} is not built (built: {sorted(PLANS)})")
    m, k = x2.shape
    n = weight.shape[0]
    x2 = cuda_module.aligned_rows(x2)
    out = torch.empty(m, n // 2 if glu else n, device=x2.device, dtype=x2.dtype)
    mod = cuda_module.loaded(SOURCE, x2.device)
    args = cuda_module.arguments(x2, x2.stride(0), weight, weight.stride(0), scale, out,
                                 out.stride(0), n, k)
    mod.launch(kernel_name(x2.dtype, m, plan, glu), (tiles(n, plan, glu), 1, 1),
               32 * (plan[1] + 1), args, pdl=pdl_mod.enabled(x2.device),
               shared_bytes=shared_bytes(plan))
    return out
