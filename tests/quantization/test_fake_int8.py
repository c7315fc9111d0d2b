"""A test-only int8 weight-only method, registered here, proves the structure end to end:
int8 tensors load as int8, layers compute close to their float twins, and a checkpoint that
declares the method is detected and generates the same tokens as its dequantized twin."""

from __future__ import annotations

import os

import pytest
import torch

from octavo import LLM, SamplingParams
from octavo.layers.linear import QKVParallelLinear, RowParallelLinear
from octavo.quantization import registry as quant_registry
from tests.quantization.fake_methods import FakeInt8Config, dequantize_int8, quantize_int8
from tests.quantization.twins import patch_config, write_twins
from tests.tiny_models import COMMON, make_checkpoint

_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
PROMPTS = [{"prompt_token_ids": [(7 * i + 3 * n) % COMMON["vocab_size"] for i in range(n)]}
           for n in (1, 6, 13)]


@pytest.fixture
def fake_int8(monkeypatch):
    monkeypatch.setitem(quant_registry._CLASSES, "fake_int8", FakeInt8Config)


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def test_int8_qkv_layer_close_to_float():
    torch.manual_seed(0)
    parts = {"q": torch.randn(32, 16), "k": torch.randn(16, 16), "v": torch.randn(16, 16)}
    quant = QKVParallelLinear(16, 8, 4, 2, bias=True, quant_config=FakeInt8Config(),
                              prefix="model.layers.0.self_attn.qkv_proj")
    plain = QKVParallelLinear(16, 8, 4, 2, bias=True)
    for sid, w in parts.items():
        q, s = quantize_int8(w)
        quant.qweight.weight_loader(quant.qweight, q, sid)
        quant.scales.weight_loader(quant.scales, s, sid)
        plain.weight.weight_loader(plain.weight, w, sid)
        b = torch.randn(w.shape[0])
        quant.bias.weight_loader(quant.bias, b, sid)
        plain.bias.weight_loader(plain.bias, b, sid)
    for layer in (quant, plain):
        layer.process_weights_after_loading()
    assert quant.qweight.dtype == torch.int8 and quant.scales.dtype == torch.float32
    assert not hasattr(quant, "weight")
    x = torch.randn(5, 16)
    assert _rel_err(quant(x), plain(x)) < 0.02


def test_int8_row_parallel_layer_close_to_float():
    torch.manual_seed(1)
    w = torch.randn(24, 40)
    quant = RowParallelLinear(40, 24, quant_config=FakeInt8Config(), prefix="x.down_proj")
    plain = RowParallelLinear(40, 24)
    q, s = quantize_int8(w)
    quant.qweight.weight_loader(quant.qweight, q)
    quant.scales.weight_loader(quant.scales, s)
    plain.weight.weight_loader(plain.weight, w)
    x = torch.randn(3, 40)
    assert _rel_err(quant(x), plain(x)) < 0.02


def _write_pair(src: str, root: str) -> tuple[str, str]:
    """(float folder, int8 folder) holding the same weights: the float one dequantized."""
    from safetensors.torch import load_file

    state = {}
    for name in os.listdir(src):
        if name.endswith(".safetensors"):
            state.update(load_file(os.path.join(src, name)))
    dense, int8 = {}, {}
    for name, t in state.items():
        module = name.rsplit(".", 2)[-2] if name.endswith(".weight") else ""
        if module in _LINEARS:
            q, s = quantize_int8(t)
            dense[name] = dequantize_int8(q, s)
            int8[name[: -len("weight")] + "qweight"] = q
            int8[name[: -len("weight")] + "scales"] = s
        else:
            dense[name] = int8[name] = t
    out = write_twins(src, root, {"dense": dense, "int8": int8})
    patch_config(out[1], quantization_config={"quant_method": "fake_int8",
                                              "modules_to_not_convert": []})
    return out[0], out[1]


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("fake_int8")
    src = make_checkpoint("qwen2", str(root / "src"))
    return _write_pair(src, str(root))


def _greedy(model: str, **kwargs) -> list[list[int]]:
    llm = LLM(model=model, dtype="float32", skip_tokenizer_init=True, max_model_len=64,
              **kwargs)
    return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def test_checkpoint_declaring_the_method_runs_it(fake_int8, pair):
    dense, int8 = pair
    expect = _greedy(dense)
    assert _greedy(int8) == expect
    assert _greedy(int8, quantization="fake_int8") == expect


def test_checkpoint_declaring_an_unknown_method_is_refused(pair):
    with pytest.raises(ValueError, match=r"quant_method='fake_int8'.*known"):
        LLM(model=pair[1], dtype="float32", skip_tokenizer_init=True, max_model_len=64)


def test_quantization_argument_is_checked(fake_int8, pair):
    with pytest.raises(ValueError, match=r"quantization='nope'.*known"):
        LLM(model=pair[0], skip_tokenizer_init=True, quantization="nope")
    with pytest.raises(ValueError, match=r"quantization='unquantized' does not match"):
        LLM(model=pair[1], skip_tokenizer_init=True, quantization="unquantized")
