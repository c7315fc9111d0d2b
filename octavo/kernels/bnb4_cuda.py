"""bitsandbytes 4-bit small batches on CUDA cores in CUDA C++ (``cuda/bnb4_gemv.cu``): the 16
code values in shared memory, so a weight costs a shift, a mask, a conflict-free shared load
and an FMA (4 sm_90 instructions, 9 in the Triton GEMV of ``bnb4_gemv.py``, whose code
lookups are global gathers with 64-bit addresses: 7-9% of an H200's HBM).

A block takes 1,024 weights of K (the last chunk maybe fewer) for a tile of weight rows; each
lane keeps its 32 activations (per row of x, up to 4 rows a launch: a larger batch takes a
launch per 4) in float32 registers across the weight rows it visits, and the chunks' sums
meet in a float32 output by atomics (zeroed first, then rounded to x's dtype: two small launches
around the kernel). The chunks add in the order the hardware picks: float32 sums that may
differ in their last bits between runs. ``OCTAVO_BNB4_CUDA`` (on; session 46, one H100:
Llama-3.1-8B NF4 at batch 1 3.885 ms per token against the Triton GEMV's 11.673; session 47:
up to 8 rows, batch 4 9.679 against 18.673 dequantizing, bf16 6.079).
"""

from __future__ import annotations

import torch

from octavo import envs
from octavo.kernels import cuda_module

SOURCE = "bnb4_gemv.cu"
CHUNK = 1024  # weights of K a block covers (32 a lane)
WARPS = 8
MIN_ROWS = 32  # rows a block takes at least (4 a warp)
LAUNCH_M = 4  # rows of x a launch takes (a lane keeps 32 activations of each in registers)
# Rows the kernel takes, a launch per LAUNCH_M (OCTAVO_BNB4_CUDA_MAX_M); larger batches
# dequantize, then cuBLAS. One H100, session 47, Llama-3.1-8B NF4, ms per token with the
# ``ahead`` rule below: batch 3 / 4 9.633 / 9.679 against 18.659 / 18.673 dequantizing,
# 6 / 8 17.881 / 17.902 (two launches) against ~18.7; batch 16's four launches had taken
# 39.5 (at one row a warp in flight) against 19.1.
MAX_M = 8


def ahead(rows: int) -> int:
    """Weight rows a warp loads before their arithmetic, for a launch of ``rows`` rows of x
    (``OCTAVO_BNB4_CUDA_AHEAD``: 1 or 8 for every launch). Two to four rows hold 97-180
    registers a lane (one or two 256-thread blocks an SM), so one 512-byte row a warp in
    flight left HBM idle: 8 ahead (one H100, session 47, Llama-3.1-8B NF4, ms per token) took
    batch 2 5.684 -> 5.298, 3 11.040 -> 9.633, 4 11.176 -> 9.679. One row (55 registers,
    four blocks an SM) loses by it: batch 1 3.823 at 1, 4.096 at 4 ahead; gate_up alone
    43.9 / 47.2 / 53.4 us at 1 / 4 / 8."""
    return envs.bnb4_cuda_ahead(1 if rows == 1 else 8)


_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16"}


def supported(m: int, k: int, blocksize: int, dtype: torch.dtype) -> bool:
    """Whether the kernel takes [m, k] activations of ``dtype`` on a weight in ``blocksize``
    blocks: 1 to OCTAVO_BNB4_CUDA_MAX_M rows, bf16 / fp16, K a multiple of 32 (a lane's
    weights) and of the blocksize, a lane's 32 weights in one block."""
    return (1 <= m <= envs.bnb4_cuda_max_m(MAX_M) and dtype in _DTYPES and k % 32 == 0
            and blocksize % 32 == 0 and k % blocksize == 0)


def available(device: torch.device) -> bool:
    """Whether bitsandbytes 4-bit layers use this kernel on ``device``: turned on
    (``OCTAVO_BNB4_CUDA``) and built (nvcc, an NVIDIA GPU)."""
    return envs.bnb4_cuda() and cuda_module.module(SOURCE, device) is not None


def rows_per_block(n: int, k: int, device: torch.device) -> int:
    """Rows a block takes: about 8 blocks of 8 warps per SM over the (rows, chunks) grid,
    at least 4 rows per warp. One H100 (session 46, ``benchmarks/gemv_scaling.py``, one row,
    us): 4096 x 4096 at 8 / 16 (the grid rule) / 32 rows 14.4 / 12.1 / 10.8; 28672 x 4096
    at 32 / 112 (the grid rule) / 128 rows 50.3 / 45.0 / 47.6."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    rows = -(-n * -(-k // CHUNK) // (8 * sms))
    return max(MIN_ROWS, -(-rows // WARPS) * WARPS)


def bnb4_gemv_cuda(x2: torch.Tensor, qweight: torch.Tensor, absmax: torch.Tensor,
                   code: torch.Tensor, blocksize: int, rows: int | None = None) -> torch.Tensor:
    """``x2 [M, K] @ W^T`` in x2's dtype (a launch per 4 rows of x), ``W[n, k] =
    code[nibble] * absmax[n, k // blocksize]`` of the packed ``qweight`` uint8 [N, K / 2]
    (high nibble first, rows 16-byte aligned), ``absmax`` float32 [N, K / blocksize], ``code``
    the 16 float32 code values.
    ``rows``: rows a block takes (:func:`rows_per_block` by default)."""
    m, k = x2.shape
    n = qweight.shape[0]
    if not supported(m, k, blocksize, x2.dtype):
        raise ValueError(f"bnb4_gemv_cuda: x {tuple(x2.shape)} {x2.dtype} with blocks of "
                         f"{blocksize} is not supported")
    assert qweight.dtype == torch.uint8 and qweight.shape[1] * 2 == k and qweight.stride(1) == 1
    assert qweight.stride(0) % 16 == 0 and qweight.data_ptr() % 16 == 0, qweight.stride()
    assert tuple(absmax.shape) == (n, k // blocksize) and absmax.dtype == torch.float32 \
        and absmax.stride(1) == 1, (absmax.shape, absmax.dtype)
    assert code.shape == (16,) and code.dtype == torch.float32 and code.is_contiguous()
    x2 = cuda_module.aligned_rows(x2)
    mod = cuda_module.loaded(SOURCE, x2.device)
    out = torch.zeros(m, n, device=x2.device, dtype=torch.float32)
    rows = rows or rows_per_block(n, k, x2.device)
    for i in range(0, m, LAUNCH_M):  # each launch reads the whole weight once
        xi, oi = x2[i:i + LAUNCH_M], out[i:i + LAUNCH_M]
        args = cuda_module.arguments(qweight, absmax, code, xi, oi, n, k, qweight.stride(0),
                                     absmax.stride(0), x2.stride(0), blocksize, rows)
        mod.launch(f"bnb4_gemv_{_DTYPES[x2.dtype]}_m{xi.shape[0]}_a{ahead(xi.shape[0])}",
                   (-(-n // rows), -(-k // CHUNK), 1), 32 * WARPS, args)
    return out.to(x2.dtype)
