"""Reference attention backend in plain torch: CPU, and the GPU's reference.

Decodes (query length 1) are attended in one batched pass over K/V gathered through the block
tables; prefill chunks go one request at a time with a causal mask offset by the cached context.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from octavo.attention.backend import AttentionBackend, AttentionImpl, AttentionMetadata


def write_kv(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    n_kv, d = k.shape[1], k.shape[2]
    kc = kv_cache[0].view(-1, n_kv, d)
    vc = kv_cache[1].view(-1, n_kv, d)
    kc.index_copy_(0, slot_mapping, k)
    vc.index_copy_(0, slot_mapping, v)


class TorchAttentionImpl(AttentionImpl):
    def forward(self, q, k, v, kv_cache, meta: AttentionMetadata):
        write_kv(k, v, kv_cache, meta.slot_mapping[: meta.num_tokens])
        out = torch.empty_like(q)
        qsl, lens = meta.query_start_loc_cpu, meta.seq_lens_cpu
        decode_rows = [b for b in range(meta.num_reqs) if qsl[b + 1] - qsl[b] == 1]
        if len(decode_rows) == meta.num_reqs:
            out[: meta.num_tokens] = self._decode(q[: meta.num_tokens], kv_cache,
                                                  meta.block_tables, meta.seq_lens,
                                                  meta.max_seq_len)
            return out
        for b in range(meta.num_reqs):
            s, e = qsl[b], qsl[b + 1]
            if e > s:
                out[s:e] = self._prefill(q[s:e], kv_cache, meta.block_tables[b], lens[b])
        return out

    def _gather(self, kv_cache, block_table, num_blocks):
        bs = kv_cache.shape[2]
        ids = block_table[..., :num_blocks]
        k = kv_cache[0][ids]  # [..., nb, bs, Hkv, D]
        v = kv_cache[1][ids]
        shape = (*ids.shape[:-1], num_blocks * bs, self.num_kv_heads, self.head_dim)
        return k.reshape(shape), v.reshape(shape)

    def _prefill(self, q, kv_cache, block_table, seq_len):
        n = q.shape[0]
        bs = kv_cache.shape[2]
        k, v = self._gather(kv_cache, block_table, -(-seq_len // bs))
        k, v = k[:seq_len], v[:seq_len]
        group = self.num_heads // self.num_kv_heads
        if group > 1:
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
        # Query i sits at position seq_len - n + i and sees keys 0..that position.
        qpos = torch.arange(seq_len - n, seq_len, device=q.device)
        mask = torch.arange(seq_len, device=q.device)[None, :] <= qpos[:, None]
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
            attn_mask=mask, scale=self.scale)
        return o.transpose(0, 1)

    def _decode(self, q, kv_cache, block_tables, seq_lens, max_seq_len):
        bsz = q.shape[0]
        bs = kv_cache.shape[2]
        nb = -(-max_seq_len // bs)
        k, v = self._gather(kv_cache, block_tables, nb)  # [B, L, Hkv, D]
        group = self.num_heads // self.num_kv_heads
        qg = q.view(bsz, self.num_kv_heads, group, self.head_dim)
        scores = torch.einsum("bhgd,blhd->bhgl", qg, k) * self.scale
        valid = torch.arange(nb * bs, device=q.device)[None, :] < seq_lens[:, None]
        scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
        probs = torch.softmax(scores.float(), dim=-1).to(v.dtype)
        o = torch.einsum("bhgl,blhd->bhgd", probs, v)
        return o.reshape(bsz, self.num_heads, self.head_dim)


class TorchAttentionBackend(AttentionBackend):
    name = "torch"
    impl_cls = TorchAttentionImpl
