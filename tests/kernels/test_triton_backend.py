"""TritonAttentionImpl against TorchAttentionImpl: same outputs, same caches afterwards."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from octavo.attention.backend import AttentionMetadata  # noqa: E402
from octavo.attention.registry import get_backend  # noqa: E402
from octavo.attention.torch_backend import TorchAttentionBackend  # noqa: E402
from octavo.attention.triton_backend import (  # noqa: E402
    TritonAttentionBackend,
    TritonAttentionImpl,
)

TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def make_step(q_lens, seq_lens, num_heads, num_kv_heads, head_dim, block_size, dtype, device,
              pad_tokens=0, seed=0):
    """Random q/k/v, a random paged cache and full metadata for one step.

    Request b has ``q_lens[b]`` new tokens at the end of a ``seq_lens[b]``-token context; its
    blocks are shuffled over the pool. ``pad_tokens`` extra rows mimic CUDA-graph padding:
    they belong to no request and their slot is -1.
    """
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_seq) + 2
    max_blocks = max(blocks_per_seq) + 1  # a column of padding
    perm = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    table = torch.zeros(len(seq_lens), max_blocks, dtype=torch.int32)
    used = 0
    for b, n in enumerate(blocks_per_seq):
        table[b, :n] = perm[used: used + n]
        used += n

    num_tokens = sum(q_lens)
    t = num_tokens + pad_tokens
    slots = []
    for b, (ql, sl) in enumerate(zip(q_lens, seq_lens)):
        for pos in range(sl - ql, sl):
            slots.append(int(table[b, pos // block_size]) * block_size + pos % block_size)
    slots += [-1] * pad_tokens
    qsl = [0]
    for ql in q_lens:
        qsl.append(qsl[-1] + ql)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen).to(dtype).to(device)

    kv_cache = rnd(*TritonAttentionBackend.kv_cache_shape(num_blocks, block_size, num_kv_heads,
                                                          head_dim))
    q, k, v = rnd(t, num_heads, head_dim), rnd(t, num_kv_heads, head_dim), rnd(
        t, num_kv_heads, head_dim)
    meta = AttentionMetadata(
        num_tokens=num_tokens,
        num_reqs=len(q_lens),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=table.to(device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        max_query_len=max(q_lens),
        max_seq_len=max(seq_lens),
        query_start_loc_cpu=qsl,
        seq_lens_cpu=list(seq_lens),
    )
    return q, k, v, kv_cache, meta


def to_torch_layout(cache: torch.Tensor) -> torch.Tensor:
    """[2, blocks, block_size, H, D] (triton) -> [2, blocks, H, block_size, D] (torch)."""
    return cache.transpose(2, 3).contiguous()


def from_torch_layout(cache: torch.Tensor) -> torch.Tensor:
    return cache.transpose(2, 3)


def run_both(q_lens, seq_lens, num_heads, num_kv_heads, head_dim, block_size, device,
             dtype=torch.float32, pad_tokens=0, seed=0):
    q, k, v, cache, meta = make_step(q_lens, seq_lens, num_heads, num_kv_heads, head_dim,
                                     block_size, dtype, device, pad_tokens, seed)
    scale = head_dim ** -0.5
    args = (num_heads, head_dim, scale, num_kv_heads)
    ref_cache, tri_cache = to_torch_layout(cache), cache.clone()
    n = meta.num_tokens
    # The torch impl indexes the cache with the unpadded slots only; give it the real rows.
    ref = TorchAttentionBackend.make_impl(*args).forward(q[:n], k[:n], v[:n], ref_cache, meta)
    impl = TritonAttentionBackend.make_impl(*args)
    assert isinstance(impl, TritonAttentionImpl)
    got = impl.forward(q, k, v, tri_cache, meta)
    assert got.shape == q.shape and got.dtype == q.dtype
    torch.testing.assert_close(got[:n], ref, **TOL[dtype])
    torch.testing.assert_close(tri_cache, from_torch_layout(ref_cache), atol=0, rtol=0)
    return got, meta


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (8, 2)])
def test_decode_only(device, num_heads, num_kv_heads):
    run_both([1] * 5, [1, 7, 16, 17, 40], num_heads, num_kv_heads, 32, 4, device)


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (8, 2)])
def test_mixed_prefill_and_decode(device, num_heads, num_kv_heads):
    # A fresh prompt, decodes, a chunked-prefill continuation, a request with no new token.
    q_lens = [9, 1, 6, 1, 0, 3]
    seq_lens = [9, 13, 20, 5, 11, 3]
    run_both(q_lens, seq_lens, num_heads, num_kv_heads, 32, 4, device, seed=1)


def test_single_prefill_gqa_odd_head_dim(device):
    run_both([21], [30], 6, 2, 24, 8, device, seed=2)


def test_decode_split_k(device):
    # Few sequences x long context: the decode launch splits the KV range (see
    # paged_attention._pick_num_splits) and merges the partials.
    run_both([1, 1], [600, 37], 4, 2, 16, 16, device, seed=3)


@pytest.mark.parametrize("mixed", [False, True])
def test_padded_batch(device, mixed):
    """CUDA-graph style padding: extra rows with slot -1 that belong to no request."""
    q_lens, seq_lens = ([1, 1, 1], [5, 12, 3]) if not mixed else ([4, 1, 1], [4, 12, 3])
    got, meta = run_both(q_lens, seq_lens, 8, 2, 32, 4, device, pad_tokens=5, seed=4)
    # Padding rows are never attended; the backend zeroes them.
    assert torch.count_nonzero(got[meta.num_tokens:]) == 0


def test_bf16_mixed(device):
    run_both([7, 1, 1], [7, 30, 9], 8, 2, 32, 4, device, dtype=torch.bfloat16, seed=5)


def test_slot_mapping_longer_than_batch(device):
    """meta.slot_mapping padded past q.shape[0] (graph capture at a larger size)."""
    q, k, v, cache, meta = make_step([1, 1], [6, 9], 4, 2, 32, 4, torch.float32, device, seed=6)
    ref_cache, tri_cache = to_torch_layout(cache), cache.clone()
    args = (4, 32, 32 ** -0.5, 2)
    ref = TorchAttentionBackend.make_impl(*args).forward(q, k, v, ref_cache, meta)
    meta.slot_mapping = torch.cat([meta.slot_mapping,
                                   torch.full((6,), -1, dtype=torch.int64, device=device)])
    got = TritonAttentionBackend.make_impl(*args).forward(q, k, v, tri_cache, meta)
    torch.testing.assert_close(got, ref, **TOL[torch.float32])
    torch.testing.assert_close(tri_cache, from_torch_layout(ref_cache), atol=0, rtol=0)


def test_registry():
    assert get_backend("triton") is TritonAttentionBackend
    assert TritonAttentionBackend.name == "triton"
    assert TritonAttentionBackend.supports(torch.device("cuda"))


def _decode_meta(num_reqs: int, max_query_len: int = 1) -> AttentionMetadata:
    lens = torch.tensor([(37 * b) % 101 + 1 for b in range(num_reqs)], dtype=torch.int32)
    return AttentionMetadata(
        num_tokens=num_reqs, num_reqs=num_reqs,
        query_start_loc=torch.arange(num_reqs + 1, dtype=torch.int32), seq_lens=lens,
        block_tables=torch.zeros(num_reqs, 8, dtype=torch.int32),
        slot_mapping=torch.zeros(num_reqs, dtype=torch.int64), max_query_len=max_query_len,
        max_seq_len=128, query_start_loc_cpu=[], seq_lens_cpu=lens.tolist())


@pytest.mark.parametrize("env,num_reqs,expected", [
    (None, 33, True),   # 33 x 8 KV heads = 264 programs: two per SM of 132
    (None, 32, False),  # 256: split or one wave, the sort would only cost
    ("1", 2, True), ("0", 256, False),
])
def test_decode_order_longest_first_on_full_grids(env, num_reqs, expected, monkeypatch):
    """A decode-only step whose grid holds two programs per SM walks its requests longest
    context first (one argsort per step, shared by every layer); OCTAVO_ATTN_LONGEST_FIRST
    forces it on or off. Prefill steps and the CPU never sort."""
    from octavo.attention import triton_backend as tb

    monkeypatch.setattr(tb, "num_compute_units", lambda device: 132)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    if env is None:
        monkeypatch.delenv("OCTAVO_ATTN_LONGEST_FIRST", raising=False)
    else:
        monkeypatch.setenv("OCTAVO_ATTN_LONGEST_FIRST", env)
    meta = _decode_meta(num_reqs)
    order = tb._decode_order(meta, 8, torch.device("cuda"))
    if not expected:
        assert order is None
        return
    assert order.dtype == torch.int32 and sorted(order.tolist()) == list(range(num_reqs))
    lens = meta.seq_lens[order.long()].tolist()
    assert lens == sorted(lens, reverse=True)
    assert tb._decode_order(meta, 8, torch.device("cuda")) is order  # once per step
    assert tb._decode_order(_decode_meta(num_reqs, 5), 8, torch.device("cuda")) is None
    assert tb._decode_order(meta, 8, torch.device("cpu")) is None
