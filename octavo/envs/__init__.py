"""Every OCTAVO_* environment switch Octavo reads, one function each, read at call time
(``from octavo import envs; envs.fp8_gemv()``), grouped by what they switch."""

from __future__ import annotations

from octavo.envs.attention import (
    attn_decode_splits,
    attn_decode_tile,
    attn_early_kv,
    attn_longest_first,
    attn_prefill_tile,
    attn_split_merge,
    attn_streamk,
    attn_streamk_tile,
    attn_streamk_waves,
    fused_kv_store,
    fused_qk_norm_rope,
)
from octavo.envs.cpu import (
    cpu_fused_decode,
    cpu_keep_heap,
    cpu_kernels,
    cpu_packed_gemm,
    cpu_quant_isa,
)
from octavo.envs.dense import (
    cuda_dense,
    cuda_dense_max_bytes,
    cuda_dense_max_m,
    cuda_dense_min_m,
    dense_gemv,
    fused_glu,
    skinny_gemm,
    skinny_gemm_all,
)
from octavo.envs.fp8 import (
    cuda_fp8,
    cuda_fp8_max_m,
    cuda_fp8_min_m,
    fp8_block_fold,
    fp8_block_gemm_max_m,
    fp8_block_kept,
    fp8_block_scaled_mm,
    fp8_fused_quant,
    fp8_gemv,
    fp8_gemv_stages,
    fp8_tensorwise,
    fp8_tensorwise_max_m,
    fp8_unit_glu,
    fused_qkv_rope,
)
from octavo.envs.integer import (
    bnb4_cuda,
    bnb4_cuda_ahead,
    bnb4_cuda_max_m,
    bnb4_dequant,
    bnb4_gemm_max_m,
    bnb4_gemv,
    bnb4_table,
    cuda_kernels,
    cuda_kernels_max_m,
    cuda_kernels_small_max_m,
    gemv_prefetch,
    int_gemm_fused_max_m,
    int_gemm_sz_ahead,
    int_large_cuda,
    int_large_max_m,
    int_large_plan,
    int_swapab_8bit,
    int_swapab_max_m,
    int_weight_layout,
    swapab_cuda_chunked_large_max_m,
    swapab_cuda_chunked_max_m,
    swapab_split_ctas,
    swapab_stages,
    swapab_warps_per_sm,
)
from octavo.envs.moe import (
    fused_moe,
    moe_int_gemv_max_pairs,
    moe_route,
)
from octavo.envs.runtime import (
    cache_dir,
    custom_all_reduce,
    freeze_startup_heap,
    l2_prefetch,
    l2_prefetch_max_tokens,
    l2_prefetch_mb,
    log_step_timings,
    packed_inputs,
    pdl,
    profile_dir,
    profile_steps,
    replica_direct_send,
    tokenizer_cache,
)
from octavo.envs.sampling import (
    grammar_fill_threads,
    grammar_mask_kernel,
    logprob_kernel,
    sample_kernel,
)

__all__ = [
    "attn_decode_splits", "attn_decode_tile", "attn_early_kv", "attn_longest_first",
    "attn_prefill_tile", "attn_split_merge", "attn_streamk", "attn_streamk_tile",
    "attn_streamk_waves", "bnb4_cuda", "bnb4_cuda_ahead", "bnb4_dequant", "bnb4_gemm_max_m",
    "bnb4_cuda_max_m", "bnb4_gemv", "bnb4_table",
    "cache_dir", "cpu_fused_decode",
    "cpu_keep_heap", "cpu_kernels", "cpu_packed_gemm", "cpu_quant_isa", "cuda_dense",
    "cuda_dense_max_bytes", "cuda_dense_max_m", "cuda_dense_min_m", "cuda_fp8", "cuda_fp8_max_m",
    "cuda_fp8_min_m", "cuda_kernels", "cuda_kernels_max_m",
    "cuda_kernels_small_max_m", "custom_all_reduce", "dense_gemv",
    "fp8_block_fold", "fp8_block_gemm_max_m", "fp8_block_kept", "fp8_block_scaled_mm",
    "fp8_fused_quant", "fp8_gemv", "fp8_gemv_stages", "fp8_tensorwise", "fp8_tensorwise_max_m",
    "fp8_unit_glu", "freeze_startup_heap", "fused_glu", "fused_kv_store", "fused_moe",
    "fused_qk_norm_rope", "fused_qkv_rope", "gemv_prefetch", "grammar_fill_threads",
    "grammar_mask_kernel", "int_gemm_fused_max_m", "int_gemm_sz_ahead", "int_swapab_8bit",
    "int_large_cuda", "int_large_max_m", "int_large_plan", "int_swapab_max_m", "int_weight_layout", "l2_prefetch", "l2_prefetch_max_tokens",
    "l2_prefetch_mb", "log_step_timings", "moe_int_gemv_max_pairs", "moe_route", "packed_inputs",
    "pdl", "profile_dir", "profile_steps", "replica_direct_send", "logprob_kernel", "sample_kernel", "skinny_gemm",
    "skinny_gemm_all", "swapab_cuda_chunked_large_max_m", "swapab_cuda_chunked_max_m", "swapab_split_ctas", "swapab_stages", "swapab_warps_per_sm", "tokenizer_cache",
]
