"""Triton attention backend: ``reshape_and_cache`` + ``paged_attention`` (the GPU default).

Per layer and step: the new K/V go into the paged cache with one kernel, then one or two
attention launches (decodes / prefill chunks) read them back through the block tables.

CUDA-graph safety (decode-only batches): nothing here reads a device tensor on the host or
synchronises; every launch and allocation size comes from tensor shapes and the host-side
integers of the metadata (``num_tokens``, ``max_query_len``, ``max_seq_len``). Two things the
graph runner must keep in mind:

* ``meta.slot_mapping`` may be longer than the batch (padded with -1): it is cut to
  ``q.shape[0]``; tokens with slot -1 are not stored. Token rows past the last request
  (``query_start_loc[-1] <= t < q.shape[0]``) belong to no request: their output rows are
  zeroed, never attended.
* Split-K for decode-only batches is sized from ``meta.max_seq_len`` (and the block-table
  width) at launch time, and a captured graph freezes it. The metadata used for capture must
  therefore carry a ``max_seq_len`` at least as large as any context it will be replayed with
  (e.g. ``max_model_len``) -- a too-small value would silently drop keys beyond it.

Importing this module without Triton raises ImportError, so ``select_backend`` falls back to
the torch backend. Triton reads ``TRITON_INTERPRET`` when the kernels are defined, so this
module is imported lazily (through the registry), never at engine import time.
"""

from __future__ import annotations

import torch

from octavo.attention.backend import AttentionBackend, AttentionImpl, AttentionMetadata
from octavo.envs import attn_longest_first, attn_streamk
from octavo.kernels.triton_utils import HAS_TRITON

if not HAS_TRITON:  # pragma: no cover - only where triton is absent
    raise ImportError("the triton attention backend needs Triton (pip install triton)")

from octavo.kernels.paged_attention import paged_attention  # noqa: E402
from octavo.kernels.paged_attention_streamk import (  # noqa: E402
    DecodeTiles,
    batch_config,
    decode_tiles,
)
from octavo.kernels.reshape_and_cache import reshape_and_cache  # noqa: E402
from octavo.kernels.triton_utils import num_compute_units  # noqa: E402


class TritonAttentionImpl(AttentionImpl):
    accepts_stored_kv = True

    def forward(self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None,
                kv_cache: torch.Tensor, meta: AttentionMetadata,
                kv_stored: bool = False) -> torch.Tensor:
        num_tokens = q.shape[0]
        key_cache, value_cache = kv_cache[0], kv_cache[1]

        if not kv_stored:
            # Store this step's K/V. The slot mapping may be padded past the batch (graph
            # capture); any row beyond it has nothing to store.
            slots = meta.slot_mapping[:num_tokens]
            n = slots.shape[0]
            if n < num_tokens:
                k, v = k[:n], v[:n]
            reshape_and_cache(k, v, key_cache, value_cache, slots)

        out = torch.empty_like(q, memory_format=torch.contiguous_format)
        if meta.num_tokens < num_tokens:
            # Padding rows belong to no request, so the kernel never writes them; zero them
            # (before attention: a replayed graph may have more real rows than at capture)
            # so no uninitialised memory (NaN/inf) flows into the following layers.
            out[meta.num_tokens:].zero_()
        order = _decode_order(meta, key_cache.shape[2], q.device)
        return paged_attention(
            q, key_cache, value_cache, meta.query_start_loc, meta.seq_lens,
            meta.block_tables, self.scale, out=out, max_query_len=meta.max_query_len,
            max_seq_len=meta.max_seq_len, decode_order=order,
            decode_tiles=_decode_tiles(meta, q, key_cache, order),
        )  # fmt: skip


# Decode steps of at least this many requests take stream-K (``_decode_tiles``).
STREAMK_MIN_REQS = 2


def _full_grid(meta: AttentionMetadata, num_kv_heads: int, device: torch.device) -> bool:
    """Whether a decode launch holds at least two (request, KV head) programs per SM: where
    the longest-first order pays."""
    return meta.num_reqs * num_kv_heads >= 2 * num_compute_units(device)


def _decode_order(meta: AttentionMetadata, num_kv_heads: int,
                  device: torch.device) -> torch.Tensor | None:
    """The requests in falling context order, for a decode-only step on the GPU whose grid
    holds at least two (request, KV head) programs per SM (OCTAVO_ATTN_LONGEST_FIRST forces it
    on or off): sorted once per step on the device (no sync: a captured graph replays the
    sort) and shared by every layer.

    Such a launch leaves each context whole, so one long context started late is its tail.
    On an H200 (W1, session 25) this order cut the decode steps' time 1.0-1.3% (4.91-4.96 s
    against 4.97-5.03 s; batches 65-192 2-3%, 33-64 0.5%, 193-256 nothing); smaller grids
    (W4's batch 32 and below) are split or end in one wave, and there the sort's launch
    would be a cost for nothing."""
    if not (meta.is_decode_only and device.type == "cuda"):
        return None
    forced = attn_longest_first()
    if not (_full_grid(meta, num_kv_heads, device) if forced is None else forced):
        return None
    # Keyed by capture: warm-up's tensor must not be the one a captured graph reads.
    key = ("decode_order", torch.cuda.is_current_stream_capturing())
    order = meta.derived.get(key)
    if order is None:
        order = torch.argsort(meta.seq_lens, descending=True, stable=True).to(torch.int32)
        meta.derived[key] = order
    return order


def _decode_tiles(meta: AttentionMetadata, q: torch.Tensor, key_cache: torch.Tensor,
                  order: torch.Tensor | None) -> DecodeTiles | None:
    """For a decode-only step on the GPU of at least ``STREAMK_MIN_REQS`` requests
    (OCTAVO_ATTN_STREAMK forces it on or off), the stream-K work list (the
    requests' KV tiles in ``order``, prefix-summed, and each tile's row, keys, flags and
    cache blocks from this step's block table): built once per step on the device (a
    captured graph rebuilds it at each replay) and shared by every layer, keyed like
    ``_decode_order``; sized by ``meta.max_seq_len`` (a captured graph's bounds its
    replays').

    On an H200 (session 27) stream-K took W1's decode attention (batch 128, contexts
    100-2,000) from 163.3 to 154.7 us and 128-key contexts at batch 256 from 51.0 to 40.8.
    In the engine (session 28, W4's Qwen3-0.6B at contexts 128-384, ms per token, split-K /
    stream-K) it wins from two requests on: batch 2 0.983 / 0.954, 8 1.163 / 1.068, 16
    1.368 / 1.301, 32 1.593 / 1.544; at one request the split parts with their merge launch
    stay faster (0.886 / 0.950)."""
    if not (meta.is_decode_only and q.device.type == "cuda"):
        return None
    _, block_size, num_kv_heads, _ = key_cache.shape
    forced = attn_streamk()
    if not (meta.num_reqs >= STREAMK_MIN_REQS if forced is None else forced):
        return None
    block_n = batch_config(meta.seq_lens.shape[0], q.shape[1], num_kv_heads, q.shape[2],
                           q.dtype, q.device).block_n
    key = ("decode_tiles", block_n, block_size, torch.cuda.is_current_stream_capturing())
    tiles = meta.derived.get(key)
    if tiles is None:
        tiles = decode_tiles(meta.query_start_loc, meta.seq_lens, meta.block_tables,
                             block_size, block_n, order, max_seq_len=meta.max_seq_len)
        meta.derived[key] = tiles
    return tiles


class TritonAttentionBackend(AttentionBackend):
    name = "triton"
    impl_cls = TritonAttentionImpl

    @staticmethod
    def supports(device: torch.device) -> bool:
        return device.type == "cuda"
