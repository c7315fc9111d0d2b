"""Block-scaled FP8 weights (DeepSeek / Qwen3-FP8 checkpoints: e4m3 [N, K] with a float32
``weight_scale_inv`` per block of (rows, columns), usually 128 x 128) times bf16/fp16
activations, weight-only, for the batches between the GEMV's rows and a prefill:
``fused_moe``'s down-projection launch with one expert. Each program's rows are a plain run
of the batch (the alignment of one expert is the identity), its weight tiles converted
exactly in the main loop and each K step's float32 sum times its block's scale; the float32
result is rounded once (``fused_moe.sum_pairs`` with one pair a row).

``octavo.kernels.fp8_gemv.fp8_block_gemv`` takes 1-2 rows; large batches dequantize and run
cuBLAS (``octavo.quantization.fp8``). ``fp8_block_gemm_reference`` is what it is tested
against."""

from __future__ import annotations

import torch

from octavo.kernels import fused_moe as moe
from octavo.kernels.triton_utils import require_triton, triton


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
    bo, bi = block
    n, k = weight.shape
    s = scale.float().repeat_interleave(bo, 0)[:n].repeat_interleave(bi, 1)[:, :k]
    return (x.float() @ (weight.float() * s).t()).to(x.dtype)
