"""compressed-tensors checkpoints written by llm-compressor itself
(scripts/quant_fixtures/make_compressed_tensors.py): Octavo detects the method, and its greedy
tokens and last-step logprobs equal transformers' on the same checkpoint (float32). Plus the
format's bit layout worked by hand, the ignore list, and the errors for what it cannot run.
Needs only Octavo: the fixtures and transformers' outputs are committed."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
import torch.nn.functional as F

from octavo import LLM, SamplingParams
from octavo.layers.linear import QKVParallelLinear, ReplicatedLinear, RowParallelLinear
from octavo.models.llama import LlamaForCausalLM
from octavo.quantization import build_quant_config, int_weight
from octavo.quantization.base import QuantizationConfig
from octavo.quantization.compressed_tensors import CompressedTensorsConfig, matches_target
from octavo.quantization.compressed_tensors_int import CompressedTensorsIntMethod
from octavo.quantization.fp8_linear import Fp8LinearMethod
from octavo.quantization.unquantized import UnquantizedLinearMethod

ROOT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "compressed_tensors")
FIXTURES = sorted(os.listdir(ROOT))
W4_GROUP = {"targets": ["Linear"], "format": "pack-quantized",
            "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                        "group_size": 32}}


def _signed(u: int) -> int:
    return u - 2**32 if u >= 2**31 else u


def _reference(name: str) -> dict:
    with open(os.path.join(ROOT, name, "reference.json")) as f:
        return json.load(f)


def _run(model: str, ref: dict, **kwargs):
    llm = LLM(model=model, dtype="float32", max_model_len=64, **kwargs)
    runs = ref["transformers_runs"]
    params = SamplingParams(temperature=0.0, max_tokens=ref["max_new_tokens"], ignore_eos=True,
                            logprobs=5)
    outs = llm.generate([{"prompt_token_ids": r["prompt_token_ids"]} for r in runs], params,
                        use_tqdm=False)
    return llm, [o.outputs[0] for o in outs]


def _methods(llm: LLM) -> dict[str, str]:
    model = llm.llm_engine.executor.worker.runner.model
    return {name: type(m.quant_method).__name__ for name, m in model.named_modules()
            if hasattr(m, "quant_method")}


# FP8 activations rounded in groups of 32 columns (the FP8_BLOCK preset): every linear's
# input equals transformers' to ~1e-6 and its output equals transformers' exactly on
# transformers' input, but an input a last bit away can round to the neighbouring FP8 value
# (6% of that element), so the logprobs stay within this (observed 1.3e-2), not 1e-4.
GROUP_ACT_LOGPROB_ATOL = 3e-2


def _check_against_transformers(outs, ref, atol: float = 1e-4) -> None:
    for out, run in zip(outs, ref["transformers_runs"]):
        assert list(out.token_ids) == run["token_ids"], run["prompt_token_ids"]
        last = out.logprobs[-1]
        for tok, lp in run["last_top_logprobs"].items():
            assert int(tok) in last, (tok, sorted(last))
            assert last[int(tok)].logprob == pytest.approx(lp, abs=atol)


# --- checkpoints made by llm-compressor ------------------------------------------------------

@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_matches_transformers(name, monkeypatch):
    # On a GPU, kept FP8 blocks run weight-only (the activations unrounded): the scheme's
    # arithmetic is the dequantized layers'.
    monkeypatch.setenv("OCTAVO_FP8_BLOCK_KEPT", "0")
    ref = _reference(name)
    llm, outs = _run(os.path.join(ROOT, name), ref)
    _check_against_transformers(outs, ref, GROUP_ACT_LOGPROB_ATOL if "block" in name else 1e-4)
    methods = _methods(llm)
    want = "Fp8LinearMethod" if "fp8" in name else "CompressedTensorsIntMethod"
    assert methods["model.layers.0.self_attn.qkv_proj"] == want
    assert methods["model.layers.0.mlp.down_proj"] == want


@pytest.mark.gpu
@pytest.mark.parametrize("name", [n for n in FIXTURES if "w8a16" in n])
def test_w8a16_on_the_rows_gemv_matches_transformers(name, monkeypatch):
    """Every 8-bit layer on the rows layout (octavo/kernels/int8_gemv.py: the one- and
    two-row GEMV with its fused activation and rotary stores, the along-K kernels through
    strides for the prompt): still transformers' tokens and logprobs (float32)."""
    monkeypatch.setenv("OCTAVO_INT_WEIGHT_LAYOUT", "rows")
    ref = _reference(name)
    llm, outs = _run(os.path.join(ROOT, name), ref)
    _check_against_transformers(outs, ref)
    model = llm.llm_engine.executor.worker.runner.model
    assert model.model.layers[0].mlp.down_proj.kernel_layout == "rows"


def test_ignored_layers_stay_float_with_regex_ignore(tmp_path):
    """The asymmetric fixture leaves layer 1's MLP in float (llm-compressor wrote the names);
    the same checkpoint with the ignore list as a ``re:`` regex loads the same way."""
    name = "qwen2-w4a16-g32-asym"
    ref = _reference(name)
    folder = tmp_path / name
    shutil.copytree(os.path.join(ROOT, name), folder)
    with open(folder / "config.json") as f:
        cfg = json.load(f)
    assert "model.layers.1.mlp.down_proj" in cfg["quantization_config"]["ignore"]
    cfg["quantization_config"]["ignore"] = ["lm_head", "re:.*layers\\.1\\.mlp\\."]
    with open(folder / "config.json", "w") as f:
        json.dump(cfg, f)
    llm, outs = _run(str(folder), ref)
    _check_against_transformers(outs, ref)
    methods = _methods(llm)
    assert methods["model.layers.1.mlp.gate_up_proj"] == "UnquantizedLinearMethod"
    assert methods["model.layers.1.mlp.down_proj"] == "UnquantizedLinearMethod"
    assert methods["model.layers.1.self_attn.qkv_proj"] == "CompressedTensorsIntMethod"
    assert methods["model.layers.0.mlp.gate_up_proj"] == "CompressedTensorsIntMethod"
    model = llm.llm_engine.executor.worker.runner.model
    assert model.model.layers[1].mlp.down_proj.weight.dtype == torch.float32


def test_gpu_layout_through_the_interpreter_matches(monkeypatch):
    """The CUDA path (repack into the Triton kernel's layout) forced on the CPU, where the
    kernel runs in Triton's interpreter: still transformers' tokens."""
    pytest.importorskip("triton")
    if torch.cuda.is_available():
        pytest.skip("the forced kernel path on CPU tensors needs Triton's interpreter")
    monkeypatch.setattr(int_weight, "use_kernel", lambda device, k, g, bits: True)
    name = "qwen2-w4a16-g32-asym"
    ref = _reference(name)
    # One prompt, 4 of the reference's 12 tokens (a prefill and three decode steps through
    # the interpreted kernel: CI's slowest test took 35 s for all 12).
    run = ref["transformers_runs"][0]
    ref = {**ref, "transformers_runs": [run], "max_new_tokens": 4}
    llm, outs = _run(os.path.join(ROOT, name), ref)
    model = llm.llm_engine.executor.worker.runner.model
    assert model.model.layers[0].mlp.down_proj.kernel_group == 32
    assert list(outs[0].token_ids) == run["token_ids"][:4], run["prompt_token_ids"]


def test_wrong_quantization_for_the_checkpoint_is_an_error():
    model = os.path.join(ROOT, "llama-w4a16-g32-sym")
    for wrong in ("gptq", "awq"):
        with pytest.raises(ValueError, match=rf"quantization='{wrong}' does not match the "
                                             r"checkpoint, which declares "
                                             r"quant_method='compressed-tensors'"):
            LLM(model=model, dtype="float32", max_model_len=64, quantization=wrong)


# --- the format by hand ----------------------------------------------------------------------

def test_pack_quantized_layer_hand_worked():
    """W4A16, group 8, asymmetric, one layer of 8 outputs x 8 inputs. Each value ``v`` is
    stored as ``v + 8``, eight per int32, input ``i`` at bits 4i; the zero points the same way
    along the *output*. Row 0 holds v = -8..-1 (0x76543210), row 1 v = 0..7 (0xFEDCBA98),
    the rest v = 0 (0x88888888). Zero points (outputs 0..7) 0, 1, -1, 2, 0, 0, 0, 0 ->
    stored 8, 9, 7, 10, 8, 8, 8, 8 -> 0x8888A798. Scale of output o: (o + 1) / 4."""
    packed = torch.tensor([[_signed(0x76543210)], [_signed(0xFEDCBA98)]]
                          + [[_signed(0x88888888)]] * 6, dtype=torch.int32)
    zero_point = torch.tensor([[_signed(0x8888A798)]], dtype=torch.int32)
    scale = (torch.arange(8, dtype=torch.float32) + 1).view(8, 1) / 4
    cfg = CompressedTensorsConfig.from_config({
        "quant_method": "compressed-tensors", "format": "pack-quantized",
        "config_groups": {"g": {**W4_GROUP, "weights": {**W4_GROUP["weights"],
                                                          "group_size": 8,
                                                          "symmetric": False}}}})
    layer = ReplicatedLinear(8, 8, quant_config=cfg, prefix="model.layers.0.mlp.down_proj")
    assert isinstance(layer.quant_method, CompressedTensorsIntMethod)
    for pname, t in (("weight_packed", packed), ("weight_scale", scale),
                     ("weight_zero_point", zero_point),
                     ("weight_shape", torch.tensor([8, 8]))):
        param = getattr(layer, pname)
        param.weight_loader(param, t)
    layer.process_weights_after_loading()
    v = torch.zeros(8, 8)
    v[0] = torch.arange(-8, 0)
    v[1] = torch.arange(0, 8)
    zeros = torch.tensor([0, 1, -1, 2, 0, 0, 0, 0], dtype=torch.float32).view(8, 1)
    want = (v - zeros) * scale
    assert want[1].tolist() == [-0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
    assert want[2].tolist() == [0.75] * 8
    torch.testing.assert_close(layer.dequantized_weight, want, atol=0, rtol=0)
    x = torch.randn(3, 8)
    torch.testing.assert_close(layer(x), F.linear(x, want))


def test_hand_worked_example_agrees_with_compressed_tensors():
    """The same words through compressed-tensors' own unpacking, where it is installed."""
    helpers = pytest.importorskip("compressed_tensors.compressors.pack_quantized.helpers")
    packed = torch.tensor([[_signed(0x76543210)], [_signed(0xFEDCBA98)]], dtype=torch.int32)
    theirs = helpers.unpack_from_int32(packed, 4, torch.Size([2, 8]))
    assert theirs.tolist() == [list(range(-8, 0)), list(range(0, 8))]
    zp = helpers.unpack_from_int32(torch.tensor([[_signed(0x8888A798)]], dtype=torch.int32), 4,
                                   torch.Size([8, 1]), packed_dim=0)
    assert zp.view(-1).tolist() == [0, 1, -1, 2, 0, 0, 0, 0]


def test_w8a16_channel_symmetric_layer_matches_dequantized():
    """8-bit, one scale per output channel, symmetric: v + 128 in each byte, four per int32."""
    torch.manual_seed(0)
    v = torch.randint(-128, 128, (16, 32))
    scale = torch.rand(16, 1) / 10
    packed = _pack_inputs(v, 8)
    cfg = CompressedTensorsConfig.from_config({
        "quant_method": "compressed-tensors", "format": "pack-quantized",
        "config_groups": {"g": {"targets": ["Linear"], "weights": {
            "num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"}}}})
    layer = RowParallelLinear(32, 16, quant_config=cfg, prefix="model.layers.0.self_attn.o_proj")
    for pname, t in (("weight_packed", packed), ("weight_scale", scale),
                     ("weight_shape", torch.tensor([16, 32]))):
        getattr(layer, pname).weight_loader(getattr(layer, pname), t)
    layer.process_weights_after_loading()
    torch.testing.assert_close(layer.dequantized_weight, v.float() * scale, atol=0, rtol=0)


def _pack_inputs(v: torch.Tensor, bits: int) -> torch.Tensor:
    """Signed values [out, in] -> pack-quantized int32 [out, in * bits / 32] (v + offset,
    input i at bits (i % pack) * bits), written from the format's definition."""
    pack = 32 // bits
    u = (v + (1 << (bits - 1))).to(torch.int64).view(v.shape[0], -1, pack)
    words = (u << (torch.arange(pack) * bits)).sum(-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def test_naive_quantized_asymmetric_group_layer():
    """naive-quantized keeps one int8 per value and int8 zero points, both signed."""
    torch.manual_seed(2)
    v = torch.randint(-128, 128, (16, 64), dtype=torch.int8)
    zp = torch.randint(-20, 20, (16, 2), dtype=torch.int8)
    scale = torch.rand(16, 2) / 10
    cfg = CompressedTensorsConfig.from_config({"config_groups": {"g": {
        "targets": ["Linear"], "format": "naive-quantized",
        "weights": {"num_bits": 8, "type": "int", "symmetric": False, "strategy": "group",
                    "group_size": 32}}}})
    layer = ReplicatedLinear(64, 16, quant_config=cfg, prefix="model.layers.0.mlp.down_proj")
    assert not hasattr(layer, "weight_shape")
    for pname, t in (("weight", v), ("weight_scale", scale), ("weight_zero_point", zp)):
        getattr(layer, pname).weight_loader(getattr(layer, pname), t)
    layer.process_weights_after_loading()
    want = (v.float() - zp.float().repeat_interleave(32, 1)) * scale.repeat_interleave(32, 1)
    torch.testing.assert_close(layer.dequantized_weight, want, atol=0, rtol=0)


@pytest.mark.parametrize("path", ["cpu", "kernel"])
def test_actorder_group_g_idx_layer(path, monkeypatch):
    """actorder "group" stores weight_g_idx, the group of each input; on the GPU path the
    inputs are sorted by group once at load."""
    if path == "kernel":
        pytest.importorskip("triton")
        if torch.cuda.is_available():
            pytest.skip("the forced kernel path on CPU tensors needs Triton's interpreter")
        monkeypatch.setattr(int_weight, "use_kernel", lambda device, k, g, bits: True)
    torch.manual_seed(3)
    v = torch.randint(-8, 8, (32, 64))
    scale = torch.rand(32, 4) / 10 + 0.01
    g_idx = (torch.randperm(64) // 16).to(torch.int32)
    cfg = CompressedTensorsConfig.from_config({"config_groups": {"g": {
        **W4_GROUP, "weights": {**W4_GROUP["weights"], "group_size": 16,
                                "actorder": "group"}}}})
    layer = RowParallelLinear(64, 32, quant_config=cfg, prefix="model.layers.0.mlp.down_proj")
    for pname, t in (("weight_packed", _pack_inputs(v, 4)), ("weight_scale", scale),
                     ("weight_g_idx", g_idx), ("weight_shape", torch.tensor([32, 64]))):
        getattr(layer, pname).weight_loader(getattr(layer, pname), t)
    layer.process_weights_after_loading()
    want = v.float() * scale[:, g_idx.long()]
    x = torch.randn(3, 64)
    torch.testing.assert_close(layer(x), F.linear(x, want), atol=1e-4, rtol=1e-4)
    assert (layer.kernel_group is not None) == (path == "kernel")


def _int_tensors(v: torch.Tensor, scale: torch.Tensor, zp: torch.Tensor | None,
                 g_idx: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    t = {"weight_packed": _pack_inputs(v, 4), "weight_scale": scale,
         "weight_shape": torch.tensor(list(v.shape))}
    if zp is not None:  # packed along the output, like the weight along the input
        t["weight_zero_point"] = _pack_inputs(zp.t().contiguous(), 4).t().contiguous()
    if g_idx is not None:
        t["weight_g_idx"] = g_idx
    return t


def _dequantize(v, scale, zp, g_idx):
    z = torch.zeros_like(scale) if zp is None else zp.float()
    return (v.float() - z[:, g_idx.long()]) * scale[:, g_idx.long()]


@pytest.mark.parametrize("actorder", [False, True])
def test_tensor_parallel_shards_rebuild_the_layer(actorder, monkeypatch):
    """Ranks 0 and 1 of 2 each load the whole checkpoint tensors and keep their slice: merged
    gate/up (column-parallel: packed zero points narrowed along the output) and down
    (row-parallel: packed weight narrowed along the input; with act order every rank keeps
    every group)."""
    from octavo.distributed import parallel_state
    from octavo.layers.linear import MergedColumnParallelLinear

    torch.manual_seed(4)
    weights = {**W4_GROUP["weights"], "group_size": 16, "symmetric": False}
    if actorder:
        weights["actorder"] = "group"
    cfg = CompressedTensorsConfig.from_config({"config_groups": {"g": {**W4_GROUP,
                                                                       "weights": weights}}})

    def make(out_f, in_f):
        v = torch.randint(-8, 8, (out_f, in_f))
        g = (torch.randperm(in_f) if actorder else torch.arange(in_f)) // 16
        return v, torch.rand(out_f, in_f // 16) + 0.1, torch.randint(-8, 8, (out_f, in_f // 16)), g

    gate, up, down = make(16, 64), make(16, 64), make(64, 32)
    up = (*up[:3], gate[3])  # one input, one act order: a merged layer holds one g_idx
    for rank in (0, 1):
        monkeypatch.setattr(parallel_state, "_TP", parallel_state.TPGroup(rank=rank, size=2))
        col = MergedColumnParallelLinear(64, [16, 16], quant_config=cfg,
                                         prefix="model.layers.0.mlp.gate_up_proj")
        row = RowParallelLinear(32, 64, quant_config=cfg, prefix="model.layers.0.mlp.down_proj")
        for sid, part in ((0, gate), (1, up)):
            for pname, t in _int_tensors(*part[:3], part[3] if actorder else None).items():
                getattr(col, pname).weight_loader(getattr(col, pname), t, sid)
        for pname, t in _int_tensors(*down[:3], down[3] if actorder else None).items():
            getattr(row, pname).weight_loader(getattr(row, pname), t)
        col.process_weights_after_loading()
        row.process_weights_after_loading()
        rows = slice(8 * rank, 8 * rank + 8)
        want_col = torch.cat([_dequantize(*gate)[rows], _dequantize(*up)[rows]])
        torch.testing.assert_close(col.dequantized_weight, want_col, atol=0, rtol=0)
        cols = slice(16 * rank, 16 * rank + 16)
        torch.testing.assert_close(row.dequantized_weight, _dequantize(*down)[:, cols],
                                   atol=0, rtol=0)


# --- FP8 -------------------------------------------------------------------------------------

class _OneMethod(QuantizationConfig):
    def __init__(self, method) -> None:
        super().__init__()
        self.method = method

    def get_quant_method(self, layer, prefix):
        return self.method


def _fp8_qkv(weight_strategy: str, activations: str | None):
    torch.manual_seed(0)
    layer = QKVParallelLinear(32, 16, 2, 1, prefix="model.layers.0.self_attn.qkv_proj",
                              quant_config=_OneMethod(Fp8LinearMethod(weight_strategy,
                                                                      activations)))
    want = []
    for sid, n in (("q", 32), ("k", 16), ("v", 16)):
        f32 = {"dtype": torch.float32}  # the same checkpoint whatever the model dtype
        w = torch.randn(n, 32, **f32).to(torch.float8_e4m3fn)
        s = torch.rand(n, 1, **f32) + 0.5 if weight_strategy == "channel" \
            else torch.rand(1, **f32) + 0.5
        layer.weight.weight_loader(layer.weight, w, sid)
        layer.weight_scale.weight_loader(layer.weight_scale, s, sid)
        if activations == "static-tensor":
            layer.input_scale.weight_loader(layer.input_scale, torch.tensor([0.02], **f32), sid)
        want.append(w.float() * s.reshape(-1, 1))
    return layer, torch.cat(want)


@pytest.mark.parametrize("weight_strategy", ["tensor", "channel"])
@pytest.mark.parametrize("activations", [None, "dynamic-token", "static-tensor"])
def test_fp8_merged_layer(weight_strategy, activations):
    """Each merged part keeps its own per-tensor scale; activations go through FP8 as
    compressed-tensors computes it (scale amax / 448 per token, or the stored scale)."""
    layer, w = _fp8_qkv(weight_strategy, activations)
    layer.process_weights_after_loading()
    torch.testing.assert_close(layer.dequantized_weight, w, atol=0, rtol=0)
    x = torch.randn(5, 32)
    xq = x
    if activations == "dynamic-token":
        s = x.abs().amax(-1, keepdim=True) / 448
        xq = (x / s).clamp(-448, 448).to(torch.float8_e4m3fn).float() * s
    elif activations == "static-tensor":
        xq = (x / 0.02).clamp(-448, 448).to(torch.float8_e4m3fn).float() * 0.02
    torch.testing.assert_close(layer(x), F.linear(xq, w), atol=1e-5, rtol=1e-5)
    if activations is not None:  # the activations really are rounded
        assert not torch.allclose(layer(x), F.linear(x, w), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("activations", ["dynamic-token", "static-tensor"])
def test_fp8_scaled_mm_path_matches_dequantized(activations, monkeypatch):
    """The CUDA path (``torch._scaled_mm`` with row-wise scales) forced where this torch runs
    it on the CPU: the FP8 GEMM agrees with dequantize-then-matmul."""
    from octavo.quantization import fp8_linear

    x = torch.randn(7, 32).to(torch.bfloat16)  # values a bf16 model and a float32 one share
    monkeypatch.setattr(fp8_linear, "scaled_mm_usable", lambda device: True)
    ref_layer, _ = _fp8_qkv("tensor", activations)
    ref_layer.process_weights_after_loading()
    assert not ref_layer.fp8_mm  # a float32 model: the reference's arithmetic
    want = ref_layer(x.float())
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # the model dtype the FP8 kernels serve
    try:
        layer, _ = _fp8_qkv("tensor", activations)
    finally:
        torch.set_default_dtype(default)
    layer.process_weights_after_loading()
    assert layer.fp8_mm
    try:
        got = layer(x)
    except RuntimeError as e:  # pragma: no cover - depends on the torch build
        pytest.skip(f"torch._scaled_mm does not run on this CPU build: {e}")
    if not layer.fp8_mm:  # the layer caught _scaled_mm's failure and went to the bf16 path
        pytest.skip("torch._scaled_mm with row-wise scales does not run on this CPU build")
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=1e-2)  # a bf16 output


# --- configs and errors ----------------------------------------------------------------------

def _cfg(**extra) -> CompressedTensorsConfig:
    cfg = CompressedTensorsConfig.from_config({"quant_method": "compressed-tensors",
                                               "config_groups": {"group_0": W4_GROUP},
                                               **extra})
    cfg.packed_modules_mapping = LlamaForCausalLM.packed_modules_mapping
    return cfg


def test_target_and_ignore_matching():
    assert matches_target("model.layers.0.mlp.down_proj", "Linear")
    assert matches_target("model.layers.10.mlp.down_proj", "re:model.layers.1")  # from the start
    assert not matches_target("model.layers.0.mlp.down_proj", "re:mlp")
    assert matches_target("lm_head", "lm_head")
    assert not matches_target("model.lm_head_x", "lm_head")
    cfg = _cfg(ignore=["lm_head", "re:.*layers\\.1\\.self_attn\\.[qkv]_proj$",
                       "model.layers.0.mlp.down_proj"])
    assert cfg.get_quant_method(None, "model.layers.1.self_attn.qkv_proj") is None
    assert cfg.get_quant_method(None, "model.layers.0.mlp.down_proj") is None
    assert cfg.get_quant_method(None, "lm_head") is None
    assert isinstance(cfg.get_quant_method(None, "model.layers.0.self_attn.qkv_proj"),
                      CompressedTensorsIntMethod)


def test_groups_choose_per_module():
    fp8 = {"targets": ["re:.*mlp\\..*"], "format": "float-quantized",
           "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
           "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                                 "dynamic": True}}
    w4 = {**W4_GROUP, "targets": ["re:.*self_attn\\..*"]}
    cfg = CompressedTensorsConfig.from_config({"config_groups": {"a": fp8, "b": w4},
                                               "ignore": ["lm_head"]})
    cfg.packed_modules_mapping = LlamaForCausalLM.packed_modules_mapping
    assert isinstance(cfg.get_quant_method(None, "model.layers.0.mlp.gate_up_proj"),
                      Fp8LinearMethod)
    assert isinstance(cfg.get_quant_method(None, "model.layers.0.self_attn.o_proj"),
                      CompressedTensorsIntMethod)
    # A merged layer whose parts the checkpoint treats differently cannot be held.
    split = _cfg(ignore=["model.layers.0.self_attn.k_proj"])
    with pytest.raises(ValueError, match=r"qkv_proj' merges .*differently"):
        split.get_quant_method(None, "model.layers.0.self_attn.qkv_proj")


def test_detected_from_config_json():
    hf = type("C", (), {"quantization_config": {"quant_method": "compressed-tensors",
                                                "config_groups": {"g": W4_GROUP}}})()
    assert isinstance(build_quant_config(None, hf, None), CompressedTensorsConfig)


@pytest.mark.parametrize("group,extra,match", [
    ({**W4_GROUP, "format": "int-quantized",
      "weights": {"num_bits": 8, "type": "int", "strategy": "channel"},
      "input_activations": {"num_bits": 8, "type": "int", "strategy": "token", "dynamic": True}},
     {}, r"config group 'group_0' \(weights int 8-bit channel, input activations int 8-bit "
         r"token dynamic\): integer weights with quantized activations"),
    (W4_GROUP, {"sparsity_config": {"format": "sparse-24-bitmask",
                                     "sparsity_structure": "2:4"}},
     r"sparsity \(format 'sparse-24-bitmask', structure '2:4'\) is not supported"),
    ({**W4_GROUP, "format": "nvfp4-pack-quantized",
      "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group",
                  "group_size": 16}}, {}, r"4-bit float weights \(NVFP4"),
    ({**W4_GROUP, "format": "float-quantized",
      "weights": {"num_bits": 8, "type": "float", "strategy": "block"}}, {},
     r"block strategy needs block_structure \[rows, columns\], got None"),
    ({**W4_GROUP, "format": "float-quantized",
      "weights": {"num_bits": 8, "type": "float", "strategy": "tensor_group"}}, {},
     r"FP8 weight strategy 'tensor_group' is not supported"),
    ({**W4_GROUP, "weights": {**W4_GROUP["weights"], "num_bits": 3}}, {},
     r"3-bit integer weights are not supported"),
    (W4_GROUP, {"kv_cache_scheme": {"num_bits": 8, "type": "float"}}, r"kv_cache_scheme"),
])
def test_unsupported_schemes_are_clear_errors(group, extra, match):
    with pytest.raises(ValueError, match=match):
        CompressedTensorsConfig.from_config({"config_groups": {"group_0": group}, **extra})


def test_layer_shapes_the_scheme_cannot_hold_name_the_layer():
    cfg = _cfg()
    with pytest.raises(ValueError, match=r"layer 'model.layers.0.mlp.down_proj': input "
                                         r"features = 48 is not divisible by group_size"):
        RowParallelLinear(48, 16, quant_config=cfg, prefix="model.layers.0.mlp.down_proj")
    asym = CompressedTensorsConfig.from_config({"config_groups": {"g": {
        **W4_GROUP, "weights": {**W4_GROUP["weights"], "symmetric": False}}}})
    with pytest.raises(ValueError, match=r"layer 'o': output features = 12 is not divisible "
                                         r"by the 4-bit pack factor of weight_zero_point"):
        ReplicatedLinear(32, 12, quant_config=asym, prefix="o")


def test_a_group_covering_the_lm_head_quantizes_it():
    """A group targeting Linear covers the LM head unless the checkpoint ignores it: the head
    then holds the int method, as the linear layers do, and computes the dequantized product."""
    cfg = _cfg()
    assert isinstance(cfg.get_quant_method(None, "lm_head"), CompressedTensorsIntMethod)
    from octavo.layers.vocab_embedding import LMHead

    torch.manual_seed(7)
    head = LMHead(64, 32, cfg, "lm_head")
    assert isinstance(head.quant_method, CompressedTensorsIntMethod) and head.weight is None
    v = torch.randint(-8, 8, (64, 32))
    scale = torch.rand(64, 1) + 0.1
    for pname, t in _int_tensors(v, scale, None).items():
        getattr(head, pname).weight_loader(getattr(head, pname), t)
    head.process_weights_after_loading()
    x = torch.randn(3, 32)
    want = _dequantize(v, scale, None, torch.zeros(32, dtype=torch.long))
    torch.testing.assert_close(head(x), F.linear(x, want), atol=1e-4, rtol=1e-4)
    assert not LMHead(64, 32, _cfg(ignore=["lm_head"]), "lm_head").quantized


def test_unquantized_layers_in_a_mixed_checkpoint():
    cfg = _cfg(ignore=["lm_head", "model.layers.0.mlp.down_proj"])
    layer = RowParallelLinear(64, 32, quant_config=cfg, prefix="model.layers.0.mlp.down_proj")
    assert isinstance(layer.quant_method, UnquantizedLinearMethod)
    assert layer.weight.dtype == torch.get_default_dtype()
