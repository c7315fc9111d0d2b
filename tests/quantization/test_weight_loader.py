"""The linear layers' one attribute-driven weight loader: tensor-parallel narrowing (built here
as rank 1 of 2), merged q/k/v and gate/up parts, packed layouts, integer dtypes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from octavo.distributed import parallel_state
from octavo.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from octavo.layers.weight_loader import COLUMN, ROW, load_linear_param
from octavo.model_loader.weights import load_weights
from octavo.quantization import set_param_layout
from tests.quantization.fake_methods import FakeInt8Config, PackedLayoutConfig


@pytest.fixture
def rank1_of_2(monkeypatch):
    monkeypatch.setattr(parallel_state, "_TP", parallel_state.TPGroup(rank=1, size=2))


def _arange(*shape, dtype=torch.float32) -> torch.Tensor:
    return torch.arange(torch.Size(shape).numel()).reshape(shape).to(dtype)


def _load(layer: nn.Module, name: str, tensor: torch.Tensor, shard_id=None) -> None:
    param = getattr(layer, name)
    if shard_id is None:
        param.weight_loader(param, tensor)
    else:
        param.weight_loader(param, tensor, shard_id)


def test_loader_function_narrows_by_rank():
    w = _arange(6, 8)
    col = set_param_layout(torch.zeros(3, 8), input_dim=1, output_dim=0)
    load_linear_param(col, w, tp_rank=1, tp_size=2, split=COLUMN)
    assert torch.equal(col, w[3:])
    row = set_param_layout(torch.zeros(6, 4), input_dim=1, output_dim=0)
    load_linear_param(row, w, tp_rank=1, tp_size=2, split=ROW)
    assert torch.equal(row, w[:, 4:])


def test_column_parallel_rank1(rank1_of_2):
    layer = ColumnParallelLinear(8, 6, bias=True)
    assert layer.weight.shape == (3, 8)
    w, b = _arange(6, 8), _arange(6)
    _load(layer, "weight", w)
    _load(layer, "bias", b)
    assert torch.equal(layer.weight, w[3:]) and torch.equal(layer.bias, b[3:])


def test_row_parallel_rank1(rank1_of_2):
    layer = RowParallelLinear(8, 6, bias=True)
    assert layer.weight.shape == (6, 4)
    w, b = _arange(6, 8), _arange(6)
    _load(layer, "weight", w)
    _load(layer, "bias", b)
    # The bias is added once after the all-reduce: every rank holds all of it.
    assert torch.equal(layer.weight, w[:, 4:]) and torch.equal(layer.bias, b)


def test_qkv_parts_rank1(rank1_of_2):
    layer = QKVParallelLinear(8, head_dim=2, total_num_heads=4, total_num_kv_heads=2, bias=True)
    q, k, v = _arange(8, 8), _arange(4, 8) + 100, _arange(4, 8) + 200
    for sid, t in (("q", q), ("k", k), ("v", v)):
        _load(layer, "weight", t, sid)
        _load(layer, "bias", t[:, 0].contiguous(), sid)
    expect = torch.cat([q[4:], k[2:], v[2:]])
    assert torch.equal(layer.weight, expect)
    assert torch.equal(layer.bias, expect[:, 0])


def test_qkv_replicated_kv_head_rank1(rank1_of_2):
    layer = QKVParallelLinear(8, head_dim=2, total_num_heads=2, total_num_kv_heads=1)
    q, k, v = _arange(4, 8), _arange(2, 8) + 100, _arange(2, 8) + 200
    for sid, t in (("q", q), ("k", k), ("v", v)):
        _load(layer, "weight", t, sid)
    # One KV head for two ranks: both hold all of it.
    assert torch.equal(layer.weight, torch.cat([q[2:], k, v]))


def test_merged_gate_up_rank1(rank1_of_2):
    layer = MergedColumnParallelLinear(8, [6, 6])
    gate, up = _arange(6, 8), _arange(6, 8) + 100
    _load(layer, "weight", gate, 0)
    _load(layer, "weight", up, 1)
    assert torch.equal(layer.weight, torch.cat([gate[3:], up[3:]]))


def test_gptq_like_packed_along_input_row_parallel(rank1_of_2):
    """[in/8, out] packed along input: rank 1 of 2 holds packed rows in/16 .. in/8."""
    layer = RowParallelLinear(32, 4, quant_config=PackedLayoutConfig("input"))
    assert layer.qweight.shape == (2, 4) and layer.scales.shape == (2, 4)
    qweight = _arange(4, 4, dtype=torch.int32)
    scales = _arange(4, 4)  # 32 inputs in groups of 8
    _load(layer, "qweight", qweight)
    _load(layer, "scales", scales)
    assert torch.equal(layer.qweight, qweight[2:]) and torch.equal(layer.scales, scales[2:])


def test_awq_like_packed_along_output_column_parallel(rank1_of_2):
    """[in, out/8] packed along output: rank 1 of 2 holds packed columns out/16 .. out/8."""
    layer = ColumnParallelLinear(8, 32, quant_config=PackedLayoutConfig("output"))
    assert layer.qweight.shape == (8, 2)
    qweight = _arange(8, 4, dtype=torch.int32)
    _load(layer, "qweight", qweight)
    assert torch.equal(layer.qweight, qweight[:, 2:])


def test_awq_like_merged_parts_offset_by_pack_factor(rank1_of_2):
    layer = MergedColumnParallelLinear(8, [32, 16], quant_config=PackedLayoutConfig("output"))
    # Per rank: 16 + 8 output features = 2 + 1 packed int32 columns.
    assert layer.qweight.shape == (8, 3)
    gate = _arange(8, 4, dtype=torch.int32)
    up = _arange(8, 2, dtype=torch.int32) + 100
    _load(layer, "qweight", gate, 0)
    _load(layer, "qweight", up, 1)
    assert torch.equal(layer.qweight, torch.cat([gate[:, 2:], up[:, 1:]], dim=1))
    # Scales are not packed: parts sit at their plain output offsets.
    gate_s, up_s = _arange(1, 32), _arange(1, 16) + 100
    _load(layer, "scales", gate_s, 0)
    _load(layer, "scales", up_s, 1)
    assert torch.equal(layer.scales, torch.cat([gate_s[:, 16:], up_s[:, 8:]], dim=1))


def test_part_not_divisible_by_pack_factor_is_an_error():
    param = set_param_layout(torch.zeros(4, 2, dtype=torch.int32), input_dim=0, output_dim=1,
                             packed_dim=1, pack_factor=8)
    layer = MergedColumnParallelLinear(4, [12, 4])
    shard = layer.shard_placement(1)  # 4 output features at offset 12
    with pytest.raises(ValueError, match="pack factor 8"):
        load_linear_param(param, torch.zeros(4, 1, dtype=torch.int32), tp_rank=0, tp_size=1,
                          split=COLUMN, shard=shard)


def test_wrong_shape_is_an_error_naming_both_shapes():
    layer = ColumnParallelLinear(8, 6)
    with pytest.raises(ValueError, match=r"\(6, 8\).*\(6, 7\)"):
        _load(layer, "weight", torch.zeros(6, 7))


class _OneLayer(nn.Module):
    def __init__(self, quant_config=None) -> None:
        super().__init__()
        self.proj = ColumnParallelLinear(8, 4, bias=True, quant_config=quant_config,
                                         prefix="proj")


def test_integer_tensors_stay_integers_floats_take_param_dtype():
    model = _OneLayer(FakeInt8Config())
    q = torch.randint(-127, 128, (4, 8), dtype=torch.int8)
    scales = torch.rand(4, dtype=torch.float64)
    load_weights(model, [("proj.qweight", q), ("proj.scales", scales),
                         ("proj.bias", torch.ones(4, dtype=torch.float16))])
    assert model.proj.qweight.dtype == torch.int8 and torch.equal(model.proj.qweight, q)
    assert model.proj.scales.dtype == torch.float32
    assert torch.equal(model.proj.scales, scales.float())
    assert torch.equal(model.proj.bias, torch.ones(4))


def test_integer_tensor_of_another_width_is_an_error_naming_it():
    model = _OneLayer(FakeInt8Config())
    with pytest.raises(ValueError, match="proj.qweight.*torch.int32.*torch.int8"):
        load_weights(model, [("proj.qweight", torch.zeros(4, 8, dtype=torch.int32))])
    plain = _OneLayer()
    with pytest.raises(ValueError, match="proj.weight.*torch.int8"):
        load_weights(plain, [("proj.weight", torch.zeros(4, 8, dtype=torch.int8))])


def test_dummy_weights_fill_integer_params_with_integers():
    from octavo.model_loader.weights import fill_dummy_weights

    model = _OneLayer(FakeInt8Config())
    fill_dummy_weights(model, seed=0)
    assert model.proj.qweight.dtype == torch.int8 and model.proj.qweight.abs().sum() > 0
    assert model.proj.scales.dtype == torch.float32



def test_dummy_weights_load_a_pre_quantized_fp8_checkpoint(tmp_path):
    """A pre-quantized FP8 checkpoint's weights are float8 parameters, which load_format=
    "dummy" filled with uniform_, a kernel torch lacks for float8 (the engine did not start)."""
    import json

    from octavo import LLM, SamplingParams

    config = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256,
              "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16",
              "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    llm = LLM(model=str(tmp_path), load_format="dummy", skip_tokenizer_init=True,
              max_model_len=64)
    out = llm.generate([{"prompt_token_ids": [1, 2, 3]}],
                       SamplingParams(max_tokens=3, temperature=0), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3


@pytest.mark.parametrize("tied", [False, True])
def test_dummy_weights_with_a_quantized_lm_head(tmp_path, tied):
    """What the benchmarks start: a GPTQ config whose LM head is quantized too (GPTQModel's
    lm_head=True) with random weights; the head is the quantized one, never tied."""
    import json

    from octavo import LLM, SamplingParams

    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
              "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 256,
              "rms_norm_eps": 1e-6, "tie_word_embeddings": tied, "torch_dtype": "float16",
              "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128,
                                      "desc_act": False, "sym": True,
                                      "checkpoint_format": "gptq_v2", "lm_head": True}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    llm = LLM(model=str(tmp_path), load_format="dummy", dtype="float32",
              skip_tokenizer_init=True, max_model_len=64)
    model = llm.llm_engine.executor.worker.runner.model
    head = model.lm_head
    assert type(head.quant_method).__name__ == "GPTQLinearMethod" and not head.is_tied
    assert model.model.embed_tokens.weight.dtype == torch.float32
    out = llm.generate([{"prompt_token_ids": [1, 2, 3]}],
                       SamplingParams(max_tokens=4, temperature=0, ignore_eos=True),
                       use_tqdm=False)
    tokens = out[0].outputs[0].token_ids
    assert len(tokens) == 4 and all(0 <= t < 512 for t in tokens)
