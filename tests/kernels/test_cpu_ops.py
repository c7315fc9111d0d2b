"""The C++ CPU kernels (octavo/kernels/cpu) against the torch code they replace."""

from __future__ import annotations

import logging
import random

import pytest
import torch
import torch.nn.functional as F

from octavo.kernels import cpu as cpu_kernels

ops = cpu_kernels.load()
if ops is None:
    pytest.skip("the C++ CPU kernels could not be built here (or OCTAVO_CPU_KERNELS=0)",
                allow_module_level=True)

from octavo.attention.backend import AttentionMetadata  # noqa: E402
from octavo.attention.torch_backend import (  # noqa: E402
    TorchAttentionImpl,
    slot_rows,
    write_kv,
)
from octavo.kernels.rotary import rotary_embedding_ref  # noqa: E402
from octavo.layers.norm import RMSNorm  # noqa: E402
from octavo.layers.rotary import RotaryEmbedding, _apply  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16]
TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ----------------------------------------------------------------------------- RMSNorm


def _norm_layer(hidden: int, dtype: torch.dtype) -> RMSNorm:
    layer = RMSNorm(hidden, eps=1e-6)
    layer.weight.data = (1 + 0.1 * torch.randn(hidden, generator=_gen(1))).to(dtype)
    return layer


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 64), (7, 576), (33, 100), (3, 5, 64)])
def test_rms_norm(dtype, shape):
    layer = _norm_layer(shape[-1], dtype)
    x = (3 * torch.randn(shape, generator=_gen())).to(dtype)
    got = ops.rms_norm(x, layer.weight, layer.eps)
    assert got.dtype == dtype and got.shape == x.shape
    torch.testing.assert_close(got.float(), layer._norm(x).float(), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_strided_heads(dtype):
    """Per-head norm (Qwen3 q/k-norm) on a [T, H, D] view into a fused QKV output."""
    qkv = torch.randn(5, 4 * 32 + 2 * 2 * 32, generator=_gen()).to(dtype)
    q = qkv[:, : 4 * 32].view(5, 4, 32)
    assert not q.is_contiguous()
    layer = _norm_layer(32, dtype)
    torch.testing.assert_close(layer(q).float(), layer._norm(q).float(), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 32, 300])
def test_fused_add_rms_norm(dtype, rows):
    layer = _norm_layer(576, dtype)
    x = torch.randn(rows, 576, generator=_gen()).to(dtype)
    residual = torch.randn(rows, 576, generator=_gen(2)).to(dtype)
    ref_sum = x + residual
    ref = layer._norm(ref_sum)
    xk, rk = x.clone(), residual.clone()
    ops.fused_add_rms_norm(xk, rk, layer.weight, layer.eps)
    torch.testing.assert_close(rk, ref_sum, atol=0, rtol=0)
    torch.testing.assert_close(xk.float(), ref.float(), **TOL[dtype])
    # Through the module: same values, returned as (normed, residual).
    got, res = layer(x.clone(), residual.clone())
    torch.testing.assert_close(res, ref_sum, atol=0, rtol=0)
    torch.testing.assert_close(got.float(), ref.float(), **TOL[dtype])


# ----------------------------------------------------------------------------- SiLU


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 2 * 1536), (32, 2 * 1536), (3, 4, 2 * 40),
                                   (1, 2 * 8960), (3, 2 * 5003)])
def test_silu_and_mul(dtype, shape):
    """Split over the threads by outputs (one long row; ranges across rows): each output the
    same as the row alone gives."""
    x = (4 * torch.randn(shape, generator=_gen())).to(dtype)
    d = shape[-1] // 2
    ref = F.silu(x[..., :d]) * x[..., d:]
    got = ops.silu_and_mul(x)
    assert got.shape == ref.shape and got.dtype == dtype
    torch.testing.assert_close(got.float(), ref.float(), **TOL[dtype])
    rows = x.reshape(-1, 2 * d)
    alone = torch.cat([ops.silu_and_mul(rows[i:i + 1].contiguous()) for i in range(len(rows))])
    assert torch.equal(got.reshape(-1, d), alone)


# ----------------------------------------------------------------------------- rotary


def _qkv_views(tokens, hq, hkv, d, dtype):
    qkv = torch.randn(tokens, (hq + 2 * hkv) * d, generator=_gen()).to(dtype)
    q, k, _ = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    return q.reshape(tokens, hq, d), k.reshape(tokens, hkv, d)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", [(9, 3, 64), (4, 4, 16), (8, 2, 128)])
def test_rotary_matches_torch_path(dtype, heads):
    hq, hkv, d = heads
    rope = RotaryEmbedding(d, 512, 10000.0)
    positions = torch.randint(0, 512, (11,), generator=_gen())
    q, k = _qkv_views(11, hq, hkv, d, dtype)
    assert not q.is_contiguous() and not k.is_contiguous()
    cos, sin = rope.cos_sin_cache[positions].to(dtype).chunk(2, dim=-1)
    cos, sin = torch.cat((cos, cos), -1).unsqueeze(1), torch.cat((sin, sin), -1).unsqueeze(1)
    ref_q, ref_k = _apply(q, cos, sin), _apply(k, cos, sin)
    ops.rotary_embedding(positions, q, k, rope.cos_sin_cache, d)
    torch.testing.assert_close(q.float(), ref_q.float(), **TOL[dtype])
    torch.testing.assert_close(k.float(), ref_k.float(), **TOL[dtype])


def test_rotary_partial_rot_dim():
    positions = torch.randint(0, 100, (6,), generator=_gen())
    table = torch.randn(100, 32, generator=_gen(3))  # rot_dim 32 of head_dim 64
    q, k = _qkv_views(6, 4, 2, 64, torch.float32)
    rq, rk = q.clone(), k.clone()
    rotary_embedding_ref(positions, rq, rk, table, 64)
    ops.rotary_embedding(positions, q, k, table, 64)
    torch.testing.assert_close(q, rq, **TOL[torch.float32])
    torch.testing.assert_close(k, rk, **TOL[torch.float32])


def test_rotary_rejects_positions_outside_the_table():
    q, k = _qkv_views(2, 2, 1, 16, torch.float32)
    with pytest.raises(RuntimeError, match="outside the table"):
        ops.rotary_embedding(torch.tensor([0, 8]), q, k, torch.zeros(8, 16), 16)


# ----------------------------------------------------------------------------- paged cache


def _cache(num_blocks, hkv, bs, d, dtype, seed=0):
    return torch.randn(2, num_blocks, hkv, bs, d, generator=_gen(seed)).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", [1, 8, 16])
def test_reshape_and_cache(dtype, block_size):
    hkv, d, num_blocks, tokens = 3, 64, 40, 25
    cache = _cache(num_blocks, hkv, block_size, d, dtype)
    slots = torch.randperm(num_blocks * block_size, generator=_gen())[:tokens]
    slots[[3, 11]] = -1  # padding tokens: not stored
    qkv = torch.randn(tokens, 5 * hkv * d, generator=_gen(4)).to(dtype)
    k = qkv[:, 3 * hkv * d: 4 * hkv * d].view(tokens, hkv, d)
    v = qkv[:, 4 * hkv * d:].view(tokens, hkv, d)
    ref = cache.clone()
    keep = slots >= 0
    write_kv(k[keep], v[keep], ref, slot_rows(slots[keep], hkv, block_size))
    ops.reshape_and_cache(k, v, cache, slots)
    assert torch.equal(cache, ref)


def _decode_batch(seq_lens, hq, hkv, d, bs, dtype, seed=0):
    """A shuffled block pool, each request's blocks, and one query token per request."""
    gen = _gen(seed)
    need = [-(-n // bs) for n in seq_lens]
    num_blocks = sum(need) + 3
    perm = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    tables = torch.zeros(len(seq_lens), max(need) + 2, dtype=torch.int32)
    used = 0
    for b, n in enumerate(need):
        tables[b, :n] = perm[used: used + n]
        used += n
    cache = _cache(num_blocks, hkv, bs, d, dtype, seed)
    qkv = torch.randn(len(seq_lens), (hq + 2 * hkv) * d, generator=gen).to(dtype)
    q = qkv[:, : hq * d].view(len(seq_lens), hq, d)
    return q, cache, tables, torch.tensor(seq_lens, dtype=torch.int32)


def _attention_ref(q, cache, tables, seq_lens, scale):
    """Plain softmax attention of each request's query over its gathered K/V, in fp32."""
    _, _, hkv, bs, d = cache.shape
    out = torch.empty(q.shape, dtype=torch.float32)
    for b, n in enumerate(seq_lens.tolist()):
        ids = tables[b, : -(-n // bs)].long()
        k = cache[0, ids].float().transpose(0, 1).reshape(hkv, -1, d)[:, :n]
        v = cache[1, ids].float().transpose(0, 1).reshape(hkv, -1, d)[:, :n]
        g = q.shape[1] // hkv
        k, v = k.repeat_interleave(g, 0), v.repeat_interleave(g, 0)
        p = torch.softmax(q[b].float()[:, None, :] @ k.transpose(1, 2) * scale, dim=-1)
        out[b] = (p @ v)[:, 0]
    return out


DECODE_CASES = [
    # (seq_lens, Hq, Hkv, D, block_size)
    ([1, 16, 17, 110, 64, 33], 9, 3, 64, 16),  # SmolLM2's heads: GQA group 3
    ([5, 48, 100, 1], 8, 2, 128, 16),  # group 4, head_dim 128
    ([7, 1, 20], 4, 4, 64, 8),  # group 1
    ([3, 9, 40], 6, 2, 80, 1),  # head_dim outside the fixed sizes, block size 1
    ([2, 31, 32], 4, 2, 16, 16),  # tiny heads (the test models)
    ([1000], 6, 2, 64, 16),  # one long request: split into context partitions
    ([700, 1, 300], 4, 1, 32, 8),  # few requests, ragged, split
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", DECODE_CASES, ids=lambda c: f"{c[1]}-{c[2]}-{c[3]}-bs{c[4]}")
def test_paged_decode_attention(dtype, case):
    seq_lens, hq, hkv, d, bs = case
    q, cache, tables, lens = _decode_batch(seq_lens, hq, hkv, d, bs, dtype)
    scale = d ** -0.5
    got = ops.paged_decode_attention(q, None, None, cache, None, tables, lens, scale)
    assert got.shape == q.shape and got.dtype == dtype
    ref = _attention_ref(q, cache, tables, lens, scale)
    tol = dict(atol=1e-5, rtol=1e-4) if dtype == torch.float32 else TOL[dtype]
    torch.testing.assert_close(got.float(), ref, **tol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_paged_decode_attention_stores_new_kv_first(dtype):
    """With k/v/slot_mapping, each request's new token is stored, then attended to."""
    seq_lens, hq, hkv, d, bs = [5, 16, 17, 40], 9, 3, 64, 16
    q, cache, tables, lens = _decode_batch(seq_lens, hq, hkv, d, bs, dtype)
    slots = torch.tensor([int(tables[b, (n - 1) // bs]) * bs + (n - 1) % bs
                          for b, n in enumerate(seq_lens)])
    new = torch.randn(len(seq_lens), 2 * hkv * d, generator=_gen(5)).to(dtype)
    k = new[:, : hkv * d].view(-1, hkv, d)
    v = new[:, hkv * d:].view(-1, hkv, d)
    ref_cache = cache.clone()
    write_kv(k, v, ref_cache, slot_rows(slots, hkv, bs))
    got = ops.paged_decode_attention(q, k, v, cache, slots, tables, lens, d ** -0.5)
    assert torch.equal(cache, ref_cache)
    ref = _attention_ref(q, ref_cache, tables, lens, d ** -0.5)
    torch.testing.assert_close(got.float(), ref, **(dict(atol=1e-5, rtol=1e-4)
                                                   if dtype == torch.float32 else TOL[dtype]))


def test_paged_decode_attention_checks_block_table():
    q, cache, tables, lens = _decode_batch([20], 2, 1, 16, 16, torch.float32)
    tables[0, 1] = cache.shape[1]  # out of the pool
    with pytest.raises(RuntimeError, match="out of range"):
        ops.paged_decode_attention(q, None, None, cache, None, tables, lens, 0.25)
    with pytest.raises(RuntimeError, match="does not fit"):
        ops.paged_decode_attention(q, None, None, cache, None, tables[:, :1], lens, 0.25)


# ----------------------------------------------------------------------------- backend


def _metadata(q_lens, seq_lens, tables, bs):
    qsl = [0]
    for n in q_lens:
        qsl.append(qsl[-1] + n)
    slots = []
    for b, (nq, n) in enumerate(zip(q_lens, seq_lens)):
        for pos in range(n - nq, n):
            slots.append(int(tables[b, pos // bs]) * bs + pos % bs)
    return AttentionMetadata(
        num_tokens=qsl[-1], num_reqs=len(q_lens),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32), block_tables=tables,
        slot_mapping=torch.tensor(slots, dtype=torch.int64), max_query_len=max(q_lens),
        max_seq_len=max(seq_lens), query_start_loc_cpu=qsl, seq_lens_cpu=list(seq_lens))


@pytest.mark.parametrize("q_lens,seq_lens", [
    ([1, 1, 1, 1], [9, 16, 17, 1]),  # decode batch
    ([9, 1, 17, 1, 1], [30, 13, 17, 1, 40]),  # short prefill chunks mixed with decodes
    ([5, 1, 200, 3], [300, 7, 200, 40]),  # long contexts: the gather + SDPA path
])
def test_torch_backend_kernels_match_torch_path(monkeypatch, q_lens, seq_lens):
    hq, hkv, d, bs = 6, 2, 64, 16
    gen = _gen()
    _, cache, tables, _ = _decode_batch(seq_lens, hq, hkv, d, bs, torch.float32)
    cache.zero_()
    t = sum(q_lens)
    q = torch.randn(t, hq, d, generator=gen)
    k = torch.randn(t, hkv, d, generator=gen)
    v = torch.randn(t, hkv, d, generator=gen)
    # Context before each request's new tokens already in the cache.
    pre = _metadata([n - nq for nq, n in zip(q_lens, seq_lens)], seq_lens, tables, bs)
    ctx = torch.randn(pre.num_tokens, 2, hkv, d, generator=gen)
    write_kv(ctx[:, 0], ctx[:, 1], cache, slot_rows(pre.slot_mapping, hkv, bs))
    impl = TorchAttentionImpl(hq, d, d ** -0.5, hkv)

    ref_cache = cache.clone()
    with monkeypatch.context() as m:
        m.setattr(cpu_kernels, "ops_for", lambda x: None)
        ref = impl.forward(q, k, v, ref_cache, _metadata(q_lens, seq_lens, tables, bs))
    got = impl.forward(q, k, v, cache, _metadata(q_lens, seq_lens, tables, bs))
    assert torch.equal(cache, ref_cache)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-4)


# ----------------------------------------------------------------------------- loader


def test_loader_off_and_build_failure_fall_back(monkeypatch, caplog):
    monkeypatch.setattr(cpu_kernels, "_tried", False)
    monkeypatch.setattr(cpu_kernels, "_module", None)
    monkeypatch.setenv("OCTAVO_CPU_KERNELS", "0")
    assert cpu_kernels.load() is None
    assert cpu_kernels.ops_for(torch.zeros(1)) is None

    def broken():
        raise RuntimeError("no compiler")

    monkeypatch.setattr(cpu_kernels, "_tried", False)
    monkeypatch.setenv("OCTAVO_CPU_KERNELS", "1")
    monkeypatch.setattr(cpu_kernels, "_build", broken)
    with caplog.at_level(logging.WARNING, logger="octavo.kernels.cpu"):
        assert cpu_kernels.load() is None
        assert cpu_kernels.load() is None
    assert sum("unavailable" in r.message for r in caplog.records) == 1


def test_ops_for_skips_unsupported_tensors():
    assert cpu_kernels.ops_for(torch.zeros(2, dtype=torch.float32)) is ops
    assert cpu_kernels.ops_for(torch.zeros(2, dtype=torch.float16)) is None
    assert cpu_kernels.ops_for(torch.zeros(2, dtype=torch.float64)) is None


def test_build_name_tracks_sources():
    assert cpu_kernels.build_name() == cpu_kernels.build_name()
    assert cpu_kernels.build_name().startswith("octavo_cpu_ops_")


# ----------------------------------------------------------------------------- end to end


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_greedy_identical_with_kernels_on_and_off(family, tmp_path, monkeypatch):
    from octavo import LLM, SamplingParams
    from tests.tiny_models import make_checkpoint

    folder = make_checkpoint(family, str(tmp_path / family))
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 512) for _ in range(n)] for n in (1, 5, 16, 17, 40)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)

    def run():
        llm = LLM(model=folder, dtype="float32", skip_tokenizer_init=True, block_size=8,
                  max_num_batched_tokens=32)  # chunked prefill: mixed batches too
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                            use_tqdm=False)
        return [o.outputs[0].token_ids for o in outs]

    on = run()
    monkeypatch.setattr(cpu_kernels, "ops_for", lambda x: None)
    off = run()
    assert on == off


def test_scratch_made_in_an_engine_step_serves_calls_outside_inference_mode(monkeypatch):
    """The gather's reused buffers: one made under inference mode (an engine step) is
    replaced, not written, by a call outside it (a direct call after an engine ran in the
    process), which torch would refuse; inside inference mode it is reused."""
    from octavo.attention import torch_backend as tb

    monkeypatch.setattr(tb, "_SCRATCH", {})
    impl = object.__new__(tb.TorchAttentionImpl)
    cache = torch.zeros(2, 4, 2, 16, 8)
    with torch.inference_mode():
        made = impl._scratch(0, 8, cache)
        assert made.is_inference() and impl._scratch(0, 8, cache).data_ptr() == made.data_ptr()
    out = impl._scratch(0, 8, cache)
    assert not out.is_inference()
    torch.index_select(torch.ones(8, 16, 8), 0, torch.arange(8), out=out)  # writable
    assert out.sum().item() == 8 * 16 * 8
