"""FP8 experts kept in FP8 for the grouped kernel (``fused_moe``'s FP8 path): vLLM's online
``quantization="fp8"`` (a scale per tensor, repeated per row), block-scaled checkpoints
(``weight_scale_inv``, DeepSeek / Qwen3-FP8 style) and llm-compressor's FP8 W8A16 stack as
``Fp8Experts`` where the grouped kernels run (forced onto Triton's CPU interpreter here):
the weights stay one byte each, the experts' layers hold views into the stack, and the
grouped launches give the loop's layer output and the dequantized twin's greedy tokens
(float32). Where the kernels do not run, the layers dequantize at load as before."""

from __future__ import annotations

import pytest
import torch

from octavo import LLM, SamplingParams
from octavo.kernels.fused_moe import FP8, Fp8Experts
from octavo.layers import fused_moe
from octavo.layers.fused_moe import FusedMoE
from tests.quantization.test_fp8 import _dequantized_twin, _write_fp8_checkpoint
from tests.tiny_models import make_checkpoint

pytest.importorskip("triton")

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
PROMPTS = [{"prompt_token_ids": [(7 * i + 3 * n) % 500 for i in range(n)]} for n in (1, 9)]
BLOCK_QCFG = {"quant_method": "fp8", "activation_scheme": "dynamic",
              "weight_block_size": [16, 32], "fmt": "e4m3"}


def _llm(path: str, **kwargs) -> LLM:
    return LLM(model=path, dtype="float32", skip_tokenizer_init=True, max_model_len=64,
               device="cpu", **kwargs)


def _moe(llm: LLM) -> FusedMoE:
    return next(m for m in llm.llm_engine.executor.worker.runner.model.modules()
                if isinstance(m, FusedMoE))


def _greedy(llm: LLM) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


@pytest.fixture(scope="module")
def float_moe(tmp_path_factory):
    # Expert width 48: the gate/up split falls on an edge of 16-row blocks, and the down
    # projection's 48 columns end in a half block of 32.
    return make_checkpoint("qwen3_moe", str(tmp_path_factory.mktemp("fp8moe") / "src"))


@pytest.fixture(scope="module")
def block_moe(float_moe, tmp_path_factory):
    root = tmp_path_factory.mktemp("fp8block")
    quant = _write_fp8_checkpoint(float_moe, str(root / "q"), BLOCK_QCFG, block=(16, 32))
    return quant, _dequantized_twin(quant, str(root / "twin"), block=(16, 32))


def _grouped_equals_loop(monkeypatch, layer: FusedMoE) -> None:
    x = torch.randn(7, layer.gate.input_size, generator=torch.Generator().manual_seed(1))
    grouped = layer(x)
    monkeypatch.setattr(fused_moe, "on_kernel_device", lambda x: False)
    loop = layer(x)  # each expert's layers dequantize their kept FP8 views per call
    monkeypatch.setattr(fused_moe, "on_kernel_device", lambda x: True)
    torch.testing.assert_close(grouped, loop, atol=1e-5, rtol=1e-5)


def _assert_held_in_fp8(layer: FusedMoE, block) -> Fp8Experts:
    stacked = layer.experts.stacked
    assert isinstance(stacked, Fp8Experts) and stacked.block == block
    assert stacked.w13.dtype == FP8 and stacked.w2.dtype == FP8
    for ex in layer.experts:
        for lin in (ex.gate_up_proj, ex.down_proj):
            assert getattr(lin, "dequantized_weight", None) is None
    held = layer.experts[3].gate_up_proj.weight_fp8
    assert held.untyped_storage().data_ptr() == stacked.w13.untyped_storage().data_ptr()
    return stacked


def test_block_checkpoint_kept_in_blocks(block_moe, monkeypatch):
    quant, twin = block_moe
    expect = _greedy(_llm(twin))
    monkeypatch.setattr(fused_moe, "on_kernel_device", lambda x: True)
    llm = _llm(quant)
    layer = _moe(llm)
    stacked = _assert_held_in_fp8(layer, (16, 32))
    e, inter, hidden = stacked.w2.shape[0], stacked.w2.shape[2], stacked.w2.shape[1]
    assert tuple(stacked.s13.shape) == (e, 2 * inter // 16, hidden // 32)
    assert tuple(stacked.s2.shape) == (e, hidden // 16, -(-inter // 32))
    assert llm.llm_engine.executor.worker.runner.model.cuda_graph_safe
    _grouped_equals_loop(monkeypatch, layer)
    assert _greedy(llm) == expect


def test_block_checkpoint_dequantized_where_the_kernel_does_not_run(block_moe):
    llm = _llm(block_moe[0])
    layer = _moe(llm)
    assert not isinstance(layer.experts.stacked, Fp8Experts)
    assert layer.experts[0].down_proj.dequantized_weight.dtype == torch.float32


def test_blocks_off_the_split_are_dequantized(float_moe, tmp_path, monkeypatch):
    """32-row blocks do not put the gate/up split (row 48) on an edge: those layers
    dequantize at load and nothing stacks in FP8; the tokens stay the twin's."""
    qcfg = {**BLOCK_QCFG, "weight_block_size": [32, 32]}
    quant = _write_fp8_checkpoint(float_moe, str(tmp_path / "q"), qcfg, block=(32, 32))
    monkeypatch.setattr(fused_moe, "on_kernel_device", lambda x: True)
    layer = _moe(_llm(quant))
    assert not isinstance(layer.experts.stacked, Fp8Experts)
    assert layer.experts[0].gate_up_proj.dequantized_weight is not None
    _grouped_equals_loop(monkeypatch, layer)


@pytest.mark.parametrize("quantization", ["fp8", "fp8-per-channel"])
def test_online_fp8_experts_kept_per_row(float_moe, quantization, monkeypatch):
    """``quantization="fp8"`` on a float checkpoint: each expert quantized at load, kept in
    FP8 with its row scales; the grouped launches (activations not rounded to FP8, as the
    FP8 GEMV leaves decode rows) give the loop's output over the same weights."""
    monkeypatch.setattr(fused_moe, "on_kernel_device", lambda x: True)
    layer = _moe(_llm(float_moe, quantization=quantization))
    stacked = _assert_held_in_fp8(layer, None)
    assert tuple(stacked.s13.shape) == tuple(stacked.w13.shape[:2])
    if quantization == "fp8":  # one scale per checkpoint tensor: gate's rows, then up's
        inter = stacked.w2.shape[2]
        assert stacked.s13[0, :inter].unique().numel() == 1
    _grouped_equals_loop(monkeypatch, layer)


def test_no_fp8_kept_with_the_grouped_kernels_off(float_moe, monkeypatch):
    monkeypatch.setattr(fused_moe, "on_kernel_device", lambda x: True)
    monkeypatch.setenv("OCTAVO_FUSED_MOE", "0")
    layer = _moe(_llm(float_moe, quantization="fp8"))
    assert not isinstance(layer.experts.stacked, Fp8Experts)
    assert layer.experts[0].down_proj.dequantized_weight is not None


@pytest.mark.gpu
@pytest.mark.parametrize("which", ["blocks", "online"])
def test_on_the_gpu_grouped_matches_the_loop(block_moe, float_moe, which, monkeypatch):
    """On CUDA (compute capability 8.9+): the experts stay FP8 and run in the grouped
    launches, decode steps in CUDA graphs, under OCTAVO_FUSED_MOE=1; with it off they
    dequantize at load and run the loop. Equal greedy tokens, float32."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("needs CUDA with e4m3 (compute capability 8.9)")
    path, kw = (block_moe[0], {}) if which == "blocks" else (float_moe, {"quantization": "fp8"})
    if which == "online":  # every layer weight-only in both runs (torch._scaled_mm, which
        # the loop's experts would take, rounds the activations to FP8)
        from octavo.quantization import fp8

        monkeypatch.setattr(fp8, "use_scaled_mm", lambda device: False)
    runs = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("OCTAVO_FUSED_MOE", flag)
        llm = LLM(model=path, dtype="float32", skip_tokenizer_init=True, max_model_len=64,
                  **kw)
        runner = llm.llm_engine.executor.worker.runner
        assert isinstance(_moe(llm).experts.stacked, Fp8Experts) == (flag == "1")
        assert (runner.graph_runner is not None) == (flag == "1")
        runs[flag] = _greedy(llm)
        llm.llm_engine.shutdown()
    assert runs["1"] == runs["0"]


def test_dummy_weights_keep_blocks(float_moe, tmp_path, monkeypatch):
    """load_format="dummy" on a block-scaled config (benchmarks/quantized.py's fp8_block):
    the experts get random FP8 blocks and stack as the checkpoint's would."""
    import json
    import shutil

    path = str(tmp_path / "m")
    shutil.copytree(float_moe, path)
    with open(f"{path}/config.json") as f:
        cfg = json.load(f)
    with open(f"{path}/config.json", "w") as f:
        json.dump({**cfg, "quantization_config": BLOCK_QCFG}, f)
    monkeypatch.setattr(fused_moe, "on_kernel_device", lambda x: True)
    layer = _moe(_llm(path, load_format="dummy"))
    _assert_held_in_fp8(layer, (16, 32))
    _grouped_equals_loop(monkeypatch, layer)


@pytest.mark.parametrize("strategy", ["channel", "tensor"])
def test_compressed_tensors_w8a8_experts_stack_weight_only(strategy, monkeypatch):
    """llm-compressor's FP8 W8A8 (dynamic per-token activations, as its FP8_DYNAMIC preset)
    experts stack in FP8 where the grouped kernel runs, and it runs them weight-only: the
    dense reference over the dequantized weights, activations unrounded."""
    from torch import nn

    from octavo.layers.quantized_experts import QuantizedExperts
    from octavo.model_loader.weights import load_weights
    from octavo.models.llama import LlamaForCausalLM
    from octavo.quantization.compressed_tensors import CompressedTensorsConfig
    from tests.test_moe import _reference

    e, h, inter = 4, 64, 32
    cfg = CompressedTensorsConfig.from_config({"config_groups": {"g": {
        "targets": ["Linear"], "format": "float-quantized",
        "weights": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": strategy},
        "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                              "dynamic": True}}}, "ignore": ["mlp.gate"]})

    class Holder(nn.Module):
        packed_modules_mapping = LlamaForCausalLM.packed_modules_mapping

        def __init__(self):
            super().__init__()
            self.mlp = FusedMoE(e, 2, h, inter, True, quant_config=cfg, prefix="mlp")

    monkeypatch.setattr(fused_moe, "on_kernel_device", lambda x: True)
    holder = Holder()
    assert isinstance(holder.mlp.experts, QuantizedExperts)
    g = torch.Generator().manual_seed(0)
    gate_w = torch.randn(e, h, generator=g)
    ckpt = {"mlp.gate.weight": gate_w}
    w13, w2 = torch.empty(e, 2 * inter, h), torch.empty(e, h, inter)
    for ex in range(e):
        for proj, rows, cols in (("gate_proj", inter, h), ("up_proj", inter, h),
                                 ("down_proj", h, inter)):
            w = (torch.randn(rows, cols, generator=g) * 50).clamp(-448, 448).to(FP8)
            s = torch.rand(rows, 1, generator=g) / 500 + 1e-4 if strategy == "channel" \
                else torch.rand(1, generator=g) / 500 + 1e-4
            ckpt[f"mlp.experts.{ex}.{proj}.weight"] = w
            ckpt[f"mlp.experts.{ex}.{proj}.weight_scale"] = s
            dense = w.float() * s.reshape(-1, 1)
            if proj == "down_proj":
                w2[ex] = dense
            else:
                w13[ex, (0 if proj == "gate_proj" else inter):][:inter] = dense
    load_weights(holder, ckpt.items())
    for m in holder.modules():
        if m is not holder and hasattr(m, "process_weights_after_loading"):
            m.process_weights_after_loading()
    holder.mlp.experts.finish_loading()
    assert isinstance(holder.mlp.experts.stacked, Fp8Experts)
    x = torch.randn(6, h, generator=g)
    torch.testing.assert_close(holder.mlp(x), _reference(x, gate_w, w13, w2, 2, True),
                               atol=1e-4, rtol=1e-4)
