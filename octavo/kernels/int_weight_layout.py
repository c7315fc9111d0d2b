"""Which packed layout a weight-only integer layer (GPTQ / AWQ / compressed-tensors W4A16 and
W8A16) takes on the GPU, and which kernel runs a batch on it.

Two layouts, one per layer (keeping both would double the quantized weight):

- ``along_k`` (``octavo.kernels.w4a16_gemm``): int32 [K / pack, N]. One-row batches run the
  CUDA-core GEMV, small batches the tensor-core kernel, large ones dequantize-then-cuBLAS.
- ``swapab`` (``octavo.kernels.w4a16_swapab``): int16 [N / per, K]. The weight tile is the
  tensor cores' A operand straight from registers, so a batch of 16 rows costs about what one
  row does; up to ``SWAPAB_MAX_M`` rows run that GEMM, larger batches dequantize-then-cuBLAS.

Measured on an H200 (``benchmarks/quantized_gemm.py``, Llama-3.1-8B projections, 4-bit g128,
microseconds, along_k / swapab): at one row qkv 11.1 / 15.3, o 10.7 / 15.3, gate_up
27.9 / 29.2, down 18.9 / 22.1; at 16 rows qkv 18.5 / 17.1, o 14.0 / 17.0, gate_up 74.9 / 31.5,
down 36.3 / 24.7; at 64 and 128 rows gate_up 77.7 / 68.1 and 146.7 / 105.4 (dequantize-then-
cuBLAS from the swap-AB layout: 153.7 and 198.4). So on Hopper the large 4-bit projections (at
least ``SWAPAB_MIN_WEIGHTS`` values) take the swap-AB layout: a few microseconds per layer lost
at batch 1, tens won from batch 3 to 128; the small ones keep the GEMV's layout. 8-bit weights
keep it too: the swap-AB GEMM at one row took 1.7x the 8-bit GEMV's time per layer (W8A16
batch 1 in the engine 6.7 ms against 3.9).

On the swap-AB layout, batches of 1-8 rows run the CUDA kernel of ``swapab_mma`` where it is
built (nvcc, an NVIDIA GPU; ``OCTAVO_CUDA_KERNELS=0`` turns it off). Llama-3.1-8B W4A16 on an
H200 (session 19, ms per token at batch 1 / 16 / 64): Triton only 3.012 / 3.911 / 7.098;
the kernel on this rule's layers for 1-16 rows 2.804 / 4.298 / 7.118; on every layer (all
in the swap-AB layout) 2.787 / 4.762 / 7.780, and for 1-8 rows only 2.786 / 4.231 / 7.776:
at 16 rows the kernel loses in the engine, and qkv / o gain nothing at one row from leaving
the GEMV's layout while losing from 17 rows up. (8-bit at one row: 3.980 against the GEMV's
3.547 in session 18.)
"""

from __future__ import annotations

import torch

from octavo import envs
from octavo.kernels import swapab_mma
from octavo.kernels import w4a16_gemm as along_k
from octavo.kernels import w4a16_swapab as swapab

ALONG_K = "along_k"
SWAPAB = "swapab"
SWAPAB_MIN_WEIGHTS = 1 << 25  # K * N; Llama-8B's gate_up (117M) and down (59M), not qkv / o
SWAPAB_BITS = 4  # the bits the size rule sends to the swap-AB layout (OCTAVO_INT_SWAPAB_8BIT: +8)
SWAPAB_MAX_M = 128  # larger batches dequantize into a temporary and use cuBLAS


def choose(k: int, n: int, group_size: int, bits: int, device: torch.device) -> str:
    """The layout for a [K, N] integer weight on ``device`` (``OCTAVO_INT_WEIGHT_LAYOUT``
    overrides the size and bits rule, not what the kernel can hold)."""
    if device.type != "cuda" or not swapab.supports(k, n, group_size, bits):
        return ALONG_K
    mode = envs.int_weight_layout()
    if mode != "auto":
        return mode
    hopper = torch.version.hip is None and torch.cuda.get_device_capability(device)[0] >= 9
    bits_ok = bits == SWAPAB_BITS or (bits == 8 and envs.int_swapab_8bit())
    large = k * n >= SWAPAB_MIN_WEIGHTS and bits_ok
    return SWAPAB if hopper and large else ALONG_K


def pack(q: torch.Tensor, bits: int, layout: str) -> torch.Tensor:
    """Integer values [K, N] in ``layout``."""
    return swapab.pack_swapab(q, bits) if layout == SWAPAB else along_k.pack_along_k(q, bits)


def linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
           group_size: int, bits: int, layout: str) -> torch.Tensor:
    """``x [.., K] @ dequant(W) [K, N]`` in x's dtype, for a weight packed in ``layout``."""
    if layout != SWAPAB:
        return along_k.w4a16_gemm(x, qweight, scales, zeros, group_size, bits)
    return along_k.over_rows(x, qweight.shape[0] * (16 // bits), lambda x2: _swapab_rows(
        x2, qweight, scales, zeros, group_size, bits))


def _swapab_rows(x2: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                 zeros: torch.Tensor, group_size: int, bits: int) -> torch.Tensor:
    m, k = x2.shape
    if m <= swapab_mma.max_rows() and swapab_mma.available(x2.device) and swapab_mma.supports(
            m, k, qweight.shape[0] * (16 // bits), group_size, bits, x2.dtype):
        return swapab_mma.swapab_mma(x2, qweight, scales, zeros, group_size, bits,
                                     **swapab_mma.engine_plan())
    if m <= envs.int_swapab_max_m(SWAPAB_MAX_M):
        # Up to 16 rows: 16-row tiles on mma.sync with 8 programs' worth per SM (the sweep's
        # best on gate_up and down at 1 and 16 rows); more rows: one warpgroup's wgmma.
        # Batch tiles of 8 (130 registers, 1.8 SASS instructions per weight against 200 and
        # 2.1) measured slower at one row: gate_up 34.7 vs 30.4 us, down 23.5 vs 22.3, and
        # the engine's batch 1 3.62 vs 3.17 ms.
        tiles = {"block_r": 16, "waves": 8} if x2.shape[0] <= 16 else {}
        return swapab.w4a16_swapab(x2, qweight, scales, zeros, group_size, bits, **tiles)
    return x2 @ swapab.dequantize_swapab(qweight, scales, zeros, group_size, bits, x2.dtype)
