"""Weight-only integer linear switches (GPTQ / AWQ / compressed-tensors layouts, the
swap-AB CUDA kernel, the integer GEMV and GEMM) and bitsandbytes 4-bit ones."""

from __future__ import annotations

import os

from octavo.envs._parse import _batch_size, _flag, _int


def swapab_warps_per_sm(default: int) -> int:
    """OCTAVO_SWAPAB_WARPS_PER_SM: the warps per SM the CUDA integer kernel's launch plan aims
    for (octavo/kernels/swapab_mma.py)."""
    return max(1, _int("OCTAVO_SWAPAB_WARPS_PER_SM", default, "warps per SM"))


def swapab_stages() -> int | None:
    """OCTAVO_SWAPAB_STAGES (0, 3 or 4): the chunks in flight per warp of the CUDA integer
    kernel through shared memory (cp.async) on every layer; 0 keeps its registers' one-chunk
    pipeline; unset (None), the kernel's own rule by shape (octavo/kernels/swapab_mma.py)."""
    if not os.environ.get("OCTAVO_SWAPAB_STAGES", "").strip():
        return None
    out = _int("OCTAVO_SWAPAB_STAGES", 0, "0, 3 or 4")
    if out not in (0, 3, 4):
        raise ValueError(f"OCTAVO_SWAPAB_STAGES must be 0, 3 or 4, got {out}")
    return out


def swapab_layer_plans() -> dict[tuple[int, int, int], tuple[int, int | None]]:
    """OCTAVO_SWAPAB_LAYER_PLAN="K,N,BITS=WARPS[/STAGES];...": per weight shape (K, N, bits),
    the warps per SM and, optionally, the chunks in flight (0, 3 or 4) of the CUDA integer
    kernel's launches, over OCTAVO_SWAPAB_WARPS_PER_SM / OCTAVO_SWAPAB_STAGES; for measuring
    per-layer plans in the engine (octavo/kernels/swapab_mma.py). Unset: {}."""
    text = os.environ.get("OCTAVO_SWAPAB_LAYER_PLAN", "").strip()
    plans: dict[tuple[int, int, int], tuple[int, int | None]] = {}
    for entry in filter(None, (e.strip() for e in text.split(";"))):
        try:
            shape, plan = entry.split("=")
            k, n, bits = (int(v) for v in shape.split(","))
            warps, _, stages = plan.partition("/")
            warps_i, stages_i = int(warps), (int(stages) if stages.strip() else None)
        except ValueError:
            raise ValueError(f"OCTAVO_SWAPAB_LAYER_PLAN: {entry!r} is not K,N,BITS=WARPS[/STAGES]"
                             ) from None
        if warps_i < 1 or stages_i not in (None, 0, 3, 4) or bits not in (4, 8):
            raise ValueError(f"OCTAVO_SWAPAB_LAYER_PLAN: {entry!r} needs WARPS >= 1, STAGES "
                             f"0, 3 or 4 and BITS 4 or 8")
        plans[(k, n, bits)] = (warps_i, stages_i)
    return plans


def swapab_split_ctas() -> bool | None:
    """OCTAVO_SWAPAB_SPLIT_CTAS: 1, the CUDA integer kernel splits a tile's K over CTAs
    wherever its plan asks; 0, never where the tiles fill the SMs; unset (None), the plan's
    own rule (octavo/kernels/swapab_mma.py)."""
    value = os.environ.get("OCTAVO_SWAPAB_SPLIT_CTAS", "").strip()
    return _flag("OCTAVO_SWAPAB_SPLIT_CTAS", True) if value else None


def gemv_prefetch(default: int) -> int:
    """OCTAVO_GEMV_PREFETCH (1, 2 or 3): how many steps ahead the integer GEMV
    (octavo/kernels/w4a16_gemv.py) loads its weights, for 4- and 8-bit alike (default: its
    per-bits choice)."""
    out = _int("OCTAVO_GEMV_PREFETCH", default, "1, 2 or 3")
    if out not in (1, 2, 3):
        raise ValueError(f"OCTAVO_GEMV_PREFETCH must be 1, 2 or 3, got {out}")
    return out


def int_gemm_fused_max_m(default: int) -> int:
    """OCTAVO_INT_GEMM_FUSED_MAX_M: the largest batch the weight-only integer GEMM runs with
    its fused tensor-core kernel; larger batches dequantize the weight into a temporary and
    use cuBLAS (octavo/kernels/w4a16_gemm.py sets the default from H200 measurements)."""
    return _batch_size("OCTAVO_INT_GEMM_FUSED_MAX_M", default)


def int_gemm_sz_ahead() -> bool:
    """OCTAVO_INT_GEMM_SZ_AHEAD (default on; 0 turns it off): the along-K weight-only
    tensor-core GEMM (octavo/kernels/w4a16_gemm.py, 3-128 rows) loads each K step's scales
    and zero points a step ahead instead of on the step's critical path. H200, Llama-8B shape
    (session 36): W8A16 g128 batch 64 7.470 -> 6.547 ms a token, batch 16 5.984 -> 5.795;
    W4A16 g128 batch 16 / 64 3.771 / 7.072 -> 3.796 / 7.002 (within the runs' spread)."""
    return _flag("OCTAVO_INT_GEMM_SZ_AHEAD", True)


def int_swapab_max_m(default: int) -> int:
    """OCTAVO_INT_SWAPAB_MAX_M: the same for a layer in the swap-AB layout: the largest batch
    its GEMM runs (octavo/kernels/int_weight_layout.py)."""
    return _batch_size("OCTAVO_INT_SWAPAB_MAX_M", default)


def int_large_max_m(default: int) -> int:
    """OCTAVO_INT_LARGE_MAX_M (default 256): the largest batch a 4- or 8-bit layer in the
    swap-AB layout runs on a large-batch GEMM with the dequantization in its main loop
    (octavo/kernels/swapab_large.py, or swapab_wgmma.py with OCTAVO_INT_LARGE_CUDA) once past
    the swap-AB GEMM's rows, on the layers those take; larger batches (and every batch while
    it is 0) dequantize the weight into a temporary and use cuBLAS."""
    return _batch_size("OCTAVO_INT_LARGE_MAX_M", default)


def int_large_cuda() -> bool:
    """OCTAVO_INT_LARGE_CUDA (default on; 0 turns it off): from OCTAVO_INT_LARGE_MIN_M to
    OCTAVO_INT_LARGE_MAX_M rows, 4-bit layers with bf16 activations run the warp-specialized
    CUDA kernel (octavo/kernels/swapab_wgmma.py, sm_90 only; it splits K where its tiles leave
    SMs idle) where ``swapab_wgmma.worth`` says it pays, instead of the Triton ones. H100,
    Llama-8B W4A16 (session 57): batch 256 16.743 -> 14.485 ms, W2 7,161 -> 7,567 tok/s."""
    return _flag("OCTAVO_INT_LARGE_CUDA", True)


def int_large_cuda_8bit() -> bool:
    """OCTAVO_INT_LARGE_CUDA_8BIT (default on; 0 turns it off): 8-bit layers in the swap-AB
    layout take the CUDA large-batch kernel too (its 8-bit form,
    octavo/kernels/swapab_wgmma.py) where OCTAVO_INT_LARGE_CUDA sends 4-bit ones; off, they
    keep the Triton swap-AB GEMM to 128 rows, then the Triton large-batch GEMM on the layers
    whose tiles fill the SMs and dequantize-then-cuBLAS on the others. H100, Llama-8B W8A16
    g128 (session 64, one call, off -> on): batch 128 10.739 -> 8.938 ms, 256 17.243 ->
    14.483, W2 6,915 -> 7,651 tok/s (0.82x -> 0.90x bf16)."""
    return _flag("OCTAVO_INT_LARGE_CUDA_8BIT", True)


def int_large_min_m(default: int) -> int:
    """OCTAVO_INT_LARGE_MIN_M (default 65, ``int_weight_layout.LARGE_MIN_M``): the fewest
    batch rows a 4-bit layer in the swap-AB layout runs the CUDA large-batch kernel
    (OCTAVO_INT_LARGE_CUDA) at; below it, the swap-AB GEMMs. The kernel's time hardly depends
    on the rows up to its 128-row tile (its dequantization is per weight), while the swap-AB
    GEMM's grows with them."""
    return _batch_size("OCTAVO_INT_LARGE_MIN_M", default)


def int_large_f16() -> bool:
    """OCTAVO_INT_LARGE_F16 (default on; 0 turns it off): float16 models (AutoAWQ's and
    AutoGPTQ's checkpoints) take the CUDA large-batch kernel too, in its fp16 form (fp16
    activations and scales; octavo/kernels/swapab_wgmma.py), where bf16 models take it. H100,
    Llama-8B W4A16 float16 (session 60): batch 128 / 256 10.496 / 16.882 -> 8.213 / 13.472 ms,
    W2 7,084 -> 7,953 tok/s (0.85x -> 0.95x bf16)."""
    return _flag("OCTAVO_INT_LARGE_F16", True)


def int_large_bf16_math() -> bool:
    """OCTAVO_INT_LARGE_BF16_MATH (default on; 0 turns it off): the CUDA large-batch kernel
    dequantizes in packed pairs of the activations' dtype, bf16x2 or half2
    (octavo/kernels/swapab_wgmma.py: about half the instructions) instead of float32. GPTQ's
    and AWQ's fp16 scales under bf16 activations are rounded to bf16 first, as vLLM's Marlin
    path holds them in the model's dtype. H100, Llama-8B W4A16 (session 60), float math ->
    bf16x2: batch 128 / 256 8.751 / 14.274 -> 8.280 / 13.360 ms, W2 7,810 -> 8,016 tok/s."""
    return _flag("OCTAVO_INT_LARGE_BF16_MATH", True)


def int_large_deep() -> bool:
    """OCTAVO_INT_LARGE_DEEP (default on; 0 turns it off): the CUDA large-batch kernel keeps two
    MMA groups in flight (four A register sets) instead of one while it dequantizes the next
    K16."""
    return _flag("OCTAVO_INT_LARGE_DEEP", True)


def int_large_split_sum() -> str:
    """OCTAVO_INT_LARGE_SPLIT_SUM (cta or launch; default launch): where the CUDA large-batch
    kernel splits K (octavo/kernels/swapab_wgmma.py), who sums the float32 partials: each
    tile's last CTA (``cta``) or a second launch over every SM (``launch``,
    octavo/kernels/split_sum.py). The same bits either way. H100, Llama-8B layers at 256 rows
    (session 57), us with the last CTA's sum / a second launch: down 102.0 / 68.2, qkv 61.2 /
    43.3, o 53.6 / 29.0."""
    value = os.environ.get("OCTAVO_INT_LARGE_SPLIT_SUM", "").strip().lower() or "launch"
    if value not in ("cta", "launch"):
        raise ValueError(f"OCTAVO_INT_LARGE_SPLIT_SUM must be cta or launch, got {value!r}")
    return value


def int_large_min_split_steps(default: int) -> int:
    """OCTAVO_INT_LARGE_MIN_SPLIT_STEPS: the fewest 64-wide K steps a CTA of the CUDA
    large-batch kernel must take where it splits K for ``swapab_wgmma.worth`` to route a layer
    to it (default ``swapab_wgmma.MIN_STEPS_SPLIT`` for the split sum in use: 48 for the last
    CTA's, Llama-8B's down; none for a second launch's, which qkv / o pay in 16-32 steps)."""
    return _int("OCTAVO_INT_LARGE_MIN_SPLIT_STEPS", default, "K steps")


def int_large_plan() -> dict:
    """OCTAVO_INT_LARGE_PLAN="block_m,cols,num_warps,block_k,num_stages": the tile the
    large-batch integer GEMM (octavo/kernels/swapab_large.py) runs in the engine, so that a
    device call can run the engine on a sweep's best tile without a commit (default: the
    kernel's own)."""
    value = os.environ.get("OCTAVO_INT_LARGE_PLAN", "").strip()
    if not value:
        return {}
    names = ("block_m", "cols", "num_warps", "block_k", "num_stages")
    try:
        parts = [int(v) for v in value.split(",")]
    except ValueError:
        parts = []
    if len(parts) != len(names):
        raise ValueError("OCTAVO_INT_LARGE_PLAN must be five integers "
                         f"(block_m,cols,num_warps,block_k,num_stages), got {value!r}")
    return dict(zip(names, parts))


def int_swapab_8bit() -> bool:
    """OCTAVO_INT_SWAPAB_8BIT (default off): the size rule of octavo/kernels/int_weight_layout.py
    sends large 8-bit weights (Llama-8B's gate_up and down) to the swap-AB layout as it does
    4-bit ones, so that their batches of 1-8 rows run the CUDA kernel (swapab_mma.cu's one
    operand per byte), to measure it against the 8-bit GEMV of the default layout.
    OCTAVO_INT_WEIGHT_LAYOUT=swapab moves every layer instead."""
    return _flag("OCTAVO_INT_SWAPAB_8BIT", False)


def cuda_kernels() -> bool:
    """OCTAVO_CUDA_KERNELS (default on): on NVIDIA GPUs with nvcc, weight-only integer layers
    in the swap-AB layout run decode batches of 1-8 rows (OCTAVO_CUDA_KERNELS_MAX_M) through
    the CUDA C++ kernel octavo/kernels/cuda/swapab_mma.cu (built at first use,
    octavo/kernels/cuda_module.py). Measured on an H200 (docs/benchmarks.md, session 19),
    Llama-3.1-8B W4A16: batch 1 2.80 ms per token against the Triton kernels' 3.01; at 16
    rows the kernel lost in the engine (4.30 against 3.91), so larger batches keep Triton."""
    return _flag("OCTAVO_CUDA_KERNELS", True)


def cuda_kernels_max_m(default: int) -> int:
    """OCTAVO_CUDA_KERNELS_MAX_M: the largest batch (1-16) the CUDA integer kernel runs;
    larger ones take the Triton kernels of the layer's layout."""
    return _batch_size("OCTAVO_CUDA_KERNELS_MAX_M", default)


def cuda_kernels_small_max_m(default: int) -> int:
    """OCTAVO_CUDA_KERNELS_SMALL_MAX_M: the largest batch (1-16) the CUDA integer kernel runs
    for a small layer (K * N under int_weight_layout.SMALL_WEIGHTS, as qkv and o of
    Llama-8B) in the swap-AB layout; default 16 (one CTA's rows)."""
    return _batch_size("OCTAVO_CUDA_KERNELS_SMALL_MAX_M", default)


def swapab_cuda_chunked_max_m(default: int) -> int:
    """OCTAVO_SWAPAB_CUDA_CHUNKED_MAX_M (at most 128; 0 turns it off): a small layer in the
    swap-AB layout (qkv, o) runs batches past the CUDA integer kernel's 16 rows, up to this
    many, through that kernel in 16-row chunks of one launch (its weights from L2 after the
    first chunk) instead of the Triton swap-AB GEMM (octavo/kernels/int_weight_layout.py)."""
    return _int("OCTAVO_SWAPAB_CUDA_CHUNKED_MAX_M", default, "rows")


def swapab_cuda_chunked_large_max_m() -> int:
    """OCTAVO_SWAPAB_CUDA_CHUNKED_LARGE_MAX_M (default 0, off; at most 128): the same for a
    large layer (gate_up, down), whose batches past 16 rows otherwise take the Triton
    swap-AB GEMM; its chunks read the weights from L2 where a tile's first chunk did."""
    return _int("OCTAVO_SWAPAB_CUDA_CHUNKED_LARGE_MAX_M", 0, "rows")


def int_weight_layout() -> str:
    """OCTAVO_INT_WEIGHT_LAYOUT: "auto" (default; octavo/kernels/int_weight_layout.py picks per
    layer), "along_k", "swapab" (every layer the swap-AB kernel can hold) or "rows" (every
    8-bit layer the rows GEMV can hold), for the benchmarks' comparisons."""
    value = os.environ.get("OCTAVO_INT_WEIGHT_LAYOUT", "auto").strip().lower() or "auto"
    if value not in ("auto", "along_k", "swapab", "rows"):
        raise ValueError("OCTAVO_INT_WEIGHT_LAYOUT must be auto, along_k, swapab or rows, "
                         f"got {value!r}")
    return value


def bnb4_gemv() -> bool:
    """OCTAVO_BNB4_GEMV (default on): on CUDA, bitsandbytes 4-bit (NF4 / FP4) layers run decode
    rows (1-2) through octavo/kernels/bnb4_gemv.py, reading the packed bytes, instead of
    dequantizing the weight per call. One H100, one row, K 4,096 (session 44): N 28,672
    159.3 us against 1,180.7 for the per-call dequantization (7.4x), N 4,096 29.3 against
    180.4; a bf16 GEMM takes 83.1 at N 28,672 (the GEMV reads at 14% of HBM: a table gather
    per byte bounds it)."""
    return _flag("OCTAVO_BNB4_GEMV", True)


def bnb4_cuda() -> bool:
    """OCTAVO_BNB4_CUDA (default on where nvcc builds it): bitsandbytes 4-bit batches of 1 to
    OCTAVO_BNB4_CUDA_MAX_M rows (bf16 / fp16, K a multiple of 32) run the CUDA C++ GEMV of
    octavo/kernels/bnb4_cuda.py (code values in shared memory, 4 sm_90 instructions a
    weight) instead of the Triton one (global gathers, 9). One H100 (session 46),
    Llama-3.1-8B NF4 ms per token at batch 1 / 2: 3.885 / 5.872 against 11.673 / 15.289."""
    return _flag("OCTAVO_BNB4_CUDA", True)


def bnb4_cuda_max_m(default: int) -> int:
    """OCTAVO_BNB4_CUDA_MAX_M (default 8, octavo/kernels/bnb4_cuda.py's MAX_M): the most rows
    the CUDA bitsandbytes 4-bit GEMV takes (up to 4 a launch, a launch per group of 4; larger
    batches dequantize, then cuBLAS)."""
    return _int("OCTAVO_BNB4_CUDA_MAX_M", default, "rows")


def bnb4_table() -> int:
    """OCTAVO_BNB4_TABLE (256, the default, or 16): how the bitsandbytes 4-bit GEMV looks up
    code values: a gather per byte from the 256 code pairs (2 KB) or a gather per nibble from
    the 16 codes (64 bytes, one cache line for a warp's 32 gathers, but twice the gathers).
    One H200 (session 45, ``benchmarks/gemv_scaling.py``, one row): 4096 x 4096 30.4 against
    33.8 us, 28672 x 4096 159.1 against 191.5: the pairs win. Both read at 7-9% of HBM."""
    value = _int("OCTAVO_BNB4_TABLE", 256, "entries")
    if value not in (16, 256):
        raise ValueError(f"OCTAVO_BNB4_TABLE must be 16 or 256, got {value}")
    return value


def bnb4_gemm_max_m(default: int = 16) -> int:
    """OCTAVO_BNB4_GEMM_MAX_M (default 16; 0 turns it off): bitsandbytes 4-bit batches past
    the GEMVs and up to this many rows run the fused tensor-core GEMM of
    octavo/kernels/bnb4_gemm.py (the packed bytes decoded by selects in its main loop)
    instead of dequantizing the weight for cuBLAS every call. One H100 (session 50,
    Llama-3.1-8B NF4, ms per token): batch 16 13.33 against 18.97 dequantizing, batch 64
    53.84 against 19.59 (K = N = 4096 alone: 32.0 against 45.7 us at 16 rows, 118.5 against
    44.9 at 64)."""
    return _int("OCTAVO_BNB4_GEMM_MAX_M", default, "rows")


def bnb4_dequant() -> str:
    """OCTAVO_BNB4_DEQUANT ("table", the default, or "select"): how bitsandbytes 4-bit batches
    past the GEMVs dequantize before cuBLAS on CUDA: a gather per byte from the 256 code pairs
    (7% of HBM on an H100, session 49: 45 us for a 4096 x 4096 weight) or a tree of selects on
    each nibble's bits with the codes compiled into the kernel (octavo/kernels/bnb4_gemv.py
    ``dequantize_4bit_select``; not yet measured on a GPU)."""
    value = os.environ.get("OCTAVO_BNB4_DEQUANT", "table").strip().lower() or "table"
    if value not in ("table", "select"):
        raise ValueError(f"OCTAVO_BNB4_DEQUANT must be table or select, got {value!r}")
    return value


def bnb4_cuda_ahead(default: int) -> int:
    """OCTAVO_BNB4_CUDA_AHEAD (1 or 8): weight rows a warp of the CUDA NF4 / FP4 GEMV loads
    before their arithmetic, for every launch (default: 1 for one row of x, 8 for 2-4;
    octavo/kernels/bnb4_cuda.py)."""
    out = _int("OCTAVO_BNB4_CUDA_AHEAD", default, "1 or 8")
    if out not in (1, 8):
        raise ValueError(f"OCTAVO_BNB4_CUDA_AHEAD must be 1 or 8, got {out}")
    return out


def swapab_glu() -> bool:
    """OCTAVO_SWAPAB_GLU (default on; 0 turns it off): a 4-bit MLP [gate | up] weight in the
    swap-AB layout is stored with gate and up in turn (``w4a16_swapab.glu_blocked``), so the
    CUDA decode kernel writes silu(gate) * up at 1-8 rows (OCTAVO_SWAPAB_GLU_MAX_M) and the
    activation's own launch goes; larger batches run the activation over the blocked columns.
    H100, Llama-8B W4A16 (session 60, two runs each), ms per token off / on: batch 1
    2.488-2.500 / 2.440-2.453, batch 8 2.924-2.931 / 2.871-2.895."""
    return _flag("OCTAVO_SWAPAB_GLU", True)


def swapab_glu_max_m(default: int) -> int:
    """OCTAVO_SWAPAB_GLU_MAX_M (default ``int_weight_layout.GLU_MAX_M``, 8): under
    OCTAVO_SWAPAB_GLU, the most rows (at most 16) the CUDA decode kernel writes silu(gate) * up
    from its store at; larger batches run the projection, then the activation over the blocked
    columns. The store lost at 16 rows (H100, session 60: batch 16 3.392-3.395 ms against
    3.358-3.361 off and 3.347 capped at 8)."""
    return _batch_size("OCTAVO_SWAPAB_GLU_MAX_M", default)
