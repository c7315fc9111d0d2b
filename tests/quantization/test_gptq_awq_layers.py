"""GPTQ and AWQ linear layers: hand-worked bit layouts from the formats' definitions, layers
loaded from the test packer computing what the dequantized weight computes (CPU path, and the
GPU path's repack + Triton kernel through the interpreter), config parsing, and clear errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from octavo.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from octavo.quantization import int_weight
from octavo.quantization.awq import AWQ_ORDER, AWQConfig
from octavo.quantization.gptq import GPTQConfig
from octavo.quantization.int_weight import unpack_int32
from tests.quantization.packers import (
    AWQ_PACK_ORDER,
    awq_tensors,
    gptq_tensors,
    pack_cols,
    pack_rows,
    quantize,
)


def _signed(u: int) -> int:
    return u - 2**32 if u >= 2**31 else u


# --- hand-worked layouts ---------------------------------------------------------------------

def test_gptq_qweight_hand_worked():
    """Eight input rows of one column, values 1..8: row i in bits 4i..4i+3 -> 0x87654321."""
    q = torch.arange(1, 9).view(8, 1)
    packed = pack_rows(q, 4)
    assert packed.tolist() == [[_signed(0x87654321)]]
    assert unpack_int32(packed, 4, dim=0).view(-1).tolist() == list(range(1, 9))
    # Row 7 = 15 sets the sign bit: the int32 is negative and must still unpack to 15.
    q = torch.tensor([[0], [0], [0], [0], [0], [0], [0], [15]])
    packed = pack_rows(q, 4)
    assert packed.item() == _signed(0xF0000000)
    assert unpack_int32(packed, 4, dim=0).view(-1).tolist() == [0] * 7 + [15]


def test_gptq_8bit_hand_worked():
    q = torch.tensor([[0x12], [0x34], [0x56], [0xF8]])
    packed = pack_rows(q, 8)
    assert packed.item() == _signed(0xF8563412)
    assert unpack_int32(packed, 8, dim=0).view(-1).tolist() == [0x12, 0x34, 0x56, 0xF8]


def test_awq_order_hand_worked():
    """AutoAWQ packs output columns 0..7 of one row (values 1..8) in the order
    0, 2, 4, 6, 1, 3, 5, 7: nibbles low to high hold 1, 3, 5, 7, 2, 4, 6, 8 -> 0x86427531."""
    assert list(AWQ_ORDER) == AWQ_PACK_ORDER == [0, 2, 4, 6, 1, 3, 5, 7]
    row = torch.arange(1, 9).view(1, 8)
    packed = pack_cols(row, 4, AWQ_PACK_ORDER)
    assert packed.tolist() == [[_signed(0x86427531)]]
    assert unpack_int32(packed, 4, dim=1, order=AWQ_ORDER).tolist() == [list(range(1, 9))]
    # Two entries: the second holds columns 8..15.
    row = torch.arange(16).view(1, 16) % 16
    unpacked = unpack_int32(pack_cols(row, 4, AWQ_PACK_ORDER), 4, dim=1, order=AWQ_ORDER)
    assert unpacked.tolist() == row.tolist()


def test_gptq_v1_zeros_stored_minus_one():
    """Symmetric 4-bit zeros are 8; AutoGPTQ (v1) stores 7 in every nibble, GPTQModel v2 8."""
    qz = quantize(torch.randn(8, 32), 4, 32, sym=True)
    assert gptq_tensors(qz, 4, "gptq")["qzeros"].item() == 0x77777777
    assert gptq_tensors(qz, 4, "gptq_v2")["qzeros"].item() == _signed(0x88888888)


# --- layers ----------------------------------------------------------------------------------

def _load(layer, parts: dict, tensors_of) -> None:
    """Load each part's tensors (shard id None for a plain layer)."""
    for sid, qz in parts.items():
        for name, t in tensors_of(qz).items():
            param = getattr(layer, name)
            if sid is None:
                param.weight_loader(param, t)
            else:
                param.weight_loader(param, t, sid)
    layer.process_weights_after_loading()


@pytest.fixture(params=["cpu", "kernel"])
def path(request, monkeypatch):
    """``kernel``: the CUDA path (repack, act-order permutation, Triton kernel) forced on the
    CPU; the kernel runs in Triton's interpreter."""
    if request.param == "kernel":
        pytest.importorskip("triton")
        if torch.cuda.is_available():  # no interpreter there: the kernel cannot read CPU
            pytest.skip("the forced kernel path on CPU tensors needs Triton's interpreter; "
                        "on a GPU test_w4a16_gemm.py and the checkpoint tests cover it")
        monkeypatch.setattr(int_weight, "use_kernel", lambda device, k, g, bits: True)
    return request.param


GPTQ_CASES = [  # bits, group, sym, desc_act, checkpoint_format
    (4, 32, True, False, "gptq"),
    (4, 64, False, False, "gptq"),
    (4, -1, False, False, "gptq_v2"),
    (4, 32, False, True, "gptq"),
    (8, 32, True, True, "gptq_v2"),
    (8, 64, False, False, "gptq"),
]


@pytest.mark.parametrize("bits,group,sym,desc_act,fmt", GPTQ_CASES)
def test_gptq_row_parallel_layer(bits, group, sym, desc_act, fmt, path):
    torch.manual_seed(0)
    w = torch.randn(32, 128)
    qz = quantize(w, bits, group, sym, act_order=desc_act)
    if fmt == "gptq":
        assert (qz.zeros > 0).all()  # v1 cannot store a zero of 0
    cfg = GPTQConfig(bits=bits, group_size=group, desc_act=desc_act, sym=sym,
                     checkpoint_format=fmt)
    layer = RowParallelLinear(128, 32, quant_config=cfg, prefix="model.layers.0.mlp.down_proj")
    _load(layer, {None: qz}, lambda q: gptq_tensors(q, bits, fmt))
    assert (layer.kernel_group is not None) == (path == "kernel")
    x = torch.randn(3, 128)
    torch.testing.assert_close(layer(x), F.linear(x, qz.dequantize()), atol=1e-4, rtol=1e-4)


def test_gptq_qkv_layer_with_bias(path):
    torch.manual_seed(1)
    cfg = GPTQConfig(bits=4, group_size=32, desc_act=True, sym=False)
    layer = QKVParallelLinear(64, 16, 2, 1, bias=True, quant_config=cfg,
                              prefix="model.layers.0.self_attn.qkv_proj")
    # GPTQ orders q, k and v by the same inputs: one act order (seed) for the three parts.
    parts = {s: quantize(torch.randn(n, 64), 4, 32, False, act_order=True, seed=0)
             for s, n in (("q", 32), ("k", 16), ("v", 16))}
    _load(layer, parts, lambda q: gptq_tensors(q, 4))
    bias = torch.randn(64)
    layer.bias.data.copy_(bias)
    dense = torch.cat([p.dequantize() for p in parts.values()])
    x = torch.randn(5, 64)
    torch.testing.assert_close(layer(x), F.linear(x, dense, bias), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("group", [32, 64, -1])
def test_awq_merged_layer(group, path):
    torch.manual_seed(2)
    cfg = AWQConfig(group_size=group)
    layer = MergedColumnParallelLinear(64, [48, 32], quant_config=cfg,
                                       prefix="model.layers.0.mlp.gate_up_proj")
    parts = {0: quantize(torch.randn(48, 64), 4, group, False),
             1: quantize(torch.randn(32, 64), 4, group, False)}
    _load(layer, parts, awq_tensors)
    dense = torch.cat([parts[0].dequantize(), parts[1].dequantize()])
    x = torch.randn(17, 64)
    torch.testing.assert_close(layer(x), F.linear(x, dense), atol=1e-4, rtol=1e-4)


def test_merged_parts_with_different_act_orders_are_refused():
    cfg = GPTQConfig(bits=4, group_size=32, desc_act=True)
    layer = MergedColumnParallelLinear(64, [32, 32], quant_config=cfg, prefix="x.gate_up_proj")
    parts = {i: quantize(torch.randn(32, 64), 4, 32, True, act_order=True, seed=i)
             for i in (0, 1)}
    with pytest.raises(ValueError, match=r"'x.gate_up_proj'.*part 1.*g_idx"):
        _load(layer, parts, lambda q: gptq_tensors(q, 4))


def test_cpu_path_hands_the_dense_weight_to_the_layer():
    """On the CPU the dequantized weight is cached once and the packed tensors are dropped."""
    qz = quantize(torch.randn(32, 64), 4, 32, True)
    layer = RowParallelLinear(64, 32, quant_config=GPTQConfig(group_size=32), prefix="x.o_proj")
    _load(layer, {None: qz}, lambda q: gptq_tensors(q, 4))
    assert not hasattr(layer, "qweight") and not hasattr(layer, "g_idx")
    dense = layer.quant_method.dense_weight(layer)
    torch.testing.assert_close(dense, qz.dequantize(), atol=0, rtol=0)


# --- configs and errors ----------------------------------------------------------------------

def test_gptq_config_from_checkpoint():
    cfg = GPTQConfig.from_config({"quant_method": "gptq", "bits": 8, "group_size": 64,
                                  "desc_act": True, "sym": False,
                                  "checkpoint_format": "gptq_v2", "lm_head": False,
                                  "modules_to_not_convert": ["mlp.down_proj"]})
    assert (cfg.bits, cfg.group_size, cfg.desc_act, cfg.sym) == (8, 64, True, False)
    assert cfg.checkpoint_format == "gptq_v2" and not cfg.quantize_lm_head
    assert cfg.get_quant_method(None, "model.layers.0.mlp.down_proj") is None
    assert cfg.get_quant_method(None, "lm_head") is None
    method = cfg.get_quant_method(None, "model.layers.0.mlp.up_proj")
    assert method.bits == 8 and not method.zeros_minus_one


def test_gptq_dynamic_rules():
    from octavo.models.llama import LlamaForCausalLM

    cfg = GPTQConfig.from_config({"bits": 4, "group_size": 32, "dynamic": {
        r"-:model\.layers\.1\..*": {}, r"+:.*\.mlp\..*": {"bits": 8, "group_size": 64}}})
    cfg.packed_modules_mapping = LlamaForCausalLM.packed_modules_mapping
    assert cfg.get_quant_method(None, "model.layers.1.self_attn.qkv_proj") is None
    method = cfg.get_quant_method(None, "model.layers.0.mlp.gate_up_proj")
    assert (method.bits, method.group_size) == (8, 64)
    method = cfg.get_quant_method(None, "model.layers.0.self_attn.qkv_proj")
    assert (method.bits, method.group_size) == (4, 32)


def test_awq_config_from_checkpoint():
    cfg = AWQConfig.from_config({"quant_method": "awq", "version": "GEMM", "bits": 4,
                                 "group_size": 64, "zero_point": True,
                                 "modules_to_not_convert": ["visual"]})
    assert cfg.group_size == 64 and cfg.ignore == ("visual",)


@pytest.mark.parametrize("cls,config,match", [
    (GPTQConfig, {"bits": 3, "group_size": 128}, r"bits=3 is not supported"),
    (GPTQConfig, {"bits": 4, "checkpoint_format": "marlin"}, r"checkpoint_format='marlin'"),
    (GPTQConfig, {}, r"quantization='gptq' needs a GPTQ checkpoint"),
    (AWQConfig, {"bits": 4, "version": "gemv"}, r"version='gemv' is not supported"),
    (AWQConfig, {"w_bit": 8, "version": "gemm"}, r"bits=8 is not supported"),
    (AWQConfig, {}, r"quantization='awq' needs an AWQ checkpoint"),
])
def test_unsupported_settings_are_named(cls, config, match):
    with pytest.raises(ValueError, match=match):
        cls.from_config(config)


def test_shapes_the_method_cannot_hold_name_the_layer():
    with pytest.raises(ValueError, match=r"'model.layers.0.mlp.down_proj'.*96.*group_size"):
        RowParallelLinear(96, 32, quant_config=GPTQConfig(group_size=64),
                          prefix="model.layers.0.mlp.down_proj")
    with pytest.raises(ValueError, match=r"'x.o_proj'.*input features = 36.*pack factor"):
        RowParallelLinear(36, 32, quant_config=GPTQConfig(group_size=-1), prefix="x.o_proj")
    with pytest.raises(ValueError, match=r"'x.o_proj'.*output features = 20.*qzeros"):
        RowParallelLinear(64, 20, quant_config=GPTQConfig(group_size=32), prefix="x.o_proj")
    with pytest.raises(ValueError, match=r"'x.up'.*output features = 12.*AWQ"):
        MergedColumnParallelLinear(64, [32, 12], quant_config=AWQConfig(group_size=32),
                                   prefix="x.up")
    with pytest.raises(ValueError, match=r"'x.q'.*input features = 96.*group_size"):
        RowParallelLinear(96, 32, quant_config=AWQConfig(group_size=64), prefix="x.q")


# --- a quantized LM head (GPTQModel's lm_head=True) ------------------------------------------

def _lm_head_config(bits: int = 4) -> GPTQConfig:
    # GPTQModel writes its head through a dynamic rule (8 bits by default).
    return GPTQConfig.from_config({"bits": 4, "group_size": 32, "lm_head": True,
                                   "dynamic": {"lm_head": {"bits": bits, "group_size": 32}}})


@pytest.mark.parametrize("bits", [4, 8])
def test_gptq_lm_head_layer(bits, path):
    """The head holds the config's method (the dynamic rule's bits), the checkpoint's
    parameters under the checkpoint's names, and computes the dequantized product, on the CPU
    and through the integer kernel."""
    from octavo.layers.vocab_embedding import LMHead

    torch.manual_seed(5)
    head = LMHead(128, 64, _lm_head_config(bits), "lm_head")
    assert head.quantized and head.weight is None and head.quant_method.bits == bits
    assert {n for n, _ in head.named_parameters()} == {"qweight", "qzeros", "scales", "g_idx"}
    qz = quantize(torch.randn(128, 64), bits, 32, True)
    _load(head, {None: qz}, lambda q: gptq_tensors(q, bits))
    assert (head.kernel_group is not None) == (path == "kernel")
    x = torch.randn(3, 64)
    torch.testing.assert_close(head(x), F.linear(x, qz.dequantize()), atol=1e-4, rtol=1e-4)


def test_float_lm_head_when_the_checkpoint_leaves_it():
    from octavo.layers.vocab_embedding import LMHead

    cfg = GPTQConfig.from_config({"bits": 4, "group_size": 32, "lm_head": False})
    head = LMHead(128, 64, cfg, "lm_head")
    assert not head.quantized and head.weight.shape == (128, 64)


def test_quantized_lm_head_is_never_tied():
    """A tied model whose checkpoint quantized the head: the head keeps its own quantized
    weights, the embedding stays in full precision."""
    from octavo.layers.vocab_embedding import LMHead, VocabEmbedding

    emb = VocabEmbedding(128, 64)
    head = LMHead(128, 64, _lm_head_config(), "lm_head")
    head.tie(emb)
    assert not head.is_tied and head.weight is None and head.qweight.dtype == torch.int32
    float_head = LMHead(128, 64)
    float_head.tie(emb)
    assert float_head.is_tied and float_head.weight is emb.weight


def test_quantized_lm_head_vocab_parallel(monkeypatch):
    """Five ranks by hand, 8 bits (4 per int32): 36 vocab rows become 8 per rank, the
    checkpoint's rows (and its packed zeros) padded with zeros to 40; the gathered logits are
    the full product."""
    from octavo.distributed import parallel_state
    from octavo.layers.vocab_embedding import LMHead

    torch.manual_seed(6)
    qz = quantize(torch.randn(36, 64), 8, 32, False)
    x = torch.randn(3, 64)
    logits = []
    for rank in range(5):
        monkeypatch.setattr(parallel_state, "_TP", parallel_state.TPGroup(rank, 5))
        monkeypatch.setattr(parallel_state.TPGroup, "all_gather", lambda self, t, dim=-1: t)
        head = LMHead(36, 64, _lm_head_config(8), "lm_head")
        assert head.qweight.shape == (16, 8) and head.qzeros.shape == (2, 2)
        _load(head, {None: qz}, lambda q: gptq_tensors(q, 8))
        logits.append(head(x))
    assert not logits[-1][:, 4:].any()  # the padding rows
    torch.testing.assert_close(torch.cat(logits, dim=-1)[:, :36], F.linear(x, qz.dequantize()),
                               atol=1e-4, rtol=1e-4)


def test_quantized_lm_head_shapes_are_named(monkeypatch):
    from octavo.distributed import parallel_state
    from octavo.layers.vocab_embedding import LMHead

    with pytest.raises(ValueError, match=r"lm_head: the quantized LM head \(gptq\) cannot hold "
                                         r"vocab_size=120 as 60 rows on each of 2 "
                                         r"tensor-parallel rank\(s\).*pack factor"):
        monkeypatch.setattr(parallel_state, "_TP", parallel_state.TPGroup(0, 2))
        LMHead(120, 64, _lm_head_config(4), "lm_head")
    monkeypatch.setattr(parallel_state, "_TP", parallel_state.TPGroup(0, 1))
    with pytest.raises(ValueError, match=r"'lm_head'.*input features = 48.*group_size"):
        LMHead(128, 48, _lm_head_config(4), "lm_head")
    head = LMHead(128, 64, _lm_head_config(4), "lm_head")
    qz = quantize(torch.randn(120, 64), 4, 32, True)
    with pytest.raises(ValueError, match=r"lm_head: checkpoint dim 1 has 120 entries, expected "
                                         r"128 for vocab_size=128"):
        _load(head, {None: qz}, lambda q: gptq_tensors(q, 4))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("bits,vocab,hidden", [(4, 128256, 4096), (8, 151936, 1024)])
def test_gptq_lm_head_at_real_vocab_widths_gpu(bits, vocab, hidden):
    """A quantized head as wide as Llama-3.1's (4-bit g128, the benchmark's) and Qwen3's
    (8-bit, as GPTQModel writes heads) on the GPU's integer kernels, bf16, 1-64 rows."""
    from octavo.layers.vocab_embedding import LMHead

    torch.manual_seed(0)
    cfg = GPTQConfig.from_config({"bits": bits, "group_size": 128, "lm_head": True,
                                  "sym": True, "desc_act": False})
    qz = quantize(torch.randn(vocab, hidden) * 0.02, bits, 128, True)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            head = LMHead(vocab, hidden, cfg, "lm_head")
        _load(head, {None: qz}, lambda q: gptq_tensors(q, bits))
    finally:
        torch.set_default_dtype(old)
    w = qz.dequantize().cuda()
    for m in (1, 4, 16, 64):
        x = torch.randn(m, hidden, device="cuda", dtype=torch.bfloat16)
        out = head(x)
        ref = x.float() @ w.t()
        assert out.shape == (m, vocab) and out.dtype == torch.bfloat16
        assert ((out.float() - ref).norm() / ref.norm()).item() < 1e-2, m
