"""The qkv FP8 GEMV with the rotating store asks L2 for the cache blocks of the keys cached
before the step, before its PDL wait (OCTAVO_QKV_KV_PREFETCH), so the attention launch after
it finds them there: the machine code's order (offline, sm_90), the launch arguments the host
derives, and on the GPU the same bits with it and without, kernel and engine."""

from __future__ import annotations

import re

import pytest
import torch

pytest.importorskip("triton")

from octavo import envs  # noqa: E402
from octavo.attention.backend import KVStore  # noqa: E402
from octavo.kernels import fp8_gemv as fg  # noqa: E402
from tests.kernels.sm90 import compile_sm90  # noqa: E402

_CONSTS = ["BLOCK_M=1", "BLOCK_N=16", "BLOCK_K=512", "BITS=0", "X_LOAD=2", "GLU=0", "ROPE=1",
           "HEAD_DIM=128", "STAGES=2", "PDL=1"]


def _compile(kv_pf: int):
    return compile_sm90(
        "octavo.kernels.fp8_gemv:_fp8_gemv_kernel", "--const", *_CONSTS, f"KV_PF={kv_pf}",
        "--ptr", "x_ptr=i64", "w_ptr=i32", "s_ptr=fp32", "out_ptr=bf16", "part_ptr=fp32",
        "cnt_ptr=i32", "pos_ptr=i64", "cs_ptr=fp32", "kc_ptr=bf16", "vc_ptr=bf16",
        "slot_ptr=i64", "bt_ptr=i32", "seq_ptr=i32",
        "--div16", "stride_xm", "stride_wn", "stride_om", "stride_ps", "stride_pm",
        "stride_cs", "stride_cb", "stride_ct", "stride_ch", "stride_bt", "block_bytes", "K",
        "K_PER_SPLIT", "N", "Q_N", "QK_N",
        "--ones", "stride_xk", "stride_on", "stride_pn", "--num-warps", "8")


def _hot_loop(report: str) -> int:
    found = re.search(r"hot loop \(\S+\): (\d+) instructions", report)
    assert found, report
    return int(found.group(1))


def test_sm90_code_prefetches_the_cache_before_the_wait():
    """Llama-3.1-8B's qkv tile (16 x 512 over 8 warps): with KV_PF the block table and
    sequence lengths are read and the K / V blocks' bulk L2 prefetches (UBLKPF.L2) issued
    before griddepcontrol.wait, and the weight loop keeps its instructions; without, no
    prefetch at all."""
    code = _compile(1)
    assert code.ptx.index("cp.async.bulk.prefetch.L2.global") \
        < code.ptx.index("griddepcontrol.wait")
    assert code.ptx.count("cp.async.bulk.prefetch.L2.global") == 2  # K and V
    assert "UBLKPF.L2" in code.sass
    plain = _compile(0)
    assert "cp.async.bulk.prefetch" not in plain.ptx and "UBLKPF" not in plain.sass
    assert _hot_loop(code.report) == _hot_loop(plain.report)


def _store(m=1, reqs=3, blocks=40, max_blocks=12, hkv=8, d=128, bs=16,
           dtype=torch.bfloat16):
    cache = torch.zeros(2, blocks, bs, hkv, d, dtype=dtype)
    bt = torch.zeros(reqs, max_blocks, dtype=torch.int32)
    seq = torch.full((reqs,), 33, dtype=torch.int32)
    return torch.zeros(m, 64, dtype=torch.bfloat16), KVStore(
        None, cache[0], cache[1], torch.zeros(m, dtype=torch.int64), bt, seq)


def test_prefetch_arguments(monkeypatch):
    """One request per row of x, at most the block table's blocks and KV_PREFETCH_BYTES of
    K and V, a block's bytes over all heads; None without PDL (the CPU), with the flag off,
    without a block table, or with a cache whose blocks are not contiguous."""
    x, store = _store()
    assert fg.kv_prefetch_args(x, store) is None  # no PDL on the CPU
    monkeypatch.setattr(fg, "pdl_enabled", lambda device: True)
    bt, seq, stride_bt, reqs, blocks, block_bytes = fg.kv_prefetch_args(x, store)
    assert bt is store.block_tables and seq is store.seq_lens and stride_bt == 12
    assert (reqs, blocks, block_bytes) == (1, 12, 16 * 8 * 128 * 2)
    x2, big = _store(m=2, max_blocks=4096)
    args = fg.kv_prefetch_args(x2, big)
    assert args[3] == 2 and args[4] == fg.KV_PREFETCH_BYTES // (2 * 2 * 32768) == 32
    monkeypatch.setenv("OCTAVO_QKV_KV_PREFETCH", "0")
    assert not envs.qkv_kv_prefetch()
    assert fg.kv_prefetch_args(x, store) is None
    monkeypatch.delenv("OCTAVO_QKV_KV_PREFETCH")
    assert envs.qkv_kv_prefetch()
    no_table = KVStore(None, store.key_cache, store.value_cache, store.slots)
    assert fg.kv_prefetch_args(x, no_table) is None
    cache = torch.zeros(2, 40, 8, 16, 128, dtype=torch.bfloat16).transpose(2, 3)
    strided = KVStore(None, cache[0], cache[1], store.slots, store.block_tables,
                      store.seq_lens)
    assert fg.kv_prefetch_args(x, strided) is None
    wide = KVStore(None, store.key_cache, store.value_cache, store.slots,
                   store.block_tables.long(), store.seq_lens)
    assert fg.kv_prefetch_args(x, wide) is None


def test_attention_layer_hands_the_step_tables_to_the_store():
    """``Attention.kv_store`` carries the step's block table and sequence lengths."""
    from types import SimpleNamespace

    from octavo.attention.layer import Attention

    meta = SimpleNamespace(slot_mapping=torch.tensor([7]), block_tables=torch.zeros(1, 4),
                           seq_lens=torch.tensor([8]))
    cache = torch.zeros(2, 4, 16, 2, 8)
    layer = SimpleNamespace(impl=SimpleNamespace(accepts_stored_kv=True), layer_idx=0)
    ctx = SimpleNamespace(attn_metadata=meta, kv_caches=[cache])
    store = Attention.kv_store(layer, None, ctx, num_tokens=1)
    assert store.block_tables is meta.block_tables and store.seq_lens is meta.seq_lens
    assert store.slots.tolist() == [7]


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("m", [1, 2])
def test_kernel_outputs_are_unchanged_gpu(m):
    """Llama-3.1-8B's qkv shape, contexts over several blocks: q and the cache the same bits
    with the prefetch (its arguments taken) as without."""
    from octavo.kernels.pdl import enabled

    dev = torch.device("cuda")
    if not enabled(dev):
        pytest.skip("needs PDL (sm_90+)")
    g = torch.Generator().manual_seed(0)
    hq, hkv, d, k, bs, blocks = 32, 8, 128, 4096, 16, 64
    n = (hq + 2 * hkv) * d
    weight = (torch.randn(n, k, generator=g) * 100).clamp(-448, 448).to(dev, torch.float8_e4m3fn)
    scale = (torch.rand(n, generator=g) * 0.01 + 1e-4).to(dev)
    x = torch.randn(m, k, generator=g).to(dev, torch.bfloat16)
    from octavo.layers.rotary import RotaryEmbedding

    table = RotaryEmbedding(d, 4096, 10000.0).cos_sin_cache.to(dev)
    pos = torch.tensor([300, 17][:m], device=dev)
    cache = torch.randn(2, blocks, bs, hkv, d, generator=g).to(dev, torch.bfloat16)
    bt = torch.randperm(blocks, generator=g)[: 2 * 20].view(2, 20).to(dev, torch.int32)
    seq = torch.tensor([301, 18], dtype=torch.int32, device=dev)
    slots = (bt[:m, 0].long() * bs + 3)
    outs = []
    for tables in (True, False):
        c = cache.clone()
        store = KVStore(None, c[0], c[1], slots, bt[:m] if tables else None,
                        seq[:m] if tables else None)
        assert (fg.kv_prefetch_args(x, store) is not None) == tables
        outs.append((fg.fp8_gemv_qkv_rope(x, weight, scale, pos, table, hq, hkv, d, store), c))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("eager", [True, False])
def test_engine_greedy_unchanged_gpu(tmp_path, monkeypatch, eager):
    """One-row fp8 decodes on the fused qkv GEMV: the same greedy tokens and logprobs, bit
    for bit, with OCTAVO_QKV_KV_PREFETCH=1 (its arguments taken at every fused call) as with
    =0."""
    import json

    from tests.kernels import cuda_checks
    from tests.kernels.test_dense_mma_fp8 import _LLAMA_512, _liven_fp8

    config = {**_LLAMA_512, "quantization_config": {"quant_method": "fp8",
                                                     "activation_scheme": "dynamic"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    taken = []
    real = fg.kv_prefetch_args

    def spy(*args, **kw):
        out = real(*args, **kw)
        taken.append(out is not None)
        return out

    monkeypatch.setattr(fg, "kv_prefetch_args", spy)
    one = cuda_checks.PROMPTS[:1]
    monkeypatch.setenv("OCTAVO_QKV_KV_PREFETCH", "0")
    plain = cuda_checks.greedy_decode(tmp_path, _liven_fp8, eager, prompts=one)
    assert taken and not any(taken)
    taken.clear()
    monkeypatch.setenv("OCTAVO_QKV_KV_PREFETCH", "1")
    early = cuda_checks.greedy_decode(tmp_path, _liven_fp8, eager, prompts=one)
    assert taken and all(taken)
    assert early == plain
