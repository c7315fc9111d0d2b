"""Float (bf16 / fp16) linear switches: the skinny GEMM, the one-row GEMV, the CUDA dense
kernel and the GLU fused into a projection."""

from __future__ import annotations

from octavo.envs._parse import _batch_size, _flag, _int


def skinny_gemm() -> bool:
    """OCTAVO_SKINNY_GEMM (default on): on CUDA, float linears of decode batches (<= 32 rows,
    bf16 / fp16) through one Triton launch (octavo/kernels/skinny_gemm.py); off, cuBLAS."""
    return _flag("OCTAVO_SKINNY_GEMM", True)


def dense_gemv() -> bool:
    """OCTAVO_DENSE_GEMV (default on): on CUDA, float linears of one row (bf16 / fp16)
    through the CUDA-core GEMV launched with PDL (octavo/kernels/dense_gemv.py); off, the
    skinny GEMM's shapes or cuBLAS."""
    return _flag("OCTAVO_DENSE_GEMV", True)


def cuda_dense() -> bool:
    """OCTAVO_CUDA_DENSE (default on): on NVIDIA GPUs with nvcc, float (bf16 / fp16) linears
    of decode batches (OCTAVO_CUDA_DENSE_MIN_M..OCTAVO_CUDA_DENSE_MAX_M rows, default 1..32)
    with weights of at most 16 MB run through the CUDA C++ kernel
    octavo/kernels/cuda/dense_mma.cu (built with nvcc at first use,
    octavo/kernels/cuda_module.py) instead of the GEMV / skinny GEMM / cuBLAS choice of
    octavo/kernels/float_linear.py. Measured on an H200 (docs/benchmarks.md, session 19), W4
    at the Qwen3-0.6B shape: batch 1 / 2 / 8 / 16 / 32 0.880 / 0.970 / 1.157 / 1.322 / 1.605
    ms per token against 0.938 / 1.148 / 1.280 / 1.417 / 1.663 without it."""
    return _flag("OCTAVO_CUDA_DENSE", True)


def cuda_dense_min_m(default: int) -> int:
    """OCTAVO_CUDA_DENSE_MIN_M: the smallest batch (rows) the CUDA dense kernel takes."""
    return _batch_size("OCTAVO_CUDA_DENSE_MIN_M", default)


def cuda_dense_max_m(default: int) -> int:
    """OCTAVO_CUDA_DENSE_MAX_M: the largest batch it takes (at most its 32)."""
    return _batch_size("OCTAVO_CUDA_DENSE_MAX_M", default)


def cuda_dense_max_bytes(default: int) -> int:
    """OCTAVO_CUDA_DENSE_MAX_BYTES: the largest weight (bytes) it takes (a measurement knob)."""
    return _int("OCTAVO_CUDA_DENSE_MAX_BYTES", default, "bytes")


def skinny_gemm_all() -> bool:
    """OCTAVO_SKINNY_GEMM_ALL (default off): send every decode-batch float linear through the
    skinny GEMM, not only the shapes where it measured faster than cuBLAS (to measure it)."""
    return _flag("OCTAVO_SKINNY_GEMM_ALL", False)


def fused_glu() -> bool:
    """OCTAVO_FUSED_GLU (default on): on CUDA, an MLP's silu(gate) * up runs inside a
    projection's kernel where one can take it, without the activation's own launch: the
    down projection's (a bf16 / fp16 weight on the one-row CUDA-core GEMV, as it reads its
    activations) or the gate/up projection's (an fp8 weight on the FP8 GEMV, in its store);
    off, the activation kernel runs between them, as for every other method."""
    return _flag("OCTAVO_FUSED_GLU", True)
