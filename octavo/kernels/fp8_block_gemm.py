"""Block-scaled FP8 weights (DeepSeek / Qwen3-FP8 checkpoints: e4m3 [N, K] with a float32
``weight_scale_inv`` per block of (rows, columns), usually 128 x 128) times bf16/fp16
activations, weight-only:

- 1-2 rows (:func:`fp8_block_gemv`): the FP8 GEMV (``octavo.kernels.fp8_gemv``) in its
  block mode (U8 = 3), each K step inside one block column, its sum times the block's scale.
- More rows (:func:`fp8_block_gemm`): ``fused_moe``'s down-projection launch with one
  expert. Each program's rows are a plain run of the batch (the alignment of one expert is
  the identity), its weight tiles converted exactly in the main loop and each K step's
  float32 sum times its block's scale; the float32 result is rounded once.

Large batches dequantize and run cuBLAS (``octavo.quantization.fp8``).
``fp8_block_gemm_reference`` is what both are tested against."""

from __future__ import annotations

import torch

from octavo.kernels import fp8_gemv as gemv
from octavo.kernels import fused_moe as moe
from octavo.kernels.triton_utils import require_triton, triton


def block_supported(m: int, k: int, block: tuple[int, int]) -> bool:
    """Whether :func:`fp8_block_gemv` takes [m, k] activations on a weight scaled in
    ``block`` = (rows, columns) blocks: m <= MAX_M, K a multiple of 4, the columns a multiple
    of the GEMV's smallest K step."""
    return (1 <= m <= gemv.MAX_M and k % 4 == 0 and block[0] > 0
            and block[1] % gemv.SMALLEST_STEP == 0)


def fp8_block_gemv(x2: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                   block: tuple[int, int], glu: bool = False) -> torch.Tensor:
    """``x2 [M, K] @ W^T`` for M <= MAX_M in x2's dtype, ``W = weight * scale`` of each
    ``block`` = (rows, columns) block (float32 scales [ceil(N / rows), ceil(K / columns)]):
    the FP8 GEMV with each K step inside one block column (``fp8_gemv.group_plan``).
    ``glu`` as ``fp8_gemv.fp8_gemv``."""
    n, k = weight.shape
    block_n, block_k, warps, waves, stages = gemv.group_plan(n, k, block[1])
    return gemv._launch(x2, weight, scale, None, block_n, block_k, warps, waves, None, None,
                        stages, glu=glu, block=block)


def fp8_block_gemm(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                   block: tuple[int, int]) -> torch.Tensor:
    """``x`` [M, K] (float16 / bfloat16 / float32) times the block-scaled ``weight`` [N, K]
    (float8_e4m3fn, ``scale`` float32 [ceil(N / rows), ceil(K / columns)]) -> [M, N] in x's
    dtype."""
    require_triton("fp8_block_gemm")
    m, k = x.shape
    n = weight.shape[0]
    if weight.dtype != moe.FP8 or weight.shape[1] != k or not weight.is_contiguous():
        raise ValueError(f"fp8_block_gemm: weight {tuple(weight.shape)} {weight.dtype} is not "
                         f"a contiguous float8_e4m3fn [N, {k}]")
    want = (-(-n // block[0]), -(-k // block[1]))
    if tuple(scale.shape) != want or scale.dtype != torch.float32:
        raise ValueError(f"fp8_block_gemm: scale is {tuple(scale.shape)} {scale.dtype}, not "
                         f"float32 {want} (one per {tuple(block)} block)")
    if m == 0:
        return x.new_empty(0, n)
    x = x if x.stride(1) == 1 else x.contiguous()
    tiles = moe.default_tiles(m, 1, 1, x.dtype, fp8=True)
    block_m, block_n, block_k = tiles.block_m, tiles.block_n, min(tiles.block_k, block[1])
    fp8 = moe.Fp8Experts(w13=weight[None], s13=scale[None], w2=weight[None], s2=scale[None],
                         block=block)
    s = moe._scale_args(fp8, "2", n, k, block_k, weight)
    rows = triton.cdiv(m, block_m) * block_m
    sorted_ids = torch.arange(rows, device=x.device, dtype=torch.int32).clamp_(max=m)
    tile_experts = torch.zeros(rows // block_m, device=x.device, dtype=torch.int32)
    ones = torch.ones(m, device=x.device, dtype=torch.float32)
    out = torch.empty(m, n, device=x.device, dtype=torch.float32)
    moe._down_kernel[(rows // block_m, triton.cdiv(n, block_n))](
        x, weight, ones, out, sorted_ids, tile_experts, s[0],
        m, 1, n, k,
        x.stride(0), 0, weight.stride(0), out.stride(0), *s[1:5],
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        FP32_DOT=x.dtype == torch.float32 or (x.dtype == torch.bfloat16 and not x.is_cuda),
        SCALED=s[5], num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )  # fmt: skip
    return out.to(x.dtype)


def fp8_block_gemm_reference(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                             block: tuple[int, int]) -> torch.Tensor:
    """float32 ``x @ W^T`` over the dequantized weight, rounded once to x's dtype."""
    return (x.float() @ moe.dequantize_fp8_weight(weight, scale, block).t()).to(x.dtype)
