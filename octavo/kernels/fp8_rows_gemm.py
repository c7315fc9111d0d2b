"""Row-scaled FP8 weights (``quantization="fp8"``, per-channel checkpoints: e4m3 [N, K] with a
float32 scale per output row) times bf16/fp16 activations, weight-only, for decode batches
past the GEMV's rows: ``fused_moe``'s down-projection launch with one expert (each program's
rows a plain run of the batch), each weight tile converted exactly to the activations' dtype
in the main loop and the float32 sums times their rows' scales at the end, rounded once. No
activation quantization: the same numbers as the GEMV (``fp8_gemv``) up to summation order.
``fp8_rows_gemm_reference`` is what it is tested against."""

from __future__ import annotations

import torch

from octavo.kernels import fused_moe as moe
from octavo.kernels.triton_utils import require_triton, triton


def default_tiles(m: int, dtype: torch.dtype) -> moe.MoeTiles:
    """The GEMM's tiles for ``m`` rows (unmeasured: ``benchmarks/fp8_rows_gemm.py``)."""
    if dtype == torch.float32:
        return moe.MoeTiles(16, 64, 64, 4, 3)
    return moe.MoeTiles(16 if m <= 16 else 32, 64, 128, 4, 4)


def fp8_rows_gemm(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                  tiles: moe.MoeTiles | None = None) -> torch.Tensor:
    """``x`` [M, K] (float16 / bfloat16 / float32) times ``weight * scale[:, None]``
    (``weight`` float8_e4m3fn [N, K] contiguous, ``scale`` float32 [N]) -> [M, N] in x's
    dtype. ``tiles``: the launch's tiles (None: :func:`default_tiles`; the benchmark's
    sweep)."""
    require_triton("fp8_rows_gemm")
    m, k = x.shape
    n = weight.shape[0]
    if weight.dtype != moe.FP8 or weight.shape[1] != k or not weight.is_contiguous():
        raise ValueError(f"fp8_rows_gemm: weight {tuple(weight.shape)} {weight.dtype} is not "
                         f"a contiguous float8_e4m3fn [N, {k}]")
    scale = scale.reshape(-1)
    if scale.numel() != n or scale.dtype != torch.float32:
        raise ValueError(f"fp8_rows_gemm: scale is {tuple(scale.shape)} {scale.dtype}, not "
                         f"float32 [{n}] (one per row)")
    if m == 0:
        return x.new_empty(0, n)
    x = x if x.stride(1) == 1 else x.contiguous()
    tiles = tiles or default_tiles(m, x.dtype)
    block_m = tiles.block_m
    rows = triton.cdiv(m, block_m) * block_m
    sorted_ids = torch.arange(rows, device=x.device, dtype=torch.int32).clamp_(max=m)
    tile_experts = torch.zeros(rows // block_m, device=x.device, dtype=torch.int32)
    ones = torch.ones(m, device=x.device, dtype=torch.float32)
    out = torch.empty(m, n, device=x.device, dtype=torch.float32)
    moe._down_kernel[(rows // block_m, triton.cdiv(n, tiles.block_n))](
        x, weight, ones, out, sorted_ids, tile_experts, scale.contiguous(),
        m, 1, n, k,
        x.stride(0), 0, weight.stride(0), out.stride(0), 0, 1, 1, 1,
        BLOCK_M=block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
        FP32_DOT=x.dtype == torch.float32 or (x.dtype == torch.bfloat16 and not x.is_cuda),
        SCALED=1, num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )  # fmt: skip
    return out.to(x.dtype)


def fp8_rows_gemm_reference(x: torch.Tensor, weight: torch.Tensor,
                            scale: torch.Tensor) -> torch.Tensor:
    """What :func:`fp8_rows_gemm` computes, in float32 torch ops, rounded once."""
    w = weight.float() * scale.reshape(-1, 1).float()
    return (x.float() @ w.t()).to(x.dtype)
