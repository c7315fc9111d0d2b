"""A warp-specialized CUDA GEMM for large batches of 4- and 8-bit weights on the swap-AB layout
(``cuda/swapab_wgmma.cu``, Hopper only): ``out [M, N] = x [M, K] @ dequant(W) [K, N]`` in bf16.

Why: past 128 rows the engine dequantizes each swap-AB layer's whole weight to bf16 in HBM and
calls cuBLAS, about twice a bf16 GEMM (H100, one Llama-8B layer at 256 rows: 413 against 204
us); W4A16 W2 runs at 0.83x bf16 (issue 12: 0.9x). Triton's in-loop version
(``swapab_large``, session 54) feeds wgmma from registers but keeps every warp in one
pipeline, so the dequantization, the copies and the MMAs wait on each other at every K step:
186.9 us on gate_up at 256 rows against 212.0 serial and 109.7 for bf16, the tensor cores at
about 40%. Here the roles are split, as Hopper GEMMs do it:

- the producer warpgroup's 128 threads copy each 64-wide K step's activations [128 x 64] (the
  MMA's B operand, 128-byte rows swizzled as wgmma's descriptor reads them), the packed rows
  [64 x 64] and the step's group of scales and zeros into a ring of 4 buffers (``cp.async``,
  completion on an mbarrier per buffer), their addresses set up once;
- two consumer warpgroups (setmaxnreg moves the producer warpgroup's registers to them) each
  take two of the four 4-bit values of the block's int16s (128 output columns): per K16 they
  read their words from shared memory, dequantize into wgmma's A registers ((q - z) * s in
  float32, rounded once to bf16: the values ``dequantize_swapab`` writes; or, ``bf16_math``,
  in bf16x2 ops: the same values for bf16 scales) and issue two m64n128k16 MMAs, keeping one
  group (``deep``: two) in flight while the next K16 dequantizes; a buffer goes back to the
  producer when the MMAs that read it are done.

One CTA covers 256 output columns x 128 batch rows: per 2.1M multiply-adds it reads 24 KB
(cuBLAS's 128 x 256 bf16 tile reads 48 KB), and the weights are dequantized once per 128 rows.
Where the tiles leave SMs idle (Llama-8B's down: 32 tiles at 256 rows) K is split over CTAs
(``plan``): each writes float32 partials, and a second launch over every SM adds them in
split order (``split_sum``; or, ``split_sum="cta"``, the last CTA of a tile, a ticket in
``split_k.counters``, zeroed again).

Measured (H100, session 57; bf16x2, two groups in flight, the launch sum): at 256 rows
gate_up 124.1 us, down / qkv / o 68.2 / 43.3 / 29.0 (float form) against 212.0 / 115.3 /
49.9 / 33.1 for dequantize-then-cuBLAS (bf16 100.0 / 56.2 / 23.4 / 17.8); at 80-128 rows a
layer's four 141-150 us against the swap-AB GEMM's 203-231. On by default from 65 rows
(``int_weight_layout``): Llama-8B W4A16 W2 0.85x -> 0.93x bf16, batch 128 0.82x -> 0.96x.

8-bit weights (session 64) take the same tiles: a CTA reads two 64-row blocks of the 8-bit
layout (two values an int16, 128 columns a block), so its 256 output columns, its MMAs and its
consumers' accumulators are the 4-bit kernel's; the producer copies twice the packed bytes a
step (33 KB stages), and warpgroup g dequantizes both bytes of block 2t + g: in float32,
``fma(256 + q, s, -(256 + z) s)`` (0x43800000 | q << 15 is the float 256 + q), or packed,
``(bias + q) + -(bias + z)`` exact in the activations' dtype (fp16: one PRMT gives 1024 + q;
bf16: two LOP3 and one bf16x2 FMA give q - 128, as ``swapab_mma``'s decode kernel does) times
the scale, rounded once. Measured (H100, session 64, ``benchmarks/large_int_gemm.py --bits 8``,
one Llama-8B layer's four GEMMs, us, the engine's 8-bit paths until then / this kernel in
bf16x2 with two groups in flight / bf16): 48 rows 154.1 / 153.9 / 184.8, 64 157.3 / 156.3 /
166.6, 128 239.4 / 169.1 / 173.8, 256 397.3 / 278.0 / 200.9; in the engine W8A16 batch 128
10.739 -> 8.938 ms (0.92x bf16), 256 17.243 -> 14.483 (0.77x), W2 6,915 -> 7,651 tok/s
(0.90x). On by default from 65 rows for 8-bit layers too (``OCTAVO_INT_LARGE_CUDA_8BIT``).
"""

from __future__ import annotations

import torch

from octavo import envs
from octavo.kernels import cuda_module
from octavo.kernels import split_k as split_k_mod
from octavo.kernels.split_sum import sum_splits
from octavo.kernels.triton_utils import num_compute_units

SOURCE = "swapab_wgmma.cu"
ROWS = 64  # int16 rows of a layout block (4-bit: 4 values each, 256 output columns; 8-bit: 2)
COLUMNS = 256  # output columns per CTA (one 4-bit block, two 8-bit ones)
BATCH = 128  # batch rows per CTA
STEP_K = 64
STAGES = 4
THREADS = 384
# Who sums the partials where K is split (``swapab_wgmma``'s ``split_sum``). A third way, the
# tile's split CTAs as a thread block cluster summing through distributed shared memory (no
# partials in global memory), was slower than both (H100, session 57, us at 256 rows, last
# CTA / launch / cluster: down 100.9 / 68.2 / 133.8, qkv 67.7 / 43.3 / 51.0, o 56.9 / 29.0 /
# 56.1) and was removed; git show d5ae5db has it.
SPLIT_SUMS = ("cta", "launch")


def shared_bytes(bits: int) -> int:
    """The ring (x, the CTA's packed rows, a group's scales and zeros per stage), 1024 bytes to
    align it, the full / empty barriers."""
    packed_rows = COLUMNS * bits // 16
    return (STAGES * (BATCH * STEP_K * 2 + packed_rows * STEP_K * 2 + 2 * COLUMNS * 2) + 1024
            + 2 * STAGES * 8)


def available(device: torch.device) -> bool:
    """Whether the kernel can run on ``device``: an sm_90 GPU (wgmma) where it builds."""
    if device.type != "cuda" or torch.version.hip is not None:
        return False
    if torch.cuda.get_device_capability(device) != (9, 0):
        return False
    return cuda_module.module(SOURCE, device) is not None


def supports(k: int, n: int, group_size: int, bits: int, x_dtype: torch.dtype,
             scale_dtype: torch.dtype) -> bool:
    """Shapes and dtypes the kernel holds: 4- or 8-bit; bf16 activations with bf16 or fp16
    scales, or fp16 activations with fp16 scales; K and the group multiples of 64, N of 256."""
    dtypes = ((torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float16),
              (torch.float16, torch.float16))
    return (bits in (4, 8) and (x_dtype, scale_dtype) in dtypes
            and k % STEP_K == 0 and group_size % STEP_K == 0 and k % group_size == 0
            and n % COLUMNS == 0)


def _tiles(m: int, n: int) -> int:
    """Output tiles (256 columns x 128 batch rows), one CTA each before K splits."""
    return n // COLUMNS * -(-m // BATCH)


def plan(m: int, n: int, k: int, device: torch.device) -> tuple[int, int]:
    """(K splits, K per split): enough splits that the tiles make about one CTA per SM
    (``split_k.within``, at most 16), none empty, each a whole number of 64-wide steps."""
    return split_k_mod.plan(k, STEP_K,
                            split_k_mod.within(_tiles(m, n), k // STEP_K, device, 1))


# Fewest 64-wide K steps a CTA takes for the kernel to pay where it splits K, by who sums the
# partials (OCTAVO_INT_LARGE_SPLIT_SUM). Each tile's last CTA summing its 256-512 KB of
# partials alone cost about what a split's share of the MMAs saves on short splits: measured
# on an H100 (session 55, call 2; large_int_gemm.py, Llama-8B layers at 256 rows, us, this
# kernel against the whole weight dequantized then cuBLAS) gate_up (no split, 64 steps)
# 145.2 / 212.2, down (4 splits of 56) 102.1 / 115.5, qkv (2 of 32) 67.7 / 50.3, o (4 of 16)
# 57.1 / 33.4. A second launch over every SM sums them in 8-10 us, and every split layer
# pays (session 57, same shapes): down 68.2 / 115.3, qkv 43.3 / 49.9, o 29.0 / 33.1; at 128
# rows against the swap-AB GEMM down 41.1 / 60.2, qkv 26.2 / 39.7, o 21.8 / 27.2.
MIN_STEPS_SPLIT = {"cta": 48, "launch": 1}


def worth(m: int, n: int, k: int, device: torch.device) -> bool:
    """Whether the kernel beats the engine's other path on this layer (up to 256 rows, where
    it was measured): where its tiles fill the SMs or the batch fits one row of tiles (the
    swap-AB GEMM's time grows with the rows, this kernel's hardly: gate_up at 128 rows, 112
    tiles, 75.3 against 107.0 us), or it splits K and each split takes at least
    MIN_STEPS_SPLIT steps for the split sum in use (OCTAVO_INT_LARGE_MIN_SPLIT_STEPS).
    (Tiles that leave SMs idle unsplit past one row of tiles lose to dequantize-then-cuBLAS:
    qkv at 384 rows, 72 tiles, 69.1 against 54.7 us.)"""
    splits, per = plan(m, n, k, device)
    if splits == 1:
        return m <= BATCH or _tiles(m, n) >= num_compute_units(device)
    line = MIN_STEPS_SPLIT[envs.int_large_split_sum()]
    return per // STEP_K >= envs.int_large_min_split_steps(line)


def swapab_wgmma(x2: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                 zeros: torch.Tensor, group_size: int, bits: int, split_k: int | None = None,
                 bf16_math: bool | None = None, deep: bool | None = None,
                 split_sum: str | None = None) -> torch.Tensor:
    """``x2 [M, K] @ dequant(W) [K, N]`` (in x2's dtype: bf16, or fp16 with fp16 scales) for
    ``bits``-bit ``qweight`` (4 or 8) in ``pack_swapab``'s layout (int16 [N / (16 / bits), K]),
    ``scales`` / ``zeros`` [K / group, N] in bf16 or fp16. ``split_k``: K splits (default ``plan``'s);
    ``bf16_math``: dequantize in packed pairs of x2's dtype, bf16x2 or half2 (default
    OCTAVO_INT_LARGE_BF16_MATH, on: scales of another dtype are rounded to x2's first);
    ``deep``: two MMA groups in flight (OCTAVO_INT_LARGE_DEEP);
    ``split_sum``: where K is split, who sums the partials (OCTAVO_INT_LARGE_SPLIT_SUM):
    ``"cta"`` each tile's last CTA, ``"launch"`` a second launch over every SM
    (``split_sum.sum_splits``). The same bits either way."""
    m, k = x2.shape
    n = qweight.shape[0] * (16 // bits) if bits in (4, 8) else 0
    if not supports(k, n, group_size, bits, x2.dtype, scales.dtype):
        raise ValueError(f"swapab_wgmma cannot run {bits}-bit K={k}, N={n}, group "
                         f"{group_size}, {x2.dtype} activations, {scales.dtype} scales")
    mode = envs.int_large_split_sum() if split_sum is None else split_sum
    if mode not in SPLIT_SUMS:
        raise ValueError(f"split_sum must be one of {SPLIT_SUMS}, got {mode!r}")
    assert qweight.dtype == torch.int16 and qweight.shape[1] == k, (qweight.shape, k)
    assert scales.shape == zeros.shape == (k // group_size, n), (scales.shape, zeros.shape)
    if m == 0 or k == 0 or n == 0:
        return torch.zeros(m, n, device=x2.device, dtype=x2.dtype)
    mod = cuda_module.loaded(SOURCE, x2.device)
    x2 = cuda_module.aligned_rows(x2)
    # 16-byte copies of the packed rows, the scales and the zeros.
    qweight, scales = cuda_module.aligned(qweight), cuda_module.aligned(scales)
    zeros = cuda_module.aligned(zeros.to(scales.dtype))
    splits, k_per_split = plan(m, n, k, x2.device) if split_k is None \
        else split_k_mod.plan(k, STEP_K, split_k)
    out, partial = split_k_mod.buffers(m, n, splits, x2)
    grid = (n // COLUMNS, -(-m // BATCH), splits)
    prefix = "swapab_wgmma" if bits == 4 else "swapab_wgmma8"
    if x2.dtype == torch.float16:
        name, packed = f"{prefix}_f16_act", "_half_math"
    else:
        name = f"{prefix}_bf16_scales" if scales.dtype == torch.bfloat16 \
            else f"{prefix}_f16_scales"
        packed = "_bf16_math"
    if bf16_math is None:
        bf16_math = envs.int_large_bf16_math()
    if bf16_math:
        name += packed
    if envs.int_large_deep() if deep is None else deep:
        name += "_deep"
    counters = split_k_mod.counters(x2.device, grid[0] * grid[1]) \
        if mode == "cta" and splits > 1 else None
    args = cuda_module.arguments(x2, qweight, scales, zeros, out, partial, counters, m, k, n,
                                 group_size, x2.stride(0), out.stride(0), splits, k_per_split)
    mod.launch(name, grid, THREADS, args, shared_bytes=shared_bytes(bits))
    return sum_splits(partial, out) if mode == "launch" and splits > 1 else out
