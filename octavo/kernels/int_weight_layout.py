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
batch 1 in the engine 6.7 ms against 3.9). With the CUDA kernel (H100, session 61, Llama-8B
W8A16 g128, every layer swap-AB against this rule, ms per token) batch 1 3.618 / 3.734 and 16
4.457 / 6.052 won, but batch 64 10.191 / 6.935 and W2 6,395 / 6,541 tok/s lost: the Triton
swap-AB GEMM past 16 rows converted each bf16 8-bit weight by a quarter-rate I2F (now the
LOP3 form since b2f1243: H100, session 62, every layer swap-AB against the GEMV layout, batch
24 / 32 5.178 / 5.267 against 6.026 / 6.123 ms, but 48 / 64 / 128 7.888 / 8.636 / 12.695
against 6.607 / 6.934 / 11.328). With 8-bit batches past 32 rows routed per layer
(``CHUNKED_8BIT_MAX_M``, ``WIDE_8BIT_TILES``) the layout wins or ties at every batch (H100,
session 63, Llama-8B W8A16 g128 at max_num_seqs 256, every layer swap-AB against the GEMV
layout, one call, ms per token): batch 1 3.509 / 3.807, 16 4.542 / 6.044, 48 6.711 / 6.645,
64 6.970 / 6.972, 128 10.770 / 11.364, 256 17.378 / 18.826, W2 6,851 / 6,503 tok/s. So on
Hopper 8-bit layers of at least ``SWAPAB_MIN_WEIGHTS`` values take the swap-AB layout where
the CUDA kernel runs (per-channel ones keep ``rows``, below).

- ``rows`` (``octavo.kernels.int8_gemv``, 8-bit only): uint8 [N, K], the float8 weights'
  layout. One or two rows run the FP8 GEMV's kernel in its 8-bit integer mode (with its fused
  gate/up activation and qkv rotary stores, ``gated`` / ``qkv_rope``); larger batches run the
  tensor-core GEMM of ``int8_rows_gemm`` (up to 128 rows) and dequantize-then-cuBLAS (the
  along-K dequantizer on the same bytes through strides, ``int8_gemv.as_along_k``).
  On CUDA the 8-bit layers whose groups let the GEMV run the FP8 GEMV's full K steps take
  it (one group per row: compressed-tensors' channel strategy, GPTQ group -1;
  ``int8_gemv.runs_full_steps``), measured on an H200 (session 33, Llama-3.1-8B W8A16 per
  channel, ms per token): batch 1 2.939 against the along-K layout's 3.056, batch 16 4.808
  against 5.758; larger batches lose (session 34: batch 64 6.974 against 6.527, 256 15.775
  against 15.350), a trade kept for decode latency. At g128 the rows layout (128-wide K
  steps at about 4 programs per SM) ties the along-K one at batch 1 and loses at 64 and 256
  (session 34, Llama-3.1-8B W8A16 g128 with gate/up along K, ms per token at 1 / 16 / 64 /
  256: rows 3.111 / 5.622 / 7.850 / 15.688, along K 3.116 / 5.989 / 7.490 / 15.442), so
  those layers stay along K;
  ``OCTAVO_INT_WEIGHT_LAYOUT=rows`` forces rows wherever the GEMV runs.

Since session 51 the small 4-bit projections of at least ``SWAPAB_MIN_WEIGHTS`` values (Llama-8B's
qkv and o) take the swap-AB layout too where the CUDA kernel runs, with that kernel to 16 rows
and in 16-row chunks of one launch to ``CHUNKED_MAX_M``; past 16 rows the Triton swap-AB GEMM
aims at two programs per SM. Llama-3.1-8B W4A16 on an H100 (session 51, ms per token at batch
1 / 16 / 32 / 64 / 128, one call): the size rule alone 2.625 / 4.137 / 5.372 / 7.504 / 10.693;
every layer swap-AB with the CUDA kernel to 16 rows on qkv / o 2.516 / 3.870 / 6.198 / 8.386 /
11.064, and with the chunks to 128 rows 2.520 / 3.892 / 4.980 / 7.476 / 11.174.

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
from octavo.kernels import int8_gemv, int8_rows_gemm, swapab_large, swapab_mma, swapab_wgmma
from octavo.kernels import w4a16_gemm as along_k
from octavo.kernels import w4a16_swapab as swapab

ALONG_K = "along_k"
SWAPAB = "swapab"
ROWS = "rows"
SWAPAB_MIN_WEIGHTS = 1 << 24  # K * N; every Llama-8B projection (o: 4096 x 4096 = 2**24)
SMALL_WEIGHTS = 1 << 25  # K * N under it: a "small" layer (Llama-8B's qkv 25M and o 17M)
# A small layer's batches past the CUDA kernel's one CTA (16 rows), up to this many, run
# that kernel in 16-row chunks of one launch (OCTAVO_SWAPAB_CUDA_CHUNKED_MAX_M).
CHUNKED_MAX_M = 64
SWAPAB_BITS = 4  # the bits the size rule sends to the swap-AB layout (OCTAVO_INT_SWAPAB_8BIT: +8)
SWAPAB_MAX_M = 128  # larger batches dequantize into a temporary and use cuBLAS
# ... unless at most LARGE_MAX_M rows: the large-batch GEMMs with the dequantization in their
# loop, on Hopper: swapab_wgmma (CUDA, OCTAVO_INT_LARGE_CUDA, from LARGE_MIN_M rows on the
# layers ``swapab_wgmma.worth`` takes; measured in the engine, H100, session 57; 8-bit layers
# since session 64, OCTAVO_INT_LARGE_CUDA_8BIT: at 48 / 64 rows it ties the 8-bit swap-AB
# GEMMs, one Llama-8B layer 153.9 / 156.3 against 154.1 / 157.3 us), else swapab_large
# (Triton, on the layers whose tiles fill the SMs; session 55).
# The fewest rows the CUDA large-batch kernel takes (OCTAVO_INT_LARGE_MIN_M). Its time hardly
# depends on the rows under its 128-row tile; the swap-AB GEMM's grows with its 32-row tiles.
# One Llama-8B layer's four GEMMs on an H100 (session 57, call 2; us, swap-AB / this kernel
# in bf16x2 with the launch sum): 64 rows (2 tiles) 138.1 / 139.4, 80 and 96 (3) 202.9 /
# 141.4 and 203.3 / 141.6, 112 and 128 (4) 229.5 / 145.7 and 231.3 / 149.9; W4A16 batch
# 128 10.347 -> 8.819 ms, W2 7,567 -> 7,644 tok/s from 80 rows.
LARGE_MIN_M = 65
LARGE_MAX_M = 256
# 8-bit small layers (qkv, o) run the CUDA kernel's 16-row chunks to this many rows only, then
# the Triton swap-AB GEMM. H100, session 63 (quantized_gemm.py --bits 8 --paths swapab layout,
# Llama-8B g128, us, chunks / Triton): qkv at 48 / 64 rows 44.1 / 26.0 and 52.7 / 27.3, o
# 24.0 / 20.7 and 31.6 / 21.7; at 32 rows qkv 27.3 / 25.3, o 16.4 / 22.3. (4-bit chunks win
# to 64: CHUNKED_MAX_M.)
CHUNKED_8BIT_MAX_M = 32
# Past this many rows, an 8-bit layer whose 128-column tiles fill the SMs (gate_up) runs the
# Triton swap-AB GEMM in 64-row batch tiles with 3 stages: one weight tile dequantized for
# twice the rows. H100, session 63 (quantized_gemm.py --sweep --swapab-only --bits 8, Llama-8B
# gate_up g128, us): 75.3 at 48 rows and 110.4 at 128 against 87.5 / 167.7 at the 32-row
# tiles (the GEMV layout's kernel: 65.5 / 125.1); down (32 tiles) kept its tiles, best there.
SWAPAB_8BIT_WIDE_MIN_M = 32
WIDE_8BIT_TILES = {"block_m": 64, "num_stages": 3}


def choose(k: int, n: int, group_size: int, bits: int, device: torch.device) -> str:
    """The layout for a [K, N] integer weight on ``device`` (``OCTAVO_INT_WEIGHT_LAYOUT``
    overrides the size and bits rule, not what the kernel can hold)."""
    if device.type != "cuda":
        return ALONG_K
    mode = envs.int_weight_layout()
    # 8-bit: rows where the groups allow the GEMV's full K steps (one group per row), unless
    # OCTAVO_INT_SWAPAB_8BIT asks for the size rule below; "rows": wherever it runs.
    if bits == 8 and int8_gemv.supports(1, k, group_size) and (
            mode == ROWS or (mode == "auto" and not envs.int_swapab_8bit()
                             and int8_gemv.runs_full_steps(n, k, group_size))):
        return ROWS
    if not swapab.supports(k, n, group_size, bits):
        return ALONG_K
    if mode != "auto":
        return ALONG_K if mode == ROWS else mode
    hopper = torch.version.hip is None and torch.cuda.get_device_capability(device)[0] >= 9
    if not hopper:
        return ALONG_K
    if bits == SWAPAB_BITS or (bits == 8 and envs.int_swapab_8bit()):
        # A small layer gains from the layout only through the CUDA kernel (at one row the
        # Triton swap-AB GEMM lost to the GEMV: qkv 15.3 against 11.1 us on an H200).
        if k * n >= SMALL_WEIGHTS or (k * n >= SWAPAB_MIN_WEIGHTS and bits == SWAPAB_BITS
                                      and swapab_mma.available(device)):
            return SWAPAB
    # 8-bit weights of at least SWAPAB_MIN_WEIGHTS values where the CUDA kernel runs (the
    # module docstring: session 63).
    if bits == 8 and k * n >= SWAPAB_MIN_WEIGHTS and swapab_mma.available(device):
        return SWAPAB
    return ALONG_K


def pack(q: torch.Tensor, bits: int, layout: str) -> torch.Tensor:
    """Integer values [K, N] in ``layout``."""
    if layout == ROWS:
        return int8_gemv.pack_rows(q)
    return swapab.pack_swapab(q, bits) if layout == SWAPAB else along_k.pack_along_k(q, bits)


def linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
           group_size: int, bits: int, layout: str, zero: float | None = None) -> torch.Tensor:
    """``x [.., K] @ dequant(W) [K, N]`` in x's dtype, for a weight packed in ``layout``.
    ``zero``: the one zero point of every group where they are all equal (else None)."""
    if layout == ROWS:
        return along_k.over_rows(x, qweight.shape[0], lambda x2: _rows(
            x2, qweight, scales, zeros, group_size, zero))
    if layout != SWAPAB:
        return along_k.w4a16_gemm(x, qweight, scales, zeros, group_size, bits)
    return along_k.over_rows(x, qweight.shape[0] * (16 // bits), lambda x2: _swapab_rows(
        x2, qweight, scales, zeros, group_size, bits))


def _swapab_rows(x2: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                 zeros: torch.Tensor, group_size: int, bits: int) -> torch.Tensor:
    m, k = x2.shape
    n = qweight.shape[0] * (16 // bits)
    most = swapab_mma.max_rows()
    if k * n < SMALL_WEIGHTS:  # a small layer: the CUDA kernel to 16 rows, then in chunks
        most = min(swapab_mma.MAX_M, envs.cuda_kernels_small_max_m(swapab_mma.MAX_M))
        chunked = envs.swapab_cuda_chunked_max_m(CHUNKED_MAX_M)
    else:
        chunked = envs.swapab_cuda_chunked_large_max_m()
    chunked = min(chunked, swapab_mma.MAX_ROWS) if most == swapab_mma.MAX_M else 0
    if bits == 8:
        chunked = min(chunked, CHUNKED_8BIT_MAX_M)
    rows = min(m, swapab_mma.MAX_M)
    if (m <= most or m <= chunked) and swapab_mma.available(x2.device) and \
            swapab_mma.supports(rows, k, n, group_size, bits, x2.dtype):
        # (Past 16 rows, OCTAVO_SWAPAB_CUDA_CHUNKED_MAX_M: one launch of 16-row chunks, the
        # layer's weights read from L2 by the chunks after the first.)
        return swapab_mma.swapab_mma(x2, qweight, scales, zeros, group_size, bits,
                                     **swapab_mma.engine_plan(k, n, bits, m))
    # A CUDA wide-tile mma.sync kernel with the dequantization in registers (session 52,
    # removed in session 53) lost on an H100 at every batch: one Llama-8B layer at 64 / 128 /
    # 256 rows took 492 / 451 / 576 us at its default plan (best plans per layer: gate_up
    # 77.5 / 106.5 / 209.7 us against the engine's 55.4 / 105.8 / 201.7; down 67.5 / 94.1 /
    # 133.6 against 39.3 / 59.4 / 113.1), and W2 with it from 129 rows 6,506 against 6,938
    # tok/s; docs/benchmarks.md session 53.
    if envs.int_large_min_m(LARGE_MIN_M) <= m <= envs.int_large_max_m(LARGE_MAX_M) \
            and envs.int_large_cuda() and x2.device.type == "cuda" \
            and (bits == 4 or envs.int_large_cuda_8bit()) \
            and (x2.dtype == torch.bfloat16 or envs.int_large_f16()) \
            and swapab_wgmma.available(x2.device) \
            and swapab_wgmma.supports(k, n, group_size, bits, x2.dtype, scales.dtype) \
            and swapab_wgmma.worth(m, n, k, x2.device):
        # The warp-specialized CUDA kernel, on layers where it pays (``worth``), H100,
        # Llama-8B, us: at 256 rows (session 55) gate_up 145.2 against 212.2 for
        # dequantize-then-cuBLAS; with its partials summed by a second launch (session 57)
        # down 68.2 against 115.3, qkv 43.3 / 49.9, o 29.0 / 33.1. From LARGE_MIN_M rows.
        return swapab_wgmma.swapab_wgmma(x2, qweight, scales, zeros, group_size, bits)
    if m <= envs.int_swapab_max_m(SWAPAB_MAX_M):
        # Up to 16 rows: 16-row tiles on mma.sync with 8 programs' worth per SM (the sweep's
        # best on gate_up and down at 1 and 16 rows); more rows: one warpgroup's wgmma.
        # Batch tiles of 8 (130 registers, 1.8 SASS instructions per weight against 200 and
        # 2.1) measured slower at one row: gate_up 34.7 vs 30.4 us, down 23.5 vs 22.3, and
        # the engine's batch 1 3.62 vs 3.17 ms.
        # Past 16 rows two programs per SM (the K split's aim) against four: measured on an
        # H100 (session 51, quantized_gemm.py --sweep --paths swapab, us at 32 / 64 / 128
        # rows, waves 4 -> 2) qkv 34.7 -> 23.4 / 35.9 -> 26.8 / 42.2 -> 38.8, o 22.4 -> 22.6
        # / 32.4 -> 21.6 / 34.4 -> 26.6, gate_up 51.6 -> 41.5 / 72.7 -> 54.9 / 106.7 -> 105.0,
        # down 31.2 -> 31.0 / 52.0 -> 39.4 / 69.3 -> 60.1 (the best tile of the sweep or
        # within 2% of it everywhere but qkv at 32 rows, 22.1).
        tiles = {"block_r": 16, "waves": 8} if x2.shape[0] <= 16 else {"waves": 2}
        # (A 64-row int16 tile per SM: swapab_large's rule at one 64-column block per value.)
        if bits == 8 and m > SWAPAB_8BIT_WIDE_MIN_M and swapab_large.fills(n, x2.device,
                                                                           16 // bits):
            tiles = dict(WIDE_8BIT_TILES)
        return swapab.w4a16_swapab(x2, qweight, scales, zeros, group_size, bits, **tiles)
    if m <= envs.int_large_max_m(LARGE_MAX_M) and x2.device.type == "cuda":
        plan = envs.int_large_plan()
        if torch.cuda.get_device_capability(x2.device)[0] == 9 \
                and swapab_large.fills(n, x2.device, plan.get("cols", swapab_large.COLS)):
            # The Triton large-batch GEMM with the dequantization in its main loop, on layers
            # whose tiles fill the SMs (it does not split K): Llama-8B's gate_up, 186.9 us at
            # 256 rows against 212.0 here; in the engine (H100, session 55) W4A16 batch 256
            # 16.722 against 17.647 ms, W2 7,149 against 7,024 tok/s. Hopper only: where it
            # was measured (wgmma with A in registers).
            return swapab_large.swapab_large(x2, qweight, scales, zeros, group_size, bits,
                                             **plan)
    # Past SWAPAB_MAX_M rows: the whole weight dequantized, then cuBLAS. Overlapping the two in
    # column chunks (each chunk dequantized on a side stream while cuBLAS multiplies the one
    # before; session 53's dequant_overlap, removed in session 54) was no faster on an H100:
    # one Llama-8B gate_up at 256 rows 223.7-259.0 us against 215.5 whole (bf16 101.8), W4A16
    # batch 256 18.151-18.481 against 17.861 ms per token, W2 6,912-6,926 against 6,952 tok/s.
    # git show e9b307c has it back.
    return x2 @ swapab.dequantize_swapab(qweight, scales, zeros, group_size, bits, x2.dtype)


def _zero_arg(zeros: torch.Tensor, zero: float | None) -> torch.Tensor | float:
    """The rows kernels' zero points: the one number where every group has it, else the
    tensor."""
    return zeros if zero is None else zero


def _rows(x2: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
          group_size: int, zero: float | None) -> torch.Tensor:
    m, k = x2.shape
    if int8_gemv.supports(m, k, group_size):
        return int8_gemv.int8_gemv(x2, qweight, scales, _zero_arg(zeros, zero),
                                   group_size)
    if m <= envs.int_gemm_fused_max_m(along_k.FUSED_MAX_M) and int8_rows_gemm.supports(
            k, group_size):
        return int8_rows_gemm.int8_rows_gemm(x2, qweight, scales,
                                             _zero_arg(zeros, zero), group_size)
    w = along_k.dequantize(int8_gemv.as_along_k(qweight), scales, zeros, group_size, 8,
                           x2.dtype, rows_out=True)
    return x2 @ w


def _rows_input(x: torch.Tensor, group_size: int, layout: str,
                act_perm: torch.Tensor | None) -> torch.Tensor | None:
    """x as the rows GEMV's [M, K] input (act-order columns permuted), or None where the
    GEMV does not take this call."""
    x2 = x.reshape(-1, x.shape[-1])
    if layout != ROWS or not int8_gemv.supports(x2.shape[0], x2.shape[1], group_size):
        return None
    return x2 if act_perm is None else x2.index_select(-1, act_perm)


def gated(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
          group_size: int, layout: str, zero: float | None,
          act_perm: torch.Tensor | None = None) -> torch.Tensor | None:
    """``silu(gate) * up`` of an MLP's [gate | up] weight (N = 2I) from the GEMV's store, for a
    ``rows`` weight and a batch the GEMV takes; None otherwise."""
    x2 = _rows_input(x, group_size, layout, act_perm)
    if x2 is None:
        return None
    y = int8_gemv.int8_gemv(x2, qweight, scales, _zero_arg(zeros, zero), group_size,
                            glu=True)
    return y.view(*x.shape[:-1], y.shape[-1])


def has_qkv_rope(layout: str, k: int, n: int, group_size: int) -> bool:
    """Whether a [K, N] weight in ``layout`` has :func:`qkv_rope`'s rotating store: rows, on
    the FP8 GEMV's own K steps (``int8_gemv.int8_gemv_qkv_rope``)."""
    return layout == ROWS and int8_gemv.runs_full_steps(n, k, group_size)


def qkv_rope(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
             zeros: torch.Tensor, group_size: int, layout: str, zero: float | None,
             act_perm: torch.Tensor | None, positions: torch.Tensor,
             cos_sin_cache: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int,
             kv_store) -> torch.Tensor | None:
    """A qkv projection's rotated q with k and v written into the paged cache, from the
    GEMV's store (``int8_gemv.int8_gemv_qkv_rope``), for a ``rows`` weight and a batch the
    GEMV takes; None, with nothing done, otherwise."""
    x2 = _rows_input(x, group_size, layout, act_perm)
    if x2 is None:
        return None
    q = int8_gemv.int8_gemv_qkv_rope(x2, qweight, scales, _zero_arg(zeros, zero),
                                     group_size, positions.reshape(-1), cos_sin_cache,
                                     num_heads, num_kv_heads, head_dim, kv_store)
    return None if q is None else q.view(*x.shape[:-1], q.shape[-1])


# --- an MLP's [gate | up] weight with gate and up in turn (OCTAVO_SWAPAB_GLU) -------------

glu_blocked = swapab.glu_blocked

# The most rows the gated store takes by default (OCTAVO_SWAPAB_GLU_MAX_M): on an H100 it won
# at 1-8 rows and lost at 16 (session 60, Llama-8B W4A16, ms per token off / on: batch 1
# 2.494 / 2.442, batch 8 2.928 / 2.895, batch 16 3.360 / 3.394).
GLU_MAX_M = 8


def glu_block(k: int, n: int, group_size: int, bits: int) -> int | None:
    """The ``glu_blocked`` block of a swap-AB [gate | up] weight [K, N = 2I] whose batches of
    1-16 rows the CUDA kernel's gated store can take (``swapab_mma.supports_glu``); None
    where it cannot."""
    ok = swapab_mma.supports_glu(1, k, n, group_size, bits, torch.bfloat16)
    return swapab_mma.GLU_BLOCKS[bits] if ok else None


def glu_unblocked(y: torch.Tensor, block: int) -> torch.Tensor:
    """``y [..., N]`` in ``glu_blocked`` order back to [gate | up] (a copy)."""
    n = y.shape[-1]
    return y.unflatten(-1, (n // (2 * block), 2, block)).transpose(-3, -2).reshape(y.shape)


def gated_blocked(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                  zeros: torch.Tensor, group_size: int, bits: int, block: int) -> torch.Tensor:
    """``silu(gate) * up`` [..., N / 2] of a swap-AB weight in ``glu_blocked`` order: at
    1-8 rows (OCTAVO_SWAPAB_GLU_MAX_M) in the CUDA kernel's store (no launch of its own),
    else the projection as ``linear`` runs it, then the activation over the blocked
    columns."""
    from octavo.kernels.activation import silu_and_mul

    x2 = x.reshape(-1, x.shape[-1])
    m, k = x2.shape
    n = qweight.shape[0] * (16 // bits)
    most = min(swapab_mma.max_rows(), envs.swapab_glu_max_m(GLU_MAX_M))
    if m <= most and swapab_mma.available(x2.device) and \
            swapab_mma.supports_glu(m, k, n, group_size, bits, x2.dtype):
        y = swapab_mma.swapab_mma(x2, qweight, scales, zeros, group_size, bits, glu=True,
                                  **swapab_mma.engine_plan(k, n, bits, m, glu=True))
    else:
        y = silu_and_mul(linear(x2, qweight, scales, zeros, group_size, bits, SWAPAB), block)
    return y.view(*x.shape[:-1], n // 2)
