"""Tensor-parallel narrowing of the methods that take each checkpoint part whole
(bitsandbytes, fp8), built as rank 1 of 2: each part is decoded (or quantized) and this rank's
rows (column-parallel, merged q/k/v and gate/up) or columns (row-parallel) kept, from the
bitsandbytes fixture's real tensors."""

from __future__ import annotations

import os

import pytest
import torch

from octavo.distributed import parallel_state
from octavo.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from octavo.quantization import bnb_format as fmt
from octavo.quantization.bitsandbytes import BitsAndBytesConfig
from octavo.quantization.fp8 import Fp8Config, quantize_fp8

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "bitsandbytes")
LAYER = "model.layers.0."


@pytest.fixture
def rank1_of_2(monkeypatch):
    monkeypatch.setattr(parallel_state, "_TP", parallel_state.TPGroup(rank=1, size=2))


def _state(case: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    cfg = BitsAndBytesConfig()
    raw = load_file(os.path.join(FIXTURES, case, "model.safetensors"))
    return dict(cfg.checkpoint_tensors(raw.items()))


def _load(layer, state: dict, module: str, shard_id=None) -> None:
    prefix = f"{LAYER}{module}."
    for name, t in state.items():
        if name.startswith(prefix):
            param = getattr(layer, name[len(prefix):])
            if shard_id is None:
                param.weight_loader(param, t)
            else:
                param.weight_loader(param, t, shard_id)


def _dense(state: dict, module: str) -> torch.Tensor:
    """The whole part's float weight, from the tensors (independently of the layer)."""
    key = f"{LAYER}{module}.weight"
    if f"{LAYER}{module}.SCB" in state:
        return fmt.dequantize_int8_rows(state[key], state[f"{LAYER}{module}.SCB"])
    qs = fmt.parse_quant_state(state[key + "_quant_state"])
    absmax = state[key + "_absmax"]
    if "nested_offset" in qs:
        absmax = fmt.undo_double_quant(absmax, state[key + "_nested_absmax"],
                                       state[key + "_nested_quant_map"],
                                       qs["nested_blocksize"], qs["nested_offset"])
    elif absmax.dim() == 2:  # transformers 5's [in / blocksize, out]
        absmax = absmax.t()
    return fmt.dequantize_4bit(state[key], absmax, state[key + "_quant_map"], qs["blocksize"],
                               tuple(qs["shape"]))


def _layers(cfg):
    qkv = QKVParallelLinear(64, head_dim=16, total_num_heads=4, total_num_kv_heads=2,
                            quant_config=cfg, prefix=LAYER + "self_attn.qkv_proj")
    gate_up = MergedColumnParallelLinear(64, [128, 128], quant_config=cfg,
                                         prefix=LAYER + "mlp.gate_up_proj")
    down = RowParallelLinear(128, 64, quant_config=cfg, prefix=LAYER + "mlp.down_proj")
    return qkv, gate_up, down


@pytest.mark.parametrize("case", ["llama-int8", "llama-nf4-dq", "llama-nf4"])
def test_bitsandbytes_checkpoint_rank1(rank1_of_2, case):
    state = _state(case)
    bits = 8 if case.endswith("int8") else 4
    cfg = BitsAndBytesConfig(bits, "nf4", double_quant=case.endswith("-dq"), prequantized=True)
    qkv, gate_up, down = _layers(cfg)
    for sid in ("q", "k", "v"):
        _load(qkv, state, f"self_attn.{sid}_proj", sid)
    _load(gate_up, state, "mlp.gate_proj", 0)
    _load(gate_up, state, "mlp.up_proj", 1)
    _load(down, state, "mlp.down_proj")
    for layer in (qkv, gate_up, down):
        layer.process_weights_after_loading()
    q, k, v = (_dense(state, f"self_attn.{p}_proj") for p in "qkv")
    expect_qkv = torch.cat([q[32:], k[16:], v[16:]])
    torch.testing.assert_close(qkv.dequantized_weight, expect_qkv, atol=0, rtol=0)
    gate, up = _dense(state, "mlp.gate_proj"), _dense(state, "mlp.up_proj")
    torch.testing.assert_close(gate_up.dequantized_weight, torch.cat([gate[64:], up[64:]]),
                               atol=0, rtol=0)
    torch.testing.assert_close(down.dequantized_weight, _dense(state, "mlp.down_proj")[:, 64:],
                               atol=0, rtol=0)


def test_bitsandbytes_online_rank1_quantizes_its_slice(rank1_of_2):
    """Quantize-at-load narrows first: a row-parallel rank's 4-bit blocks are its own
    columns' (64 of them: one block a row), the same as quantizing that slice alone."""
    w = _state("llama-bf16")[LAYER + "mlp.down_proj.weight"].float()
    down = RowParallelLinear(128, 64, quant_config=BitsAndBytesConfig(4, "fp4"),
                             prefix=LAYER + "mlp.down_proj")
    down.weight.weight_loader(down.weight, w)
    down.process_weights_after_loading()
    packed, absmax = fmt.quantize_4bit(w[:, 64:], "fp4", 64)
    expect = fmt.dequantize_4bit(packed, absmax, fmt.code_table("fp4"), 64, (64, 64))
    torch.testing.assert_close(down.dequantized_weight, expect, atol=0, rtol=0)


def test_fp8_checkpoint_rank1(rank1_of_2):
    """Per-tensor scales of q, k and v stay their rows' scales after narrowing."""
    torch.manual_seed(0)
    parts = {"q": torch.randn(64, 64), "k": torch.randn(32, 64) * 3, "v": torch.randn(32, 64)}
    qkv, _, down = _layers(Fp8Config(prequantized=True))
    expect = []
    for sid, w in parts.items():
        q, s = quantize_fp8(w, per_channel=False)
        qkv.weight.weight_loader(qkv.weight, q, sid)
        qkv.weight_scale.weight_loader(qkv.weight_scale, s, sid)
        expect.append((q.float() * s)[w.shape[0] // 2:])
    w = torch.randn(64, 128)
    q, s = quantize_fp8(w, per_channel=False)
    down.weight.weight_loader(down.weight, q)
    down.weight_scale.weight_loader(down.weight_scale, s)
    for layer in (qkv, down):
        layer.process_weights_after_loading()
    torch.testing.assert_close(qkv.dequantized_weight, torch.cat(expect), atol=0, rtol=0)
    torch.testing.assert_close(down.dequantized_weight, (q.float() * s)[:, 64:], atol=0, rtol=0)
