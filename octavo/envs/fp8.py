"""FP8 linear switches: the FP8 GEMV and its fused epilogues, the CUDA float8 kernel, the
row-scaled and block-scaled recipes and the activation quantizer."""

from __future__ import annotations

from octavo.envs._parse import _batch_size, _flag, _int, _optional_int


def fp8_gemv_stages() -> int | None:
    """OCTAVO_FP8_GEMV_STAGES=2|3 (unset: the kernel's default): steps of weights the FP8
    GEMV keeps in flight, for measurements."""
    return _optional_int("OCTAVO_FP8_GEMV_STAGES", 2, 3)


def cuda_fp8() -> bool:
    """OCTAVO_CUDA_FP8 (default on): on NVIDIA GPUs (compute capability 8.9+) with nvcc,
    FP8-weight linears (W8A8) run decode batches of OCTAVO_CUDA_FP8_MIN_M..OCTAVO_CUDA_FP8_MAX_M
    rows (default 2..8) through the float8 kernels of octavo/kernels/cuda/dense_mma_fp8.cu
    (activations unrounded, weights converted in registers) instead of torch._scaled_mm."""
    return _flag("OCTAVO_CUDA_FP8", True)


def cuda_fp8_min_m(default: int) -> int:
    """OCTAVO_CUDA_FP8_MIN_M: the smallest batch the CUDA float8 kernel takes."""
    return _batch_size("OCTAVO_CUDA_FP8_MIN_M", default)


def cuda_fp8_max_m(default: int) -> int:
    """OCTAVO_CUDA_FP8_MAX_M: the largest batch the CUDA float8 kernel takes (at most 32)."""
    return _batch_size("OCTAVO_CUDA_FP8_MAX_M", default)


def fused_qkv_rope() -> bool:
    """OCTAVO_FUSED_QKV_ROPE (default on): on CUDA, a one-row fp8 decode's
    qkv projection on the FP8 GEMV applies the NeoX rotary embedding to q and k in its
    store and writes the rotated k and the v into the paged KV cache (where
    OCTAVO_FUSED_KV_STORE allows the cache to be written before attention), so the rotary
    launch disappears; off, the GEMV stores [q | k | v] and the rotary kernel runs after
    it."""
    return _flag("OCTAVO_FUSED_QKV_ROPE", True)


def fp8_block_kept() -> bool:
    """OCTAVO_FP8_BLOCK_KEPT (default on; 0: dequantize at load): on CUDA of compute
    capability 8.9+, dense layers of block-scaled FP8 checkpoints (``weight_block_size``,
    e.g. Qwen3-8B-FP8) keep their FP8 blocks instead of dequantizing at load: 1-2 rows
    through octavo/kernels/fp8_block_gemv.py (OCTAVO_FP8_BLOCK_FOLD), 3+ rows as W8A8
    through torch._scaled_mm's blockwise recipe (OCTAVO_FP8_BLOCK_SCALED_MM; where it does
    not run, octavo/kernels/fp8_block_gemm.py up to OCTAVO_FP8_BLOCK_GEMM_MAX_M rows, then
    dequantized per call). Llama-3.1-8B shape, 128 x 128 blocks (session 44): 8.46 GiB
    against the dequantized 14.96; H200 batch 1 2.77 ms per token against 4.10; H100
    1.29-1.32x bf16 at batches 4-256, W2 1.24x."""
    return _flag("OCTAVO_FP8_BLOCK_KEPT", True)


def fp8_block_fold() -> bool:
    """OCTAVO_FP8_BLOCK_FOLD (default on; 0: the FP8 GEMV's block mode, a scale per step of
    at most one block column): kept block-scaled FP8 layers run 1-2 rows through
    octavo/kernels/fp8_block_gemv.py (the scales folded into the activations, the
    row-scaled GEMV's wide K steps) where its plan takes the shape. Llama-3.1-8B shape,
    128 x 128 blocks, one H200 (session 44): 2.766 against 3.264 ms per token at batch 1,
    3.702 against 4.298 at batch 2."""
    return _flag("OCTAVO_FP8_BLOCK_FOLD", True)


def fp8_block_gemm_max_m() -> int:
    """OCTAVO_FP8_BLOCK_GEMM_MAX_M (default 64): where the W8A8 blockwise ``torch._scaled_mm``
    (OCTAVO_FP8_BLOCK_SCALED_MM) does not run, the most rows a kept block-scaled FP8 layer
    runs through its weight-only Triton GEMM (octavo/kernels/fp8_block_gemm.py) before
    dequantizing per call. Llama-3.1-8B's projections on one H100 (session 44,
    ``benchmarks/fp8_block_gemm.py``), against a bf16 GEMM's time: the GEMM 0.75-0.87x at
    4-16 rows (gate_up 1.5x faster), 0.43-0.75x at 32-64, 0.3x from 256; dequantizing
    0.4-0.5x at 16-256 rows, 0.7x at 1,024; ``_scaled_mm``'s 1.0-1.7x at 16-1,024 rows."""
    return _int("OCTAVO_FP8_BLOCK_GEMM_MAX_M", 64, "rows")


def fp8_tensorwise() -> bool:
    """OCTAVO_FP8_TENSORWISE (default on): row-scaled FP8 layers (``quantization="fp8"``,
    per-channel and per-tensor checkpoints) past the CUDA float8 kernel's rows run
    ``torch._scaled_mm`` with unit scales into float32 and apply the per-token and per-row
    scales in one more launch (octavo/kernels/outer_scale.py); off, ``_scaled_mm``'s row-wise
    recipe. Llama-3.1-8B's four projections at 16 rows on one H200 (session 45,
    ``benchmarks/fp8_rows_gemm.py``): 69 us a layer unit-scaled, 117 row-wise, 126 bf16."""
    return _flag("OCTAVO_FP8_TENSORWISE", True)


def fp8_unit_glu() -> bool:
    """OCTAVO_FP8_UNIT_GLU (default on): an MLP's merged gate/up FP8 layer on the unit-scaled
    GEMM (OCTAVO_FP8_TENSORWISE's rows) applies silu(gate) * up in the same launch as its
    scales (octavo/kernels/outer_scale.py's GLU mode), one launch and the [tokens, 2 x
    intermediate] bf16 round trip fewer per layer. One H100 (session 46), Llama-3.1-8B fp8 ms
    per token at batch 16 / 64 / 128: 4.889 / 5.571 / 6.813 against 4.947 / 5.692 / 6.993."""
    return _flag("OCTAVO_FP8_UNIT_GLU", True)


def fp8_tensorwise_max_m() -> int:
    """OCTAVO_FP8_TENSORWISE_MAX_M (default 128): the most rows OCTAVO_FP8_TENSORWISE's
    unit-scaled GEMM takes; larger batches run the row-wise recipe, whose float32-free
    output costs less there. One H200 (session 45), Llama-3.1-8B's four projections, us a
    layer with the quantizer: 64 rows 104 unit-scaled against 126 row-wise, 256 rows 148
    against 144."""
    return _int("OCTAVO_FP8_TENSORWISE_MAX_M", 128, "rows")


def fp8_block_scaled_mm() -> bool:
    """OCTAVO_FP8_BLOCK_SCALED_MM (default on): kept block-scaled FP8 layers run batches of 3+
    rows as W8A8 on the FP8 tensor cores (activations rounded per 128 columns, as the
    checkpoints' reference implementations do; torch._scaled_mm's blockwise recipe, sm_90
    with cuBLAS 12.9+); off (or where it does not run), the weight-only Triton GEMM up to
    OCTAVO_FP8_BLOCK_GEMM_MAX_M rows, then dequantized per call. Llama-3.1-8B shape, one H100
    (session 44): batch 32 / 64 / 256 1.20x / 1.18x / 1.32x bf16 (0.48x / 0.41x at 64 / 256
    before), W2 1.24x bf16 (0.51x)."""
    return _flag("OCTAVO_FP8_BLOCK_SCALED_MM", True)


def fp8_gemv() -> bool:
    """OCTAVO_FP8_GEMV (default on): on CUDA, FP8-weight linears with quantized activations
    (W8A8) run decode batches of <= 2 rows through the FP8-weight GEMV
    (octavo/kernels/fp8_gemv.py: activations kept in their dtype, so those rows skip the
    activation rounding); off, torch._scaled_mm at every batch size."""
    return _flag("OCTAVO_FP8_GEMV", True)


def fp8_fused_quant() -> bool:
    """OCTAVO_FP8_FUSED_QUANT (default on): on CUDA, the activations of FP8 (W8A8) linears go
    to fp8 with their per-token (or static) scales in one Triton launch
    (octavo/kernels/fp8_quant.py, bit-identical); off, six torch operations."""
    return _flag("OCTAVO_FP8_FUSED_QUANT", True)
