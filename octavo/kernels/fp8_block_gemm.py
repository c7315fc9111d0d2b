"""Block-scaled FP8 weights (DeepSeek / Qwen3-FP8 checkpoints: e4m3 [N, K] with a float32
``weight_scale_inv`` per block of (rows, columns), usually 128 x 128) times bf16/fp16
activations, weight-only:

- 1-2 rows (:func:`fp8_block_gemv`): the FP8 GEMV (``octavo.kernels.fp8_gemv``) in its
  block mode (U8 = 3), each K step inside one block column, its sum times the block's scale.
- More rows, W8A8 (:func:`block_scaled_mm`): the activations rounded to FP8 per 128
  columns, then ``torch._scaled_mm``'s blockwise recipe on the FP8 tensor cores.
- More rows where that recipe does not run (:func:`fp8_block_gemm`): ``fused_moe``'s
  down-projection launch with one expert. Each program's rows are a plain run of the batch
  (the alignment of one expert is the identity), its weight tiles converted exactly in the
  main loop and each K step's float32 sum times its block's scale; the float32 result is
  rounded once.

Past that GEMM's rows a layer dequantizes (:func:`dequantize`) and runs cuBLAS
(``octavo.quantization.fp8``).
``fp8_block_gemm_reference`` is what both are tested against."""

from __future__ import annotations

import torch

from octavo.envs import fp8_block_fold
from octavo.kernels import fp8_block_gemv as folded
from octavo.kernels import fp8_gemv as gemv
from octavo.kernels import fused_moe as moe
from octavo.kernels.fp8_group_quant import fp8_group_quant
from octavo.kernels.triton_utils import require_triton, tl, triton


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
    the FP8 GEMV with each K step inside one block column (``fp8_gemv.group_plan``), or with
    OCTAVO_FP8_BLOCK_FOLD the scales folded into the activations where that kernel's plan
    takes the shape (``fp8_block_gemv``). ``glu`` as ``fp8_gemv.fp8_gemv``."""
    n, k = weight.shape
    if fp8_block_fold() and folded.plan(n, k, block, glu) is not None:
        return folded.fp8_block_gemv_folded(x2, weight, scale, block, glu=glu)
    block_n, block_k, warps, waves, stages = gemv.group_plan(n, k, block[1])
    return gemv._launch(x2, weight, scale, None, block_n, block_k, warps, waves, None, None,
                        stages, glu=glu, block=block)


def fp8_block_gemm(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                   block: tuple[int, int], tiles: moe.MoeTiles | None = None) -> torch.Tensor:
    """``x`` [M, K] (float16 / bfloat16 / float32) times the block-scaled ``weight`` [N, K]
    (float8_e4m3fn, ``scale`` float32 [ceil(N / rows), ceil(K / columns)]) -> [M, N] in x's
    dtype. ``tiles``: the launch's tiles (None: :func:`gemm_tiles`; the benchmark's sweep)."""
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
    tiles = tiles or gemm_tiles(m, x.dtype)
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


# (device index, activation dtype) -> whether torch._scaled_mm runs the blockwise recipe
# there (learned on the first call: False off sm_90; on sm_90, cuBLAS 12.9+ runs it, other
# builds raise).
_SCALED_MM_RUNS: dict[tuple[int, torch.dtype], bool] = {}
MIN_SCALE = 1e-12  # an all-zero activation group's scale (any positive one gives zeros)


def block_scaled_mm(x2: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                    block: tuple[int, int]) -> torch.Tensor | None:
    """``x2`` [M, K] times the block-scaled ``weight`` [N, K] as W8A8 on FP8 tensor cores:
    the activations rounded to FP8 per 128 columns of each row (``fp8_group_quant``: the
    checkpoints' own activation rounding), then ``torch._scaled_mm``'s 1 x 128 x 128 x 128
    blockwise recipe (cuBLAS 12.9+, sm_90). None where it does not run: not CUDA sm_90, not
    128 x 128 blocks, float32 activations, or a torch / cuBLAS without the recipe (learned
    on the first call per device and dtype; the caller then falls back)."""
    if not (x2.is_cuda and block == (128, 128) and x2.dtype in (torch.bfloat16, torch.float16)
            and weight.shape[0] % 16 == 0 and x2.shape[1] % 128 == 0):
        return None
    device = x2.device.index if x2.device.index is not None else torch.cuda.current_device()
    index = (device, x2.dtype)
    runs = _SCALED_MM_RUNS.get(index)
    if runs is None and torch.cuda.get_device_capability(device)[0] != 9:
        runs = _SCALED_MM_RUNS[index] = False  # the recipe is sm_90's only
    if runs is False:
        return None
    m = x2.shape[0]
    q, s = fp8_group_quant(x2 if x2.stride(1) == 1 else x2.contiguous(), block[1], MIN_SCALE,
                           rows=-(-m // 4) * 4)  # cuBLAS: rows a multiple of 4
    try:
        y = torch._scaled_mm(q, weight.t(), s, scale.t(), out_dtype=x2.dtype)
    except (RuntimeError, NotImplementedError) as e:
        if index in _SCALED_MM_RUNS:
            raise
        import logging

        logging.getLogger(__name__).warning(
            "torch._scaled_mm has no blockwise FP8 recipe here (%s): block-scaled layers "
            "past the Triton GEMM's rows dequantize per call", str(e).splitlines()[0][:160])
        _SCALED_MM_RUNS[index] = False
        return None
    _SCALED_MM_RUNS[index] = True
    return y[:m]


def gemm_tiles(m: int, dtype: torch.dtype) -> moe.MoeTiles:
    """The block GEMM's tiles for ``m`` rows (fused_moe's with one expert)."""
    return moe.default_tiles(m, 1, 1, dtype, fp8=True)


@triton.jit
def _dequantize_kernel(w_ptr, s_ptr, out_ptr, N, K, stride_sn, stride_sk,
                       ROWS: tl.constexpr, COLS: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr):
    # Grid (N tiles, K tiles): out[n, k] = w[n, k] * s[n // ROWS, k // COLS] in float32,
    # rounded once to out's dtype.
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    ok = (offs_n < N)[:, None] & (offs_k < K)[None, :]
    w = tl.load(w_ptr + offs_n[:, None].to(tl.int64) * K + offs_k[None, :], mask=ok, other=0.0)
    s = tl.load(s_ptr + (offs_n // ROWS)[:, None] * stride_sn + (offs_k // COLS)[None, :]
                * stride_sk, mask=ok, other=0.0)
    out = w.to(tl.float32) * s
    tl.store(out_ptr + offs_n[:, None].to(tl.int64) * K + offs_k[None, :],
             out.to(out_ptr.dtype.element_ty), mask=ok)


def dequantize(weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int],
               dtype: torch.dtype) -> torch.Tensor:
    """The block-scaled ``weight`` [N, K] as ``dtype``: each weight times its block's
    float32 scale, rounded once (one launch: 1 byte read and 2 written per weight where
    ``fused_moe.dequantize_fp8_weight``'s float32 temporaries move about 20)."""
    require_triton("fp8_block_gemm.dequantize")
    n, k = weight.shape
    assert weight.is_contiguous() and tuple(scale.shape) == (-(-n // block[0]),
                                                              -(-k // block[1])), scale.shape
    out = torch.empty(n, k, dtype=dtype, device=weight.device)
    block_n, block_k = 32, 128
    _dequantize_kernel[(triton.cdiv(n, block_n), triton.cdiv(k, block_k))](
        weight, scale, out, n, k, scale.stride(0), scale.stride(1), ROWS=block[0],
        COLS=block[1], BLOCK_N=block_n, BLOCK_K=block_k, num_warps=4)
    return out


def fp8_block_gemm_reference(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                             block: tuple[int, int]) -> torch.Tensor:
    """float32 ``x @ W^T`` over the dequantized weight, rounded once to x's dtype."""
    return (x.float() @ moe.dequantize_fp8_weight(weight, scale, block).t()).to(x.dtype)
