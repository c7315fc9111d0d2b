"""Every environment variable Octavo reads, in one place."""

from __future__ import annotations

import os


def _flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() not in ("0", "false", "no", "off", "")


def _forced(name: str) -> bool | None:
    """A switch that forces a heuristic's choice: None while unset, else its flag value."""
    return None if os.environ.get(name) is None else _flag(name, False)


def cpu_packed_gemm() -> bool:
    """OCTAVO_CPU_PACKED_GEMM (default on): oneDNN-packed weights for CPU linear layers."""
    return _flag("OCTAVO_CPU_PACKED_GEMM", True)


def cpu_keep_heap() -> bool:
    """OCTAVO_CPU_KEEP_HEAP (default on): raise glibc's mmap/trim thresholds on CPU."""
    return _flag("OCTAVO_CPU_KEEP_HEAP", True)


def sample_kernel() -> bool:
    """OCTAVO_SAMPLE_KERNEL (default on): on CUDA, temperature sampling in one Triton pass
    over the logits (octavo/kernels/sample_race.py) when no row needs top-k / top-p / min-p,
    logprobs or logits processing; off, the torch sampler runs every step."""
    return _flag("OCTAVO_SAMPLE_KERNEL", True)


def grammar_mask_kernel() -> bool:
    """OCTAVO_GRAMMAR_MASK_KERNEL (default on): on CUDA, a guided step's token bitmask applied
    to the logits in one Triton launch (octavo/kernels/grammar_mask.py); off, the torch ops."""
    return _flag("OCTAVO_GRAMMAR_MASK_KERNEL", True)


def fused_qk_norm_rope() -> bool:
    """OCTAVO_FUSED_QK_NORM_ROPE (default on): on CUDA, Qwen3's per-head q/k RMSNorm and the
    rotary embedding in one in-place Triton launch (octavo/kernels/qk_norm_rope.py); off,
    two norms (each copying its strided input) and a rotary kernel."""
    return _flag("OCTAVO_FUSED_QK_NORM_ROPE", True)


def fused_moe() -> bool:
    """OCTAVO_FUSED_MOE (default on; 0: the loop): on CUDA, mixture-of-experts layers run the
    grouped Triton kernels (octavo/kernels/fused_moe.py for float experts, fused_moe_int.py
    for GPTQ / AWQ / compressed-tensors integer experts) instead of a loop over experts, and
    MoE models' decode steps are captured in CUDA graphs. Qwen3-30B-A3B shape on one H200
    (2026-12-05): 6.6 ms per token at batch 1 against the loop's 79.4, 15.4 against 608 at 16."""
    return _flag("OCTAVO_FUSED_MOE", True)


def moe_int_gemv_max_pairs() -> int:
    """OCTAVO_MOE_INT_GEMV (default 128; 0 turns it off): integer MoE experts
    (octavo/kernels/fused_moe_int.py) run batches of up to this many (token, expert) pairs
    through the grouped CUDA-core GEMV (octavo/kernels/w4a16_gemv.py) instead of the
    tensor-core launches. H100, Qwen3-30B-A3B W4A16 (session 43): 23.6 against 43.7 us a
    layer at 8 pairs, 137 against 198 at 128; the engine's batch 1 4.22 -> 3.30 ms per token,
    batch 16 11.35 -> 9.68. Beyond 128 pairs: not measured."""
    return _int("OCTAVO_MOE_INT_GEMV", 128, "(token, expert) pairs")


def moe_route() -> bool:
    """OCTAVO_MOE_ROUTE (default on): with the fused MoE kernel, decode batches route and align
    their (token, expert) pairs in one launch (octavo/kernels/moe_route.py); off, torch ops
    (30 a layer)."""
    return _flag("OCTAVO_MOE_ROUTE", True)


def attn_split_merge() -> bool | None:
    """OCTAVO_ATTN_SPLIT_MERGE (unset: by grid size, octavo/kernels/paged_attention_config.py):
    1, a split decode attention launch merges its splits itself (the last program of each
    request and KV head, in parts of at least 256 keys); 0, a second kernel merges them."""
    return _forced("OCTAVO_ATTN_SPLIT_MERGE")


def _tile(name: str) -> tuple[int, int, int] | None:
    """An attention tile "BLOCK_N,WARPS,STAGES" from ``name``, or None where unset."""
    value = os.environ.get(name)
    if not value:
        return None
    try:
        block_n, warps, stages = (int(v) for v in value.split(","))
    except ValueError:
        raise ValueError(f"{name}={value!r}: expected three integers "
                         "BLOCK_N,WARPS,STAGES (e.g. 64,4,3)") from None
    if block_n < 16 or block_n & (block_n - 1) or warps not in (1, 2, 4, 8) or stages < 1:
        raise ValueError(f"{name}={value!r}: BLOCK_N must be a power of two "
                         ">= 16, WARPS 1, 2, 4 or 8, STAGES >= 1")
    return block_n, warps, stages


def attn_decode_tile() -> tuple[int, int, int] | None:
    """OCTAVO_ATTN_DECODE_TILE="BLOCK_N,WARPS,STAGES" (unset: chosen by
    octavo/kernels/paged_attention_config.py): the decode attention launch's keys per step,
    warps and pipeline stages on the GPU, for measuring other tiles in the engine (the
    tile benchmarks time hot-L2 data). It reaches every decode launch, stream-K's too unless
    OCTAVO_ATTN_STREAMK_TILE says otherwise."""
    return _tile("OCTAVO_ATTN_DECODE_TILE")


def attn_prefill_tile() -> tuple[int, int, int] | None:
    """OCTAVO_ATTN_PREFILL_TILE="BLOCK_N,WARPS,STAGES" (unset: chosen by
    octavo/kernels/paged_attention_config.py): the prefill attention launch's keys per step,
    warps and pipeline stages on the GPU (its query tile keeps its rows), for measuring other
    tiles in the engine."""
    return _tile("OCTAVO_ATTN_PREFILL_TILE")


def attn_streamk_tile() -> tuple[int, int, int] | None:
    """OCTAVO_ATTN_STREAMK_TILE="BLOCK_N,WARPS,STAGES": the stream-K decode launch's tile
    alone (it wins over OCTAVO_ATTN_DECODE_TILE there), so its tile is measured without
    changing the per-request launches of the same run."""
    return _tile("OCTAVO_ATTN_STREAMK_TILE")


def attn_decode_splits() -> int | None:
    """OCTAVO_ATTN_DECODE_SPLITS=N (unset: by grid size): split every decode-only attention
    launch's KV range into N parts (each at least the minimum part long), for measurements."""
    return _optional_int("OCTAVO_ATTN_DECODE_SPLITS", 1, 64)


def attn_longest_first() -> bool | None:
    """OCTAVO_ATTN_LONGEST_FIRST (unset: by grid size, octavo/attention/triton_backend.py): 1,
    every decode-only attention launch on the GPU walks its requests in falling context order
    (a per-step argsort of seq_lens, shared by every layer), so the longest contexts start
    first and the launch's last wave holds short ones; 0, never."""
    return _forced("OCTAVO_ATTN_LONGEST_FIRST")


def attn_streamk() -> bool | None:
    """OCTAVO_ATTN_STREAMK (unset: by grid size, octavo/attention/triton_backend.py): 1,
    every decode-only attention launch on the GPU runs stream-K
    (octavo/kernels/paged_attention_streamk.py): the batch's KV tiles shared evenly by a
    fixed grid of about OCTAVO_ATTN_STREAMK_WAVES programs per SM, cut requests merged in
    the launch; 0, never."""
    return _forced("OCTAVO_ATTN_STREAMK")


def attn_early_kv() -> bool:
    """OCTAVO_ATTN_EARLY_KV (default on): a split decode attention launch under PDL asks L2
    for its first K/V rows of keys cached before the step (no kernel of the step writes
    them) while the previous kernel ends, and reads its request's metadata then too; only q
    and the step's new keys wait for it. 0: every read after the wait."""
    return _flag("OCTAVO_ATTN_EARLY_KV", True)


def attn_streamk_waves() -> int | None:
    """OCTAVO_ATTN_STREAMK_WAVES=N (unset: the kernel's default): stream-K decode attention
    launches N programs per SM (over all KV heads), for measurements."""
    return _optional_int("OCTAVO_ATTN_STREAMK_WAVES", 1, 64)


def fp8_gemv_stages() -> int | None:
    """OCTAVO_FP8_GEMV_STAGES=2|3 (unset: the kernel's default): steps of weights the FP8
    GEMV keeps in flight, for measurements."""
    return _optional_int("OCTAVO_FP8_GEMV_STAGES", 2, 3)


def fused_kv_store() -> bool:
    """OCTAVO_FUSED_KV_STORE (default on): on CUDA, the launch that rotates q and k (Qwen3's
    q/k norm + rotary under OCTAVO_FUSED_QK_NORM_ROPE, or the rotary kernel of the other
    families) also writes the new K/V into the paged cache (the Triton backend then skips its
    reshape_and_cache launch)."""
    return _flag("OCTAVO_FUSED_KV_STORE", True)


def skinny_gemm() -> bool:
    """OCTAVO_SKINNY_GEMM (default on): on CUDA, float linears of decode batches (<= 32 rows,
    bf16 / fp16) through one Triton launch (octavo/kernels/skinny_gemm.py); off, cuBLAS."""
    return _flag("OCTAVO_SKINNY_GEMM", True)


def dense_gemv() -> bool:
    """OCTAVO_DENSE_GEMV (default on): on CUDA, float linears of one row (bf16 / fp16)
    through the CUDA-core GEMV launched with PDL (octavo/kernels/dense_gemv.py); off, the
    skinny GEMM's shapes or cuBLAS."""
    return _flag("OCTAVO_DENSE_GEMV", True)


def pdl() -> bool:
    """OCTAVO_PDL (default on): on NVIDIA sm_90+, the decode path's Triton kernels are
    launched with programmatic dependent launch (octavo/kernels/pdl.py)."""
    return _flag("OCTAVO_PDL", True)


def packed_inputs() -> bool:
    """OCTAVO_PACKED_INPUTS (default on): on CUDA, a step's input tensors (token ids,
    positions, KV slots, query starts, sequence lengths, block-table rows, logits rows,
    sampling parameters, in-flight token fixes) are typed views into one pinned host arena
    mirrored by one device arena of the same layout, and a step uploads them with one
    host-to-device copy of the byte range it wrote (octavo/worker/input_buffers.py); off, one
    copy per tensor per step."""
    return _flag("OCTAVO_PACKED_INPUTS", True)


def _optional_int(name: str, lo: int, hi: int) -> int | None:
    """A measurement knob: unset or empty, None; else an integer in [lo, hi]."""
    value = os.environ.get(name)
    if not value:
        return None
    if not value.strip().isdigit() or not lo <= int(value) <= hi:
        raise ValueError(f"{name}={value!r}: expected an integer {lo}-{hi}")
    return int(value)


def _int(name: str, default: int, what: str) -> int:
    value = os.environ.get(name)
    if not value:
        return default
    try:
        out = int(value)
    except ValueError:
        out = -1
    if out < 0:
        raise ValueError(f"{name} must be a non-negative integer ({what}), got {value!r}")
    return out


def swapab_warps_per_sm(default: int) -> int:
    """OCTAVO_SWAPAB_WARPS_PER_SM: the warps per SM the CUDA integer kernel's launch plan aims
    for (octavo/kernels/swapab_mma.py)."""
    return max(1, _int("OCTAVO_SWAPAB_WARPS_PER_SM", default, "warps per SM"))


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


def l2_prefetch() -> frozenset[str]:
    """OCTAVO_L2_PREFETCH (comma list of "o", "mlp", "qkv"; default none): on NVIDIA sm_90+
    with PDL, a launch right after each decoder layer's attention pulls into L2 the weights
    read next (its o_proj, its MLP, the next layer's qkv_proj) for one-token steps,
    octavo/layers/weight_prefetch.py. "0" / "off" / "none" (the default): none. Off by
    default since session 33: on an H200 it cost Qwen3-0.6B batch 1 0.884 -> 0.952 ms and
    Llama-3.1-8B fp8 2.547 -> 2.594 ms, W4A16 2.558 -> 2.571, bf16 nothing; only W8A16 g128
    gained (3.121 -> 3.079)."""
    value = os.environ.get("OCTAVO_L2_PREFETCH", "none")
    names = frozenset(v.strip() for v in value.split(",") if v.strip())
    if names & {"0", "off", "none", "false"}:
        return frozenset()
    bad = names - {"o", "mlp", "qkv"}
    if bad:
        raise ValueError(f"OCTAVO_L2_PREFETCH={value!r}: unknown part(s) {sorted(bad)}; "
                         "expected a comma list of o, mlp, qkv")
    return names


def l2_prefetch_mb() -> int:
    """OCTAVO_L2_PREFETCH_MB (default 24): at most this many MiB prefetched per layer."""
    return _int("OCTAVO_L2_PREFETCH_MB", 24, "a size in MiB")


def l2_prefetch_max_tokens() -> int:
    """OCTAVO_L2_PREFETCH_MAX_TOKENS (default 1): the prefetch runs for steps of at most this
    many tokens (two and more lost on an H200)."""
    return _int("OCTAVO_L2_PREFETCH_MAX_TOKENS", 1, "a token count")


def _batch_size(name: str, default: int) -> int:
    value = os.environ.get(name)
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name} must be an integer (a batch size), got {value!r}") from None


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


def int_weight_layout() -> str:
    """OCTAVO_INT_WEIGHT_LAYOUT: "auto" (default; octavo/kernels/int_weight_layout.py picks per
    layer), "along_k", "swapab" (every layer the swap-AB kernel can hold) or "rows" (every
    8-bit layer the rows GEMV can hold), for the benchmarks' comparisons."""
    value = os.environ.get("OCTAVO_INT_WEIGHT_LAYOUT", "auto").strip().lower() or "auto"
    if value not in ("auto", "along_k", "swapab", "rows"):
        raise ValueError("OCTAVO_INT_WEIGHT_LAYOUT must be auto, along_k, swapab or rows, "
                         f"got {value!r}")
    return value


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


def bnb4_gemv() -> bool:
    """OCTAVO_BNB4_GEMV (default on): on CUDA, bitsandbytes 4-bit (NF4 / FP4) layers run decode
    rows (1-2) through octavo/kernels/bnb4_gemv.py, reading the packed bytes, instead of
    dequantizing the weight per call. One H100, one row, K 4,096 (session 44): N 28,672
    159.3 us against 1,180.7 for the per-call dequantization (7.4x), N 4,096 29.3 against
    180.4; a bf16 GEMM takes 83.1 at N 28,672 (the GEMV reads at 14% of HBM: a table gather
    per byte bounds it)."""
    return _flag("OCTAVO_BNB4_GEMV", True)


def bnb4_cuda() -> bool:
    """OCTAVO_BNB4_CUDA (default on where nvcc builds it): bitsandbytes 4-bit decode rows
    (1-2, bf16 / fp16, K a multiple of 32) run the CUDA C++ GEMV of
    octavo/kernels/bnb4_cuda.py (code values in shared memory, 4 sm_90 instructions a
    weight) instead of the Triton one (global gathers, 9). One H100 (session 46),
    Llama-3.1-8B NF4 ms per token at batch 1 / 2: 3.885 / 5.872 against 11.673 / 15.289."""
    return _flag("OCTAVO_BNB4_CUDA", True)


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


def custom_all_reduce() -> bool:
    """OCTAVO_CUSTOM_ALL_REDUCE (default on): tensor-parallel all-reduces of small CUDA tensors
    in one launch over peer-mapped GPU memory (octavo/distributed/custom_all_reduce.py) where
    every GPU can reach the others; off, NCCL for every all-reduce."""
    return _flag("OCTAVO_CUSTOM_ALL_REDUCE", True)


def cpu_kernels() -> bool:
    """OCTAVO_CPU_KERNELS (default on): fused C++ CPU ops (norm, rotary, attention, ...),
    compiled on first use; off, or without a compiler, the torch ops run instead."""
    return _flag("OCTAVO_CPU_KERNELS", True)


def cpu_fused_decode() -> bool:
    """OCTAVO_CPU_FUSED_DECODE (default on): CPU decode steps of Llama-style models whose
    linear layers are GGUF-quantized run the decoder stack in one C++ call."""
    return _flag("OCTAVO_CPU_FUSED_DECODE", True)


def cpu_quant_isa() -> str:
    """OCTAVO_CPU_QUANT_ISA (default "auto"): the instruction set of the quantized CPU
    kernels; "avx2" or "scalar" force a portable path ("avx512": VNNI, where built)."""
    value = os.environ.get("OCTAVO_CPU_QUANT_ISA", "auto").strip().lower() or "auto"
    if value not in ("auto", "avx512", "avx2", "scalar"):
        raise ValueError(f"OCTAVO_CPU_QUANT_ISA must be auto, avx512, avx2 or scalar, got "
                         f"{value!r}")
    return value


def grammar_fill_threads() -> int | None:
    """OCTAVO_GRAMMAR_FILL_THREADS (default 1: inline on the engine thread): threads xgrammar
    fills a step's bitmask rows with (its pool pays off only for costly grammars)."""
    value = os.environ.get("OCTAVO_GRAMMAR_FILL_THREADS")
    if value is None or not value.strip():
        return None
    threads = int(value)
    if threads < 1:
        raise ValueError(f"OCTAVO_GRAMMAR_FILL_THREADS must be >= 1, got {value!r}")
    return threads


def profile_steps() -> tuple[int, int] | None:
    """OCTAVO_PROFILE_STEPS="START:STOP" (default unset): each worker (every rank) runs
    torch.profiler over its steps START..STOP-1 and writes a per-kernel summary to
    OCTAVO_PROFILE_DIR (default "."), for finding where a step's device time goes."""
    value = os.environ.get("OCTAVO_PROFILE_STEPS", "").strip()
    if not value:
        return None
    try:
        start, stop = (int(v) for v in value.split(":"))
    except ValueError:
        raise ValueError(f"OCTAVO_PROFILE_STEPS must be START:STOP, got {value!r}") from None
    if not 0 <= start < stop:
        raise ValueError(f"OCTAVO_PROFILE_STEPS needs 0 <= START < STOP, got {value!r}")
    return start, stop


def profile_dir() -> str:
    return os.environ.get("OCTAVO_PROFILE_DIR", ".")


def log_step_timings() -> bool:
    """OCTAVO_LOG_STEP_TIMINGS (default off): an engine process logs where its steps' time
    went (scheduling, input preparation, execution, output processing) when it stops, with
    the time its engine loop spent outside steps (benchmarks compare it with offline)."""
    return _flag("OCTAVO_LOG_STEP_TIMINGS", False)


def tokenizer_cache() -> bool:
    """OCTAVO_TOKENIZER_CACHE (default on): a GGUF file's converted tokenizer is kept under
    the cache directory and loaded from there on later starts
    (octavo/model_loader/tokenizer_cache.py); off, it is converted on every start."""
    return _flag("OCTAVO_TOKENIZER_CACHE", True)


def cache_dir() -> str | None:
    """OCTAVO_CACHE_DIR, else $XDG_CACHE_HOME/octavo, else ~/.cache/octavo (None when there is
    no home to put it in)."""
    explicit = os.environ.get("OCTAVO_CACHE_DIR")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return None if base.startswith("~") else os.path.join(base, "octavo")


def replica_direct_send() -> bool:
    """OCTAVO_REPLICA_DIRECT_SEND (default on): a process replica's engine thread pipes each
    step's outputs to the router itself; off, it hands them to the replica's sender thread
    (a GIL hand-off between two threads every step)."""
    return _flag("OCTAVO_REPLICA_DIRECT_SEND", True)


def freeze_startup_heap() -> bool:
    """OCTAVO_FREEZE_STARTUP_HEAP (default on): a serving process (the API server, an engine
    process) moves every object alive once its engine is built out of the garbage
    collector's reach (``gc.freeze``; octavo/startup_heap.py); off, each full collection
    walks them again."""
    return _flag("OCTAVO_FREEZE_STARTUP_HEAP", True)
