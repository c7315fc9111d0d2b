"""QuantizationConfig: the registry, per-layer choice (lm_head, ignore lists), and detection of
the checkpoint's declared scheme with clear errors."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from octavo.models.llama import LlamaForCausalLM
from octavo.quantization import (
    build_quant_config,
    get_quantization_config_class,
    known_methods,
    resolve_quantization,
)
from octavo.quantization import registry as quant_registry
from octavo.quantization.unquantized import UnquantizedConfig, UnquantizedLinearMethod
from tests.quantization.fake_methods import FakeInt8Config, FakeInt8Method

PLAIN = SimpleNamespace()


@pytest.fixture
def fake_int8(monkeypatch):
    monkeypatch.setitem(quant_registry._CLASSES, "fake_int8", FakeInt8Config)


def _ckpt(method: str, **extra) -> SimpleNamespace:
    return SimpleNamespace(quantization_config={"quant_method": method, **extra})


def _config(**ckpt) -> FakeInt8Config:
    cfg = FakeInt8Config.from_config(ckpt)
    cfg.packed_modules_mapping = LlamaForCausalLM.packed_modules_mapping
    return cfg


def test_unquantized_is_registered_and_the_default():
    assert "unquantized" in known_methods()
    assert get_quantization_config_class("unquantized") is UnquantizedConfig
    assert resolve_quantization(None, PLAIN, None) is None
    cfg = build_quant_config(None, PLAIN, None)
    assert isinstance(cfg, UnquantizedConfig)
    assert isinstance(cfg.get_quant_method(None, "model.layers.0.mlp.down_proj"),
                      UnquantizedLinearMethod)


def test_unknown_name_names_value_and_known_ones():
    with pytest.raises(ValueError, match=r"quantization='nope'.*known: \[.*'unquantized'"):
        get_quantization_config_class("nope")
    with pytest.raises(ValueError, match="'nope'"):
        resolve_quantization("nope", PLAIN, None)


def test_registered_method_is_chosen_per_layer(fake_int8):
    cfg = _config()
    assert isinstance(cfg.get_quant_method(None, "model.layers.0.self_attn.qkv_proj"),
                      FakeInt8Method)
    # The LM head stays in full precision unless a scheme says otherwise.
    assert cfg.get_quant_method(None, "lm_head") is None


def test_modules_to_not_convert_apply_to_merged_layers(fake_int8):
    attn = ["model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj",
            "model.layers.0.self_attn.v_proj"]
    cfg = _config(modules_to_not_convert=attn + ["mlp.down_proj"])
    assert cfg.get_quant_method(None, "model.layers.0.self_attn.qkv_proj") is None
    assert cfg.get_quant_method(None, "model.layers.1.self_attn.qkv_proj") is not None
    assert cfg.get_quant_method(None, "model.layers.3.mlp.down_proj") is None
    assert cfg.get_quant_method(None, "model.layers.3.mlp.gate_up_proj") is not None


def test_ignore_list_regex_and_whole_components(fake_int8):
    cfg = _config(ignore=["re:.*layers\\.1\\..*", "layers.2"])
    assert cfg.get_quant_method(None, "model.layers.1.mlp.down_proj") is None
    assert cfg.get_quant_method(None, "model.layers.2.mlp.down_proj") is None
    # "layers.2" is not a prefix of "layers.20".
    assert cfg.get_quant_method(None, "model.layers.20.mlp.down_proj") is not None


def test_merged_layer_half_ignored_is_an_error_naming_it(fake_int8):
    cfg = _config(ignore=["model.layers.0.mlp.gate_proj"])
    with pytest.raises(ValueError, match="model.layers.0.mlp.gate_up_proj.*up_proj"):
        cfg.get_quant_method(None, "model.layers.0.mlp.gate_up_proj")


def test_checkpoint_method_is_detected(fake_int8):
    assert resolve_quantization(None, _ckpt("fake_int8"), None) == "fake_int8"
    cfg = build_quant_config(None, _ckpt("fake_int8", modules_to_not_convert=["visual"]), None)
    assert isinstance(cfg, FakeInt8Config) and cfg.ignore == ("visual",)
    assert resolve_quantization("fake_int8", _ckpt("fake_int8"), None) == "fake_int8"


def test_unsupported_checkpoint_method_is_an_error_naming_it():
    with pytest.raises(ValueError, match=r"quant_method='hqq'.*config.json.*known"):
        resolve_quantization(None, _ckpt("hqq", bits=4), None)


def test_method_not_matching_checkpoint_is_an_error(fake_int8):
    with pytest.raises(ValueError, match=r"quantization='unquantized' does not match.*"
                                         r"'fake_int8'"):
        resolve_quantization("unquantized", _ckpt("fake_int8"), None)
    with pytest.raises(ValueError, match=r"quantization='fake_int8' does not match.*'gptq'"):
        resolve_quantization("fake_int8", _ckpt("gptq"), None)


def test_quantize_config_json_declares_gptq(tmp_path):
    with open(os.path.join(tmp_path, "quantize_config.json"), "w") as f:
        json.dump({"bits": 4, "group_size": 128, "desc_act": False}, f)
    assert resolve_quantization(None, PLAIN, str(tmp_path)) == "gptq"
    with pytest.raises(ValueError, match=r"quantization='awq' does not match.*'gptq'.*"
                                         r"quantize_config.json"):
        resolve_quantization("awq", PLAIN, str(tmp_path))
