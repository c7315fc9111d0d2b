"""A split decode attention launch under PDL reads its request's metadata and asks L2 for its
first K/V rows of keys cached before the step, before its wait (OCTAVO_ATTN_EARLY_KV): the
machine code's order (offline, sm_90), and on the GPU the same outputs, bit for bit, with it
and without, kernel and engine."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from octavo import envs  # noqa: E402
from tests.kernels.sm90 import compile_sm90  # noqa: E402

_CONSTS = ["DECODE=1", "GROUP=4", "BLOCK_Q=1", "BLOCK_M=16", "BLOCK_N=32", "BLOCK_SIZE=16",
           "HEAD_DIM=128", "HEAD_DIM_P=128", "SPLIT=1", "MERGE=0", "MIN_SPLIT=32",
           "SPLITS_P=16", "DOT_PRECISION=tf32", "UPCAST_DOT=0", "ORDER=0", "ROW_BYTES=256",
           "PDL=1"]


def _compile(early_rows: int) -> tuple[str, str]:
    code = compile_sm90(
        "octavo.kernels.paged_attention:_paged_attention_kernel",
        "--const", *_CONSTS, f"EARLY_ROWS={early_rows}",
        "--ptr", "out_ptr=bf16", "q_ptr=bf16", "k_cache_ptr=bf16", "v_cache_ptr=bf16",
        "qsl_ptr=i32", "seq_lens_ptr=i32", "block_tables_ptr=i32", "part_acc_ptr=fp32",
        "part_ml_ptr=fp32", "cnt_ptr=i32", "order_ptr=i32",
        "--div16", "stride_qt", "stride_ot", "stride_kb", "stride_kt", "stride_vb",
        "stride_vt", "stride_bt", "stride_qh", "stride_oh", "stride_kh", "stride_vh",
        "--f32", "qk_scale", "--num-warps", "4", "--num-stages", "2")
    return code.ptx, code.sass


def test_sm90_code_reads_metadata_and_prefetches_before_the_wait():
    """With EARLY_ROWS the PTX issues the K/V rows' bulk L2 prefetches (UBLKPF.L2 in the
    SASS) and the seq_lens / block-table loads between the PDL trigger and the wait, and q's
    load after it; without, the trigger and the wait are back to back and nothing is
    prefetched."""
    ptx, sass = _compile(64)
    trigger = ptx.index("griddepcontrol.launch_dependents")
    wait = ptx.index("griddepcontrol.wait")
    assert trigger < ptx.index("cp.async.bulk.prefetch.L2.global") < wait
    assert "UBLKPF.L2" in sass
    assert "ld.global" in ptx[trigger:wait]  # metadata and block-table entries
    plain, plain_sass = _compile(0)
    assert "cp.async.bulk.prefetch" not in plain and "UBLKPF" not in plain_sass
    between = plain[plain.index("griddepcontrol.launch_dependents"):
                    plain.index("griddepcontrol.wait")]
    assert "ld.global" not in between


def test_env_flag(monkeypatch):
    monkeypatch.delenv("OCTAVO_ATTN_EARLY_KV", raising=False)
    assert envs.attn_early_kv()
    monkeypatch.setenv("OCTAVO_ATTN_EARLY_KV", "0")
    assert not envs.attn_early_kv()


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("splits,merge", [(4, False), (16, False), (4, True)])
def test_kernel_outputs_are_unchanged_gpu(monkeypatch, splits, merge):
    """A decode batch (contexts 1-700 keys, GQA 4:1, head_dim 128) split 4 / 16 ways,
    merged by the second launch or in the launch: the same bits with the early reads as
    without, eagerly and replayed from a CUDA graph after the lengths change."""
    from octavo.kernels.paged_attention import paged_attention
    from octavo.kernels.pdl import enabled

    dev = torch.device("cuda")
    if not enabled(dev):
        pytest.skip("needs PDL (sm_90+)")
    g = torch.Generator().manual_seed(0)
    b, hq, hkv, d, bs, blocks = 6, 32, 8, 128, 16, 300
    lens = torch.tensor([1, 17, 300, 640, 700, 64], dtype=torch.int32)
    q = torch.randn(b, hq, d, generator=g).to(dev, torch.bfloat16)
    kc = torch.randn(blocks, bs, hkv, d, generator=g).to(dev, torch.bfloat16)
    vc = torch.randn(blocks, bs, hkv, d, generator=g).to(dev, torch.bfloat16)
    bt = torch.randperm(blocks, generator=g)[: b * 48].view(b, 48).to(dev, torch.int32)
    qsl = torch.arange(b + 1, dtype=torch.int32, device=dev)
    seq = lens.to(dev)
    monkeypatch.setenv("OCTAVO_ATTN_SPLIT_MERGE", "1" if merge else "0")

    def run():
        return paged_attention(q, kc, vc, qsl, seq, bt, d ** -0.5, max_query_len=1,
                               max_seq_len=768, num_splits=splits)

    monkeypatch.setenv("OCTAVO_ATTN_EARLY_KV", "0")
    plain = run()
    monkeypatch.setenv("OCTAVO_ATTN_EARLY_KV", "1")
    assert torch.equal(run(), plain)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run()
    seq.copy_(torch.tensor([700, 1, 33, 16, 500, 641], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    monkeypatch.setenv("OCTAVO_ATTN_EARLY_KV", "0")
    assert torch.equal(captured, run())


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("eager", [True, False])
def test_engine_decodes_match_gpu(tmp_path, monkeypatch, eager):
    """One-request greedy decodes (split attention, its merge launch) of a bf16 Llama:
    the same tokens and logprobs, bit for bit, with OCTAVO_ATTN_EARLY_KV on and off."""
    import json

    from tests.kernels import cuda_checks
    from tests.kernels.test_dense_mma import _liven

    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512,
              "intermediate_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 8,
              "num_key_value_heads": 4, "vocab_size": 2048, "max_position_embeddings": 512,
              "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    monkeypatch.setenv("OCTAVO_ATTN_DECODE_SPLITS", "4")
    monkeypatch.setenv("OCTAVO_ATTN_STREAMK", "0")
    one = cuda_checks.PROMPTS[:1]
    monkeypatch.setenv("OCTAVO_ATTN_EARLY_KV", "0")
    plain = cuda_checks.greedy_decode(tmp_path, _liven, eager, prompts=one)
    monkeypatch.setenv("OCTAVO_ATTN_EARLY_KV", "1")
    assert cuda_checks.greedy_decode(tmp_path, _liven, eager, prompts=one) == plain
