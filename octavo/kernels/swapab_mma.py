"""4- and 8-bit weight-only GEMM for decode batches of 1-16 rows in CUDA C++
(``octavo/kernels/cuda/swapab_mma.cu``) over ``w4a16_swapab``'s packed layout, the
tensor cores' ``mma.sync`` with the weights as the A operand.

Why a hand-written kernel: the Triton kernels for these batches stop at 33-45% of HBM (ncu,
docs/benchmarks.md session 12): the GEMV spends ~3.9 instructions per weight, the swap-AB
GEMM moves its tile through shared memory with 200 registers and two warps per scheduler.
Here each lane loads 16 bytes of its two weight rows straight into the registers the mma
takes (the K order inside a step is chosen to make that so; the activations are loaded in
the same order), one shift and one LOP3 turn a register of 4-bit pairs into a bf16 / fp16
pair, and one mma covers 256 weights (SASS: 2.0 instructions per 4-bit weight in the loop).
Every load (weights, activations, scales, zeros) is issued one chunk ahead. Zero points and
scales are applied per group on the accumulators (a second mma on a ones operand gives the
column sums of x). 8-bit weights run the same code with one operand per byte, value v of
the int16 being the 4-bit path's block v: fp16 1024 + q by one PRMT per register, bf16
q - 128 by two LOP3 and one bf16x2 FMA (bf16 cannot hold 256 consecutive integers in one
binade; SASS per 8-bit weight, 1-8 rows, 4-step chunks: fp16 2.77, bf16 4.02, against 4.24
when each nibble was its own mma product). The CTA's warps
split K and add up in shared memory; a tile split over several CTAs is finished by the CTA
that takes the last ticket (``octavo.kernels.split_k``'s counters).

A staged variant (``stages`` 3 or 4, 4-step chunks) copies each warp's chunks into a ring in
shared memory with ``cp.async`` instead (83 registers at 1-8 rows against 189): faster on the
layers of few tiles at 1-8 rows, the default there (``default_stages``, session 50).

Measured (H200, docs/benchmarks.md sessions 18-19): one Llama-3.1-8B layer's 4-bit GEMMs
55.4 us at one row against the Triton GEMV's 62.0, 92.9 at 16 rows against the swap-AB
GEMM's 100.1; in the engine batch 1 is 7% faster (2.80 against 3.01 ms per token) and 16
rows were slower until the split tiles' sums were fixed (session 51: faster, the engine sends
it batches of up to ``ENGINE_MAX_M`` = 16 rows; a small layer's larger ones in chunks).
"""

from __future__ import annotations

import torch

from octavo import envs
from octavo.kernels import cuda_module
from octavo.kernels import pdl as pdl_mod
from octavo.kernels.split_k import MAX_CTA_WARPS as MAX_WARPS
from octavo.kernels.split_k import WarpPlan, in_one_cta, over_warps
from octavo.kernels.split_k import buffers as split_k_buffers
from octavo.kernels.split_k import counters as split_k_counters
from octavo.kernels.triton_utils import num_compute_units

SOURCE = "swapab_mma.cu"
MAX_M = 16  # rows a CTA takes
MAX_ROWS = 128  # rows a launch takes, in 16-row chunks (a small layer's larger batches)
ROWS = 16  # int16 rows of the layout per warp tile: 64 output columns
_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16"}


def supports(m: int, k: int, n: int, group_size: int, bits: int, dtype: torch.dtype) -> bool:
    return (bits in (4, 8) and 1 <= m <= MAX_M and dtype in _DTYPES
            and n % (64 * 16 // bits) == 0 and group_size % 32 == 0 and k % group_size == 0)


# The launch plan, from ``benchmarks/quantized_gemm.py --cuda-sweep`` on an H200 (Llama-8B
# projections, 4-bit g128, 1 and 16 rows, 16 plans each; docs/benchmarks.md session 18):
# 6 warps per SM, chunks of 4 K steps, CTAs of up to 8 warps was the best or within 10% of it
# on 5 of the 8 (shape, M) pairs and the best sum at both batch sizes (one layer: 54.0 us at
# one row against the Triton GEMV's 61.5; 92.6 at 16 against the Triton swap-AB's 100.5),
# while filling the SM (10-16 warps) was up to 3.6x slower (qkv at 16 rows: 32.1 us).
WARPS_PER_SM = 6


def default_steps(group_size: int) -> int:
    return 4 if group_size % 128 == 0 else (2 if group_size % 64 == 0 else 1)


# A tile split over CTAs adds its partial sums through global memory and a ticket: on the
# H200 (docs/benchmarks.md session 22) K = N = 4,096 took 9.96 us split over two CTAs and
# 6.44 in one CTA of 8 warps (4 chunks each); but Llama-8B's down (K = 14,336) took 17.49
# split and 19.05 in one CTA, whose warps then walk 14 chunks each. So a tile stays in one
# CTA where that leaves each warp at most this many chunks.
ONE_CTA_MAX_CHUNKS = 8


def plan(k: int, n: int, group_size: int, sms: int, warps_per_sm: int = WARPS_PER_SM,
         steps: int | None = None, most_warps: int = MAX_WARPS, bits: int = 4,
         split_ctas: bool | None = None) -> WarpPlan:
    """Split K over warps so the grid holds about ``warps_per_sm`` warps per SM: each warp a
    whole number of chunks (inside one group), the warps of a tile in CTAs of at most
    ``most_warps``. A tile the plan would split over CTAs takes one CTA of ``most_warps``
    instead where the tiles still give every SM a warp and ``split_ctas`` is False, or (None)
    where that leaves each warp at most ``ONE_CTA_MAX_CHUNKS`` chunks."""
    if steps is None:
        steps = default_steps(group_size)
    tiles = n // (16 // bits * ROWS)
    p = over_warps(k, tiles, steps, sms, warps_per_sm, most_warps)
    if p.splits == 1 or split_ctas or tiles * most_warps < sms:
        return p
    whole = in_one_cta(k, steps, most_warps)
    if split_ctas is None and whole.k_per_warp > ONE_CTA_MAX_CHUNKS * whole.chunk:
        return p
    return whole


# The gated store's kernels (``glu``) run chunks of 4 K steps (groups of 128 and their
# multiples): 4- and 8-bit, the registers' pipeline, up to MAX_M rows a launch: Llama-8B's
# gate_up at 1-8 rows (``int_weight_layout.GLU_MAX_M``), whose activation then needs no
# launch of its own (8-bit, H100, session 61: W8A16 batch 1 in the swap-AB layout 3.643 ->
# 3.618 ms). A rotary store for the qkv projection (session 58, dfd6f0d) lost on an H100 and was
# removed in session 60: its qkv took 10.0 us a layer at one row against the plain store's
# 7.2, W4A16 batch 1 / 16 2.504 / 3.348 -> 2.519 / 3.565 ms.
GLU_STEPS = 4


def supports_glu(m: int, k: int, n: int, group_size: int, bits: int,
                 dtype: torch.dtype) -> bool:
    """Whether ``swapab_mma(glu=True)`` takes this call: an [gate | up] weight in
    ``w4a16_swapab.glu_blocked`` order (blocks of ``GLU_BLOCKS[bits]``) of 4- or 8-bit
    values."""
    return (bits in GLU_BLOCKS and 1 <= m <= MAX_M
            and supports(m, k, n, group_size, bits, dtype)
            and group_size % (32 * GLU_STEPS) == 0 and n % (2 * GLU_BLOCKS[bits]) == 0)


# Columns of gate, then as many of up, in turn along the [gate | up] weight's N (glu_blocked),
# per bits: the kernel's 256-column blocks of 4-bit values hold gate in values 0-1, up in
# values 2-3; its 128-column blocks of 8-bit values gate in value 0, up in value 1.
GLU_BLOCKS = {4: 128, 8: 64}


def available(device: torch.device) -> bool:
    """Whether the engine's integer layers use this kernel on ``device``: built (nvcc, an
    NVIDIA GPU) and not turned off (``OCTAVO_CUDA_KERNELS=0``)."""
    return envs.cuda_kernels() and cuda_module.module(SOURCE, device) is not None


# Rows the engine sends here. At 16 rows the kernel had lost in the engine (Llama-3.1-8B
# W4A16 batch 16: 4.298 ms per token against the Triton swap-AB GEMM's 3.911, session 19):
# the last CTA of a split tile summed its outputs one L2 round trip at a time. With the
# partials loaded at once (session 50) it won on an H100 (session 51, us at 16 rows, Triton
# swap-AB / this kernel): gate_up 43.7 / 28.3, down 25.5 / 17.6, one layer 107.9 / 64.0;
# the engine's batch 16 3.940 -> 3.424 ms per token.
ENGINE_MAX_M = 16


# Chunks in flight per warp through shared memory (cp.async; 0: the registers' one-chunk
# pipeline). Kernels with stages exist for 4-step chunks (groups of 128 and their multiples).
# Measured on an H100 (benchmarks/quantized_gemm.py --cuda-sweep --stages 0 3 4, Llama-8B
# 4-bit g128 projections, us, 6 warps per SM, stages 0 / 3): at one row qkv 7.65 / 7.16,
# o 6.45 / 6.09, down 18.07 / 17.10, but gate_up 25.11 / 31.35 (its 448 tiles already keep
# 74% of HBM busy); at 16 rows every shape lost (qkv 9.34 / 9.70, down 32.51 / 32.89).
# So by default 3 stages run at 1-8 rows on layers of at most STAGED_MAX_TILES tiles.
STAGED_STEPS = 4
STAGE_CHOICES = (0, 3, 4)
STAGED_MAX_TILES = 128  # 64-column tiles: N <= 8,192 at 4 bits (qkv, o, down; not gate_up)
STAGED_MAX_M = 8


def default_stages(m: int, n: int, bits: int) -> int:
    """The rule above: 3 stages for 1-8 rows on layers of few tiles, else 0."""
    tiles = n // (16 // bits * ROWS)
    return 3 if m <= STAGED_MAX_M and tiles <= STAGED_MAX_TILES else 0


# 8-bit gated launches (the MLP's gate_up, 1-8 rows) aim at GLU8_WARPS_PER_SM warps per SM:
# the registers' pipeline keeps one 4 KB chunk in flight per warp, and a 28,672-column 8-bit
# layer gets more bytes in flight from more warps. H100, session 62 (Llama-8B W8A16 g128 in
# the swap-AB layout, ms per token at batch 1 / 8, in one call): 3.608 / 3.886 at 6 warps,
# 3.434 / 3.743 at 16 (3.605 / 3.887 against 3.437 / 3.741 in another). With qkv at 16 as
# well (3.481 / 3.822) or down at 12 (3.568 / 3.874) it gained less; the plain store at 16
# rows lost at 16 warps (4.446 -> 4.781 ms at batch 16, with o at 12 warps); 4-bit gate_up's
# sweep found 6 best (session 61).
GLU8_WARPS_PER_SM = 16
GLU8_MAX_M = 8


def engine_plan(k: int | None = None, n: int | None = None, bits: int | None = None,
                m: int | None = None, glu: bool = False) -> dict:
    """The engine's launch arguments for ``m`` rows (``glu``: the gated store): the plan's
    warps per SM (``OCTAVO_SWAPAB_WARPS_PER_SM``, else ``WARPS_PER_SM``, or
    ``GLU8_WARPS_PER_SM`` for an 8-bit gated launch of at most ``GLU8_MAX_M`` rows), whether
    it splits tiles over CTAs
    (``OCTAVO_SWAPAB_SPLIT_CTAS``: 1 where the plan asks, 0 never where the tiles fill the
    SMs; unset: ``plan``'s rule) and the chunks in flight (``OCTAVO_SWAPAB_STAGES``); for a
    [K, N] weight of ``bits`` named in ``OCTAVO_SWAPAB_LAYER_PLAN``, that entry's warps per
    SM and stages instead."""
    gated8 = glu and bits == 8 and m is not None and m <= GLU8_MAX_M
    out = {"warps_per_sm": envs.swapab_warps_per_sm(GLU8_WARPS_PER_SM if gated8
                                                    else WARPS_PER_SM),
           "split_ctas": envs.swapab_split_ctas(), "stages": envs.swapab_stages()}
    layer = envs.swapab_layer_plans().get((k, n, bits)) if k is not None else None
    if layer is not None:
        out["warps_per_sm"] = layer[0]
        if layer[1] is not None:
            out["stages"] = layer[1]
    return out


def stage_bytes(m: int, steps: int, bits: int) -> int:
    """Shared memory of one warp's stage: weights (2 x 16 bytes a lane a step), activations
    (16 bytes a lane a step per 8 batch rows), the tile's scales and zeros (4 x 16 bytes a
    4-bit value column block) -- swapab_mma.cu's STAGE, in bytes."""
    batch_tiles = 1 if m <= 8 else 2
    return 16 * (steps * 64 + batch_tiles * steps * 32 + 4 * (16 // bits))


def staged_warps(m: int, steps: int, bits: int, stages: int, most_warps: int,
                 shared_limit: int) -> int:
    """The most warps a CTA may have where each holds ``stages`` stages within
    ``shared_limit`` bytes (at least one)."""
    return max(1, min(most_warps, shared_limit // (stages * stage_bytes(m, steps, bits))))


def max_rows() -> int:
    """The largest batch the engine sends here (``OCTAVO_CUDA_KERNELS_MAX_M``, at most 16)."""
    return min(MAX_M, envs.cuda_kernels_max_m(ENGINE_MAX_M))


def swapab_mma(x2: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
               zeros: torch.Tensor, group_size: int, bits: int = 4,
               warps_per_sm: int = WARPS_PER_SM,
               steps: int | None = None, most_warps: int = MAX_WARPS,
               split_ctas: bool | None = None, stages: int | None = None,
               out: torch.Tensor | None = None, glu: bool = False) -> torch.Tensor:
    """``x2 [M, K] @ dequant(W) [K, N]`` (M <= 16; up to ``MAX_ROWS`` in 16-row chunks of
    one launch) for ``qweight`` in ``pack_swapab``'s
    4- or 8-bit layout, scales and (float) zeros
    [K / group, N] in bf16 or fp16 (either, whatever x2's dtype). ``stages``: chunks in
    flight per warp through shared memory (3 or 4, with 4-step chunks; 0 the registers'
    pipeline; None ``default_stages``). ``out``: an [M, N] tensor of contiguous rows to write
    (rows of a larger batch's output), else a new one. The tuning arguments exist for the
    benchmarks. ``glu``: the weight is an MLP's [gate | up] in ``glu_blocked`` order and the
    output is silu(gate) * up, [M, N / 2] (``supports_glu``)."""
    m, k = x2.shape
    n = qweight.shape[0] * (16 // bits)
    if not (m <= MAX_ROWS and supports(min(m, MAX_M), k, n, group_size, bits, x2.dtype)):
        raise ValueError(f"swapab_mma: M={m}, K={k}, N={n}, group {group_size}, {bits}-bit, "
                         f"{x2.dtype} is not a supported shape")
    if glu and not supports_glu(m, k, n, group_size, bits, x2.dtype):
        raise ValueError(f"swapab_mma: no gated store for M={m}, K={k}, N={n}, group "
                         f"{group_size}, {bits}-bit")
    chunks = -(-m // MAX_M)  # past 16 rows: 16-row chunks, a tile's side by side on grid x
    # The kernel reads 16-bit scales and zeros of one dtype as stored (GPTQ's float16 under
    # a bf16 model included): anything else is converted here, per call.
    if scales.dtype not in _DTYPES:
        scales = scales.to(x2.dtype)
    if zeros.dtype != scales.dtype:
        zeros = zeros.to(scales.dtype)
    scales, zeros, qweight = scales.contiguous(), zeros.contiguous(), qweight.contiguous()
    x2 = cuda_module.aligned_rows(x2)
    mod = cuda_module.loaded(SOURCE, x2.device)
    steps = steps or default_steps(group_size)
    if stages is None:
        stages = default_stages(m, n, bits)
    if stages not in STAGE_CHOICES:
        raise ValueError(f"swapab_mma: stages must be one of {STAGE_CHOICES}, got {stages}")
    if steps != STAGED_STEPS or any(t.data_ptr() % 16 for t in (scales, zeros, qweight)):
        stages = 0  # the copies take 16-byte pieces of the tile's scales and zeros
    if glu:
        steps, stages = GLU_STEPS, 0  # the gated store's kernels
    name = (f"swapab_mma_{_DTYPES[x2.dtype]}_{_DTYPES[scales.dtype]}_w{bits}"
            f"_m{8 if m <= 8 else 16}_s{steps}" + (f"_p{stages}" if stages else "")
            + ("_glu" if glu else ""))
    if stages:
        most_warps = staged_warps(m, steps, bits, stages, most_warps,
                                  _shared_limit(x2.device))
    p = plan(k, n, group_size, num_compute_units(x2.device), warps_per_sm, steps, most_warps,
             bits, split_ctas)
    tiles = qweight.shape[0] // ROWS
    out_n = n // 2 if glu else n
    if out is None:
        out, partial = split_k_buffers(m, n, p.splits, x2, out_n)
    else:
        assert out.shape == (m, out_n) and out.dtype == x2.dtype and out.stride() == (
            out_n, 1), (out.shape, out.stride())
        partial = out.unsqueeze(0) if p.splits == 1 else split_k_buffers(m, n, p.splits, x2)[1]
    cnt = split_k_counters(x2.device, tiles * chunks)
    args = cuda_module.arguments(x2, qweight, scales, zeros, out, partial, cnt, m, n, k,
                                 x2.stride(0), p.k_per_warp, group_size)
    shared = p.warps * stages * stage_bytes(m, steps, bits)
    mod.launch(name, (tiles * chunks, p.splits, 1), 32 * p.warps, args,
               pdl=pdl_mod.enabled(x2.device), shared_bytes=shared)
    return out


_SHARED_LIMITS: dict[torch.device, int] = {}


def _shared_limit(device: torch.device) -> int:
    """The dynamic shared memory a CTA may take on ``device`` (sm_90: 227 KiB)."""
    if device not in _SHARED_LIMITS:
        props = torch.cuda.get_device_properties(device)
        limit = getattr(props, "shared_memory_per_block_optin", None)
        _SHARED_LIMITS[device] = int(limit) if limit else cuda_module.shared_optin(device)
    return _SHARED_LIMITS[device]
