"""``F.linear`` for float (bf16 / fp16) weights on CUDA, choosing per call between the decode
kernels and cuBLAS. Batches of 1-32 rows (``CUDA_DENSE_ROWS``, capped by
``OCTAVO_CUDA_DENSE_MIN_M`` / ``OCTAVO_CUDA_DENSE_MAX_M``) over weights of at most
``CUDA_DENSE_MAX_BYTES`` run the CUDA C++ tensor-core GEMM (``octavo.kernels.dense_mma``)
where it is built (nvcc, an NVIDIA GPU; ``OCTAVO_CUDA_DENSE=0`` turns it off). Otherwise:
one-row batches through the CUDA-core GEMV (``octavo.kernels.dense_gemv``, launched with
PDL), up to 16 rows of the tall-K projections (up to 32 of the small ones) through the skinny
tensor-core GEMM (``octavo.kernels.skinny_gemm``), everything else cuBLAS.
``OCTAVO_DENSE_GEMV=0`` / ``OCTAVO_SKINNY_GEMM=0`` turn those two off."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from octavo import envs
from octavo.kernels.triton_utils import HAS_TRITON

# Rows sent to the GEMV: on an H200 (benchmarks/skinny_gemm.py --sweep-gemv) one row ran a
# Qwen3-0.6B layer's GEMMs 1.8x and a Llama-3.1-8B layer's 1.12x faster than cuBLAS; at two
# rows the Llama-8B layer was 0.78x (the second row's FMAs make the wide shapes issue-bound).
GEMV_ROWS = 1
# Rows sent to the CUDA dense GEMM (one row included: one Qwen3-0.6B layer 14.4 us against
# the GEMV's 16.2, W4's batch 1 0.880 against 0.938 ms per token), and the largest weight:
# on Llama-3.1-8B's projections (33-235 MB) it measured no faster than cuBLAS at 1-8 rows
# and slower at 32 (session 19), and a 0.6B model's LM head (311 MB) is cuBLAS's at 85% of
# HBM already.
CUDA_DENSE_ROWS = (1, 32)
CUDA_DENSE_MAX_BYTES = 16 << 20


def _takes_cuda_dense(x: torch.Tensor, weight: torch.Tensor,
                      bias: torch.Tensor | None) -> bool:
    """Whether ``linear`` sends ``x`` (any layout: only its shape and dtype count) to the CUDA
    dense GEMM."""
    if not (x.is_cuda and envs.cuda_dense()):
        return False
    from octavo.kernels import dense_mma

    rows = x.numel() // max(1, x.shape[-1])
    return (envs.cuda_dense_min_m(CUDA_DENSE_ROWS[0]) <= rows
            <= envs.cuda_dense_max_m(CUDA_DENSE_ROWS[1])
            and (weight.numel() * weight.element_size()
                 <= envs.cuda_dense_max_bytes(CUDA_DENSE_MAX_BYTES))
            and dense_mma.fits(x, weight, bias) and dense_mma.available(x.device))


def _takes_gemv(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``linear`` sends ``x`` to the CUDA-core GEMV (once the CUDA dense GEMM has
    declined it)."""
    if not (x.is_cuda and HAS_TRITON and envs.dense_gemv()):
        return False
    from octavo.kernels import dense_gemv

    return x.numel() == GEMV_ROWS * x.shape[-1] and dense_gemv.supports(x, weight)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
           ) -> torch.Tensor:
    if _takes_cuda_dense(x, weight, bias):
        from octavo.kernels import dense_mma

        return dense_mma.dense_mma(x, weight, bias)
    if _takes_gemv(x, weight):
        from octavo.kernels import dense_gemv

        return dense_gemv.dense_gemv(x, weight, bias)
    if x.is_cuda and HAS_TRITON:
        from octavo.kernels import skinny_gemm

        if (envs.skinny_gemm() and skinny_gemm.supports(x, weight)
                and (skinny_gemm.preferred(weight, x.numel() // x.shape[-1])
                     or envs.skinny_gemm_all())):
            return skinny_gemm.skinny_gemm(x, weight, bias)
    return F.linear(x, weight, bias)


def linear_glu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
               ) -> torch.Tensor | None:
    """``linear(silu(x[..., :K]) * x[..., K:], weight, bias)`` in one launch where ``linear``
    would take the CUDA-core GEMV for the activation (one row, a weight too large for the
    CUDA dense GEMM): the GEMV applies the activation as it reads x. None elsewhere
    (OCTAVO_FUSED_GLU=0 included): the caller runs the activation and ``linear``."""
    if not envs.fused_glu() or x.shape[-1] % 2:
        return None
    act = x[..., : x.shape[-1] // 2]  # the activation's shape and dtype, as linear sees them
    if _takes_cuda_dense(act, weight, bias) or not _takes_gemv(act, weight):
        return None
    from octavo.kernels import dense_gemv

    return dense_gemv.dense_gemv(x, weight, bias, glu=True)
