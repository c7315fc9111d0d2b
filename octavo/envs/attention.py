"""Attention switches: the paged attention launches' tiles, splits, stream-K and
request order, and the rotary / KV-store launch before them."""

from __future__ import annotations

from octavo.envs._parse import _flag, _forced, _optional_int, _tile


def fused_qk_norm_rope() -> bool:
    """OCTAVO_FUSED_QK_NORM_ROPE (default on): on CUDA, Qwen3's per-head q/k RMSNorm and the
    rotary embedding in one in-place Triton launch (octavo/kernels/qk_norm_rope.py); off,
    two norms (each copying its strided input) and a rotary kernel."""
    return _flag("OCTAVO_FUSED_QK_NORM_ROPE", True)


def attn_split_merge() -> bool | None:
    """OCTAVO_ATTN_SPLIT_MERGE (unset: by grid size, octavo/kernels/paged_attention_config.py):
    1, a split decode attention launch merges its splits itself (the last program of each
    request and KV head, in parts of at least 256 keys); 0, a second kernel merges them."""
    return _forced("OCTAVO_ATTN_SPLIT_MERGE")


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


def fused_kv_store() -> bool:
    """OCTAVO_FUSED_KV_STORE (default on): on CUDA, the launch that rotates q and k (Qwen3's
    q/k norm + rotary under OCTAVO_FUSED_QK_NORM_ROPE, or the rotary kernel of the other
    families) also writes the new K/V into the paged cache (the Triton backend then skips its
    reshape_and_cache launch)."""
    return _flag("OCTAVO_FUSED_KV_STORE", True)
