"""Reference attention backend in plain torch: CPU, and the GPU's reference.

The cache is laid out [2, num_blocks, num_kv_heads, block_size, head_dim] so that one gather
through the block table yields each request's K/V as [heads, context, head_dim] with no
further copy: on the CPU the copies around attention cost as much as the attention itself.
Decodes (query length 1) are attended in one batched pass; prefill chunks go one request at a
time with a causal mask offset by the cached context.

On the CPU, with the C++ kernels built (``octavo.kernels.cpu``), K/V stores and the
attention of decodes and of short prefill chunks go through them: attention reads the blocks
in place instead of gathering them. The torch code stays the fallback and the reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from octavo.attention.backend import AttentionBackend, AttentionImpl, AttentionMetadata
from octavo.kernels import cpu as cpu_kernels

# Gather buffers shared by every layer (layers run one after another), per device and dtype.
_SCRATCH: dict[tuple, list] = {}


def _row_index(block_ids: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """Rows of the [num_blocks * H, block_size, D] view holding each (block, head)."""
    heads = torch.arange(num_kv_heads, device=block_ids.device)
    return block_ids.unsqueeze(-2) * num_kv_heads + heads.unsqueeze(-1)  # [..., H, nb]


def slot_rows(slot_mapping: torch.Tensor, num_kv_heads: int, block_size: int) -> torch.Tensor:
    """Rows of the [num_blocks * H * block_size, D] view that each (token, head) writes."""
    block, offset = slot_mapping // block_size, slot_mapping % block_size
    heads = torch.arange(num_kv_heads, device=slot_mapping.device)
    return ((block.unsqueeze(1) * num_kv_heads + heads) * block_size
            + offset.unsqueeze(1)).reshape(-1)


def write_kv(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
             rows: torch.Tensor) -> None:
    """Store K/V [T, H, D] at ``rows`` (from ``slot_rows``)."""
    d = kv_cache.shape[-1]
    kv_cache[0].view(-1, d).index_copy_(0, rows, k.reshape(-1, d))
    kv_cache[1].view(-1, d).index_copy_(0, rows, v.reshape(-1, d))


def _derived(meta: AttentionMetadata, key: tuple, make):
    """Per-step value shared by all layers (computed by the first layer that asks)."""
    value = meta.derived.get(key)
    if value is None:
        value = meta.derived[key] = make()
    return value


# Prefill chunks whose context is at most this long go through the decode kernel too, one
# query token per row (token i of the chunk sees the context up to its own position): for
# short prompts that costs less than a gather plus a fused-attention call per request.
KERNEL_PREFILL_MAX_LEN = 192


def _kernel_rows(meta: AttentionMetadata, device):
    """The query tokens that the decode kernel attends in a mixed batch: every one-token
    request and every prefill chunk with a short context. Returns their token indices, block
    tables and context lengths (each token's own position + 1), or None."""
    qsl, lens = meta.query_start_loc_cpu, meta.seq_lens_cpu
    toks, reqs, ctx = [], [], []
    for b in range(meta.num_reqs):
        s, e = qsl[b], qsl[b + 1]
        if e - s == 1 or (e > s and lens[b] <= KERNEL_PREFILL_MAX_LEN):
            toks.extend(range(s, e))
            reqs.extend([b] * (e - s))
            ctx.extend(range(lens[b] - (e - s) + 1, lens[b] + 1))
    if not toks:
        return None
    rows = torch.tensor(reqs, dtype=torch.int64, device=device)
    return (torch.tensor(toks, dtype=torch.int64, device=device),
            meta.block_tables.index_select(0, rows),
            torch.tensor(ctx, dtype=torch.int32, device=device))


def _pad_rows(out: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``out`` for the batch's first rows, with zero rows for q's padding rows after them."""
    n = out.shape[0]
    return out if n == q.shape[0] else torch.cat((out, torch.zeros_like(q[n:])))


class TorchAttentionImpl(AttentionImpl):
    def forward(self, q, k, v, kv_cache, meta: AttentionMetadata, kv_stored: bool = False):
        assert not kv_stored, "the torch backend stores K/V itself (accepts_stored_kv)"
        ops = cpu_kernels.ops_for(kv_cache)
        if ops is not None and q.dtype == kv_cache.dtype:
            return self._forward_kernels(ops, q, k, v, kv_cache, meta)
        n_kv, bs = kv_cache.shape[2], kv_cache.shape[3]
        rows = _derived(meta, ("slot_rows", n_kv, bs), lambda: slot_rows(
            meta.slot_mapping[: meta.num_tokens], n_kv, bs))
        write_kv(k, v, kv_cache, rows)
        if meta.max_query_len == 1:
            return _pad_rows(self._decode(q[: meta.num_tokens], kv_cache, meta), q)
        out = torch.zeros_like(q)
        self._prefill_requests(q, kv_cache, meta, out, lambda q_len, seq_len: q_len > 0)
        return out

    def _forward_kernels(self, ops, q, k, v, kv_cache, meta: AttentionMetadata):
        """The CPU path through the C++ kernels (see the module docstring)."""
        n, r = meta.num_tokens, meta.num_reqs
        slots, tables, seq_lens = _derived(meta, ("kernel_args",), lambda: (
            meta.slot_mapping[:n], meta.block_tables[:r], meta.seq_lens[:r]))
        if meta.max_query_len == 1 and n == r:
            return _pad_rows(ops.paged_decode_attention(q[:n], k[:n], v[:n], kv_cache, slots,
                                                        tables, seq_lens, self.scale), q)
        ops.reshape_and_cache(k[:n], v[:n], kv_cache, slots)
        rows = _derived(meta, ("kernel_rows",), lambda: _kernel_rows(meta, q.device) or ())
        if rows and rows[0].numel() == n:  # every token: rows in token order
            return _pad_rows(ops.paged_decode_attention(q[:n], None, None, kv_cache, None,
                                                        rows[1], rows[2], self.scale), q)
        out = torch.zeros_like(q)
        if rows:
            toks, tables1, lens1 = rows
            out[toks] = ops.paged_decode_attention(q.index_select(0, toks), None, None,
                                                   kv_cache, None, tables1, lens1, self.scale)
        # The rest: prefill chunks the kernel rows left out (see _kernel_rows).
        self._prefill_requests(q, kv_cache, meta, out, lambda q_len, seq_len: (
            q_len > 1 and seq_len > KERNEL_PREFILL_MAX_LEN))
        return out

    def _prefill_requests(self, q, kv_cache, meta: AttentionMetadata, out, wanted) -> None:
        """Attends, one request at a time, every request b with wanted(new tokens, context
        length), into its rows of ``out``."""
        qsl, lens, bs = meta.query_start_loc_cpu, meta.seq_lens_cpu, kv_cache.shape[3]
        for b in range(meta.num_reqs):
            s, e = qsl[b], qsl[b + 1]
            if wanted(e - s, lens[b]):
                ids = meta.block_tables[b][: -(-lens[b] // bs)]
                out[s:e] = self._prefill(q[s:e], kv_cache, ids, lens[b], meta, b)

    def _scratch(self, which: int, rows: int, kv_cache: torch.Tensor) -> torch.Tensor:
        bufs = _SCRATCH.setdefault((kv_cache.device, kv_cache.dtype), [None, None])
        buf = bufs[which]
        bs, d = kv_cache.shape[3], kv_cache.shape[4]
        # A buffer made under inference mode (an engine step) cannot be written outside it
        # (a direct call of the backend after an engine ran in the process): a fresh one then.
        if buf is None or buf.shape[0] < rows or buf.shape[1:] != (bs, d) or (
                buf.is_inference() and not torch.is_inference_mode_enabled()):
            buf = bufs[which] = torch.empty((max(rows, 64), bs, d), dtype=kv_cache.dtype,
                                            device=kv_cache.device)
        return buf[:rows]

    def _gather(self, kv_cache, block_ids, meta, key):
        """K, V of the given blocks as [..., H, nb * block_size, D]."""
        _, num_blocks, n_kv, bs, d = kv_cache.shape
        rows = _derived(meta, ("gather", key, n_kv), lambda: _row_index(block_ids, n_kv))
        flat = rows.reshape(-1)
        # index_select copies whole rows (advanced indexing is several times slower on CPU),
        # into buffers reused across steps and layers: fresh multi-MB outputs page-fault.
        k = torch.index_select(kv_cache[0].view(num_blocks * n_kv, bs, d), 0, flat,
                               out=self._scratch(0, flat.numel(), kv_cache))
        v = torch.index_select(kv_cache[1].view(num_blocks * n_kv, bs, d), 0, flat,
                               out=self._scratch(1, flat.numel(), kv_cache))
        shape = (*rows.shape[:-1], rows.shape[-1] * bs, d)
        return k.view(shape), v.view(shape)

    def _prefill(self, q, kv_cache, block_ids, seq_len, meta, b):
        n = q.shape[0]
        k, v = self._gather(kv_cache, block_ids, meta, b)
        k, v = k[:, :seq_len], v[:, :seq_len]
        group = self.num_heads // self.num_kv_heads
        if group > 1:
            k = k.repeat_interleave(group, dim=0)
            v = v.repeat_interleave(group, dim=0)
        # Query i sits at position seq_len - n + i and sees keys 0..that position.
        def causal():
            qpos = torch.arange(seq_len - n, seq_len, device=q.device)
            return torch.arange(seq_len, device=q.device)[None, :] <= qpos[:, None]

        # 4-D inputs: on the CPU only they reach the fused (flash) kernel; 3-D ones take the
        # math path, which materialises [H, n, seq_len] scores (2.4 GB at 8k, 3-8x slower).
        # A whole prompt (no cached context) is plain causal attention, cheaper than a mask.
        whole = n == seq_len
        mask = None if whole else _derived(meta, ("causal", b), causal)
        o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k[None], v[None],
                                           attn_mask=mask, is_causal=whole, scale=self.scale)
        return o[0].transpose(0, 1)

    def _decode(self, q, kv_cache, meta: AttentionMetadata):
        bsz = q.shape[0]
        bs = kv_cache.shape[3]
        nb = -(-meta.max_seq_len // bs)
        block_tables = meta.block_tables[: meta.num_reqs, :nb]
        k, v = self._gather(kv_cache, block_tables, meta, "decode")  # [B, H, L, D]
        group = self.num_heads // self.num_kv_heads
        qg = q.view(bsz, self.num_kv_heads, group, self.head_dim)
        scores = torch.matmul(qg, k.transpose(-1, -2)).mul_(self.scale)  # [B, H, g, L]
        invalid = _derived(meta, ("invalid", nb * bs), lambda: (
            torch.arange(nb * bs, device=q.device)[None, :]
            >= meta.seq_lens[: meta.num_reqs, None])[:, None, None, :])
        scores.masked_fill_(invalid, float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)
        o = torch.matmul(probs, v)  # [B, H, g, D]
        return o.reshape(bsz, self.num_heads, self.head_dim)


class TorchAttentionBackend(AttentionBackend):
    name = "torch"
    impl_cls = TorchAttentionImpl

    @staticmethod
    def kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int,
                       head_dim: int) -> tuple[int, ...]:
        return (2, num_blocks, num_kv_heads, block_size, head_dim)
