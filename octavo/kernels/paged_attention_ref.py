"""The paged attention of :mod:`octavo.kernels.paged_attention`, in plain torch: the reference
its kernels are tested against (no Triton needed)."""

from __future__ import annotations

import torch


def paged_attention_ref(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    max_query_len: int | None = None,
) -> torch.Tensor:
    """Pure-torch reference: per request, gather K/V through the block table, causal softmax
    in fp32. Slow (a Python loop over requests); for tests and the CPU backend."""
    del max_query_len  # only a hint for the Triton kernel
    num_heads = q.shape[1]
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    group = num_heads // num_kv_heads
    if out is None:
        out = torch.empty_like(q)
    qsl = query_start_loc.tolist()
    lens = seq_lens.tolist()
    for b, seq_len in enumerate(lens):
        start, end = qsl[b], qsl[b + 1]
        q_len = end - start
        if q_len == 0:
            continue
        n_blocks = -(-seq_len // block_size)
        blocks = block_tables[b, :n_blocks].long()
        k = key_cache[blocks].reshape(-1, num_kv_heads, key_cache.shape[-1])[:seq_len]
        v = value_cache[blocks].reshape(-1, num_kv_heads, value_cache.shape[-1])[:seq_len]
        k = k.float().repeat_interleave(group, dim=1)  # [S, H, D]
        v = v.float().repeat_interleave(group, dim=1)
        qb = q[start:end].float()  # [L, H, D]
        scores = torch.einsum("lhd,shd->hls", qb, k) * scale
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)
        k_pos = torch.arange(seq_len, device=q.device)
        visible = k_pos[None, :] <= q_pos[:, None]  # [L, S]
        scores = scores.masked_fill(~visible[None], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[start:end] = torch.einsum("hls,shd->lhd", probs, v).to(out.dtype)
    return out
