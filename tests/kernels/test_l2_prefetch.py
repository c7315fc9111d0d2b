"""The L2 weight prefetch: its chunk table, its sm_90 machine code (offline), the env list,
the decoder's wiring, and on the GPU a kernel chain unchanged by a prefetch placed in it."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from octavo import envs  # noqa: E402
from octavo.kernels import l2_prefetch  # noqa: E402
from tests.kernels.sm90 import compile_sm90  # noqa: E402


def _ranges(table):
    return [(int(a), int(b)) for a, b in table.tolist() if b]


def test_chunk_table_covers_every_tensor_in_order_16_byte_aligned():
    a = torch.empty(100_000, dtype=torch.bfloat16)  # 200,000 bytes: several chunks
    b = torch.empty(37, dtype=torch.int32)[1:]  # 144 bytes from an address 4 past alignment
    table = l2_prefetch.chunk_table([a, b], budget_bytes=1 << 30)
    assert table.dtype == torch.int64 and table.shape[1] == 2
    assert table.shape[0] % 32 == 0  # whole programs; the padding is empty chunks
    rows = _ranges(table)
    assert all(addr % 16 == 0 and size % 16 == 0 for addr, size in rows)
    assert all(size <= l2_prefetch.CHUNK_BYTES for _, size in rows)
    a_rows = [r for r in rows if a.data_ptr() <= r[0] < a.data_ptr() + 200_000]
    assert a_rows[0][0] == a.data_ptr() and sum(s for _, s in a_rows) == 200_000
    assert [r[0] for r in a_rows] == sorted(r[0] for r in a_rows)
    start, size = rows[-1]
    assert start <= b.data_ptr() and start + size >= b.data_ptr() + 144
    assert start > b.data_ptr() - 16 and start + size < b.data_ptr() + 144 + 16
    assert rows.index(rows[-1]) > rows.index(a_rows[-1])  # read order kept


def test_chunk_table_stops_at_the_budget():
    a = torch.empty(1 << 20, dtype=torch.uint8)
    b = torch.empty(1 << 20, dtype=torch.uint8)
    rows = _ranges(l2_prefetch.chunk_table([a, b], budget_bytes=(1 << 20) + 1000))
    assert sum(s for _, s in rows) == (1 << 20) + 1008  # b's first 1,000 bytes, to 16
    assert rows[-1][0] == b.data_ptr()
    assert _ranges(l2_prefetch.chunk_table([a, b], budget_bytes=0)) == []


def test_env_list(monkeypatch):
    monkeypatch.delenv("OCTAVO_L2_PREFETCH", raising=False)
    assert envs.l2_prefetch() == frozenset()  # off by default (measured slower, session 33)
    assert envs.l2_prefetch_max_tokens() == 1
    monkeypatch.setenv("OCTAVO_L2_PREFETCH", "o, mlp,qkv")
    assert envs.l2_prefetch() == {"o", "mlp", "qkv"}
    monkeypatch.setenv("OCTAVO_L2_PREFETCH", "off")
    assert envs.l2_prefetch() == frozenset()
    monkeypatch.setenv("OCTAVO_L2_PREFETCH", "o,lm_head")
    with pytest.raises(ValueError, match="OCTAVO_L2_PREFETCH.*lm_head"):
        envs.l2_prefetch()
    monkeypatch.setenv("OCTAVO_L2_PREFETCH_MB", "-3")
    with pytest.raises(ValueError, match="OCTAVO_L2_PREFETCH_MB.*-3"):
        envs.l2_prefetch_mb()


def test_the_decoder_prefetches_what_each_layer_reads_after_attention(tmp_path, monkeypatch):
    """Each layer's list: its o_proj, its MLP, the next layer's qkv_proj (the last layer has
    none); on the CPU the call launches nothing."""
    from octavo import LLM
    from tests.tiny_models import make_checkpoint

    folder = make_checkpoint("qwen3", str(tmp_path))
    llm = LLM(model=folder, skip_tokenizer_init=True, dtype="float32", device="cpu")
    layers = llm.llm_engine.executor.worker.runner.model.model.layers
    assert len(layers) >= 2
    for i, layer in enumerate(layers):
        parts = layer.self_attn.prefetch._modules
        assert parts["o"] == [layer.self_attn.o_proj]
        assert parts["mlp"] == [layer.mlp.gate_up_proj, layer.mlp.down_proj]
        if i + 1 < len(layers):
            assert parts["qkv"] == [layers[i + 1].self_attn.qkv_proj]
        else:
            assert "qkv" not in parts
    monkeypatch.setenv("OCTAVO_L2_PREFETCH", "o,mlp,qkv")
    layers[0].self_attn.prefetch(1, torch.device("cpu"))  # no launch, no error
    assert layers[0].self_attn.prefetch._table is None


def test_sm90_code_issues_bulk_l2_prefetches_and_waits():
    """Compiled offline for sm_90 (scripts/triton_sass.py, in a process of its own): the bulk
    L2 prefetch (UBLKPF.L2) is in the machine code, with the PDL trigger and wait after it."""
    code = compile_sm90("octavo.kernels.l2_prefetch:_l2_prefetch_kernel", "--const",
                        "BLOCK=32", "PDL=1", "--ptr", "table_ptr=i64", "--num-warps", "1")
    ptx, sass = code.ptx, code.sass
    assert "cp.async.bulk.prefetch.L2.global" in ptx
    assert "UBLKPF.L2" in sass
    assert ptx.index("cp.async.bulk.prefetch") < ptx.index("griddepcontrol.wait")


@pytest.mark.gpu
def test_a_prefetch_inside_a_pdl_chain_changes_nothing(monkeypatch):
    """norm -> GEMV -> prefetch(next weights) -> GEMV: the same values with and without the
    prefetch launch, eagerly and replayed from a CUDA graph."""
    from octavo.kernels.dense_gemv import dense_gemv
    from octavo.kernels.rms_norm import rms_norm

    dev = torch.device("cuda")
    assert l2_prefetch.supported(dev)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 1024, generator=g).to(dev, torch.bfloat16)
    w_norm = torch.rand(1024, generator=g).to(dev, torch.bfloat16)
    w1 = (torch.randn(2048, 1024, generator=g) / 32).to(dev, torch.bfloat16)
    w2 = (torch.randn(1024, 2048, generator=g) / 45).to(dev, torch.bfloat16)
    table = l2_prefetch.chunk_table([w2], 64 << 20)

    def chain(prefetch: bool):
        h = dense_gemv(rms_norm(x, w_norm, 1e-6), w1)
        if prefetch:
            l2_prefetch.l2_prefetch(table)
        return dense_gemv(h, w2)

    plain = chain(False)
    assert torch.equal(chain(True), plain)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = chain(True)
    for _ in range(3):
        x.copy_(torch.randn(x.shape, generator=g).to(dev, torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, chain(False))

