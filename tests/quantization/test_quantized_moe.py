"""Mixture-of-experts layers whose experts are quantized (GPTQ, AWQ, compressed-tensors;
bitsandbytes and FP8 quantized at load): the layer against a dense reference built from the
packers' own dequantization, whole models against their dequantized float twins (token-exact,
float32), tensor parallelism, the loader's errors, and that the fused kernel / CUDA graphs are
kept for stacked float experts only."""

from __future__ import annotations

import json
import os
import shutil
import zlib

import pytest
import torch
from torch import nn

from octavo import LLM, SamplingParams
from octavo.layers.fused_moe import FusedMoE
from octavo.layers.quantized_experts import QuantizedExperts
from octavo.model_loader.weights import load_weights
from octavo.models.llama import LlamaForCausalLM
from octavo.quantization.awq import AWQConfig
from octavo.quantization.compressed_tensors import CompressedTensorsConfig
from octavo.quantization.gptq import GPTQConfig
from tests.quantization.packers import awq_tensors, gptq_tensors, quantize
from tests.quantization.test_compressed_tensors import _int_tensors
from tests.quantization.twins import patch_config, write_twins
from tests.test_moe import _reference
from tests.tiny_models import make_checkpoint

E, H, INTER = 8, 64, 32  # E: a packed router holds its zero points 8 a word


class _Holder(nn.Module):
    """The layer at prefix "mlp", loadable by the generic loader under a model's mapping."""

    packed_modules_mapping = LlamaForCausalLM.packed_modules_mapping

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.mlp = layer


def _pack(scheme: str, w: torch.Tensor, seed: int) -> tuple[dict[str, torch.Tensor],
                                                           torch.Tensor]:
    """Checkpoint tensors of one float weight [out, in] in ``scheme`` (group 16), and the
    float32 weight they stand for (the packers' dequantization, not Octavo's)."""
    if scheme == "compressed-tensors":  # signed 4-bit values, asymmetric, group 16
        g = torch.Generator().manual_seed(seed)
        v = torch.randint(-8, 8, w.shape, generator=g)
        scale = torch.rand(w.shape[0], w.shape[1] // 16, generator=g) / 20 + 0.01
        zp = torch.randint(-8, 8, scale.shape, generator=g)
        idx = torch.arange(w.shape[1]) // 16
        want = (v.float() - zp.float()[:, idx]) * scale[:, idx]
        return _int_tensors(v, scale, zp), want
    qz = quantize(w, 4, 16, sym=scheme == "gptq", act_order=scheme == "gptq", seed=seed)
    tensors = awq_tensors(qz) if scheme == "awq" else gptq_tensors(qz, 4, "gptq_v2")
    return tensors, qz.dequantize()


def _config(scheme: str, quantized_router: bool = False):
    if scheme == "gptq":
        return GPTQConfig(bits=4, group_size=16, desc_act=True, checkpoint_format="gptq_v2")
    if scheme == "awq":
        return AWQConfig(group_size=16)
    # llm-compressor lists the routers it leaves in float (as it does by itself).
    return CompressedTensorsConfig.from_config({"config_groups": {"g": {
        "targets": ["Linear"], "format": "pack-quantized",
        "weights": {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group",
                    "group_size": 16}}}, "ignore": [] if quantized_router else ["mlp.gate"]})


def _quantized_layer(scheme: str, top_k: int, renormalize: bool,
                     quantized_router: bool = False):
    """The layer loaded from packed expert tensors, and the dense weights they stand for."""
    torch.manual_seed(0)
    layer = FusedMoE(E, top_k, H, INTER, renormalize,
                     quant_config=_config(scheme, quantized_router), prefix="mlp")
    assert isinstance(layer.experts, QuantizedExperts) and not layer.stacked_experts
    gate_w = torch.randn(E, H)
    ckpt = {"mlp.gate.weight": gate_w}
    if quantized_router:  # the checkpoint's router is packed too
        tensors, gate_w = _pack(scheme, gate_w, seed=1)
        ckpt = {f"mlp.gate.{k}": v for k, v in tensors.items()}
    w13, w2 = torch.empty(E, 2 * INTER, H), torch.empty(E, H, INTER)
    for e in range(E):
        for proj, shape in (("gate_proj", (INTER, H)), ("up_proj", (INTER, H)),
                            ("down_proj", (H, INTER))):
            # GPTQ's act order comes from the input: gate and up share one (the seed).
            seed = zlib.crc32(f"{e}.{'down' if proj == 'down_proj' else 'in'}".encode())
            tensors, dense = _pack(scheme, torch.randn(shape) * 0.2, seed)
            for suffix, t in tensors.items():
                ckpt[f"mlp.experts.{e}.{proj}.{suffix}"] = t
            if proj == "down_proj":
                w2[e] = dense
            else:
                w13[e, (0 if proj == "gate_proj" else INTER):][:INTER] = dense
    holder = _Holder(layer)
    load_weights(holder, ckpt.items())
    for m in holder.modules():
        if m is not holder and hasattr(m, "process_weights_after_loading"):
            m.process_weights_after_loading()
    return layer, gate_w, w13, w2


@pytest.mark.parametrize("scheme", ["gptq", "awq", "compressed-tensors"])
@pytest.mark.parametrize("top_k,renormalize", [(1, False), (2, True), (2, False)])
@pytest.mark.parametrize("T", [1, 13])  # one token takes its own path (no sorting)
def test_layer_equals_a_dense_reference(scheme, top_k, renormalize, T):
    layer, gate_w, w13, w2 = _quantized_layer(scheme, top_k, renormalize)
    methods = {type(m.quant_method).__name__ for m in layer.experts.modules()
               if hasattr(m, "quant_method")}
    assert methods == {{"gptq": "GPTQLinearMethod", "awq": "AWQLinearMethod"}.get(
        scheme, "CompressedTensorsIntMethod")}
    assert not hasattr(layer.gate, "qweight")  # the router stays float
    x = torch.randn(T, H)
    torch.testing.assert_close(layer(x), _reference(x, gate_w, w13, w2, top_k, renormalize),
                               atol=1e-4, rtol=1e-4)


def test_experts_no_group_targets_stay_stacked_float():
    """compressed-tensors quantizing the attention only (or ignoring the experts): the
    experts stay stacked in float, the fused kernel's layout."""
    for groups, ignore in ((["re:.*self_attn.*"], []), (["Linear"], ["re:.*experts.*"])):
        cfg = CompressedTensorsConfig.from_config({"config_groups": {"g": {
            "targets": groups, "format": "pack-quantized",
            "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                        "group_size": 16}}}, "ignore": ignore + ["mlp.gate"]})
        layer = FusedMoE(E, 2, H, INTER, True, quant_config=cfg, prefix="mlp")
        assert layer.stacked_experts


def test_a_router_the_checkpoint_quantized_loads():
    """compressed-tensors: a router the config's targets cover (not ignored) is read as
    quantized (GPTQ / AWQ / bitsandbytes tools never quantize routers: float for those)."""
    layer, gate_w, w13, w2 = _quantized_layer("compressed-tensors", 2, True,
                                              quantized_router=True)
    assert hasattr(layer.gate, "dequantized_weight")
    x = torch.randn(9, H)
    torch.testing.assert_close(layer(x), _reference(x, gate_w, w13, w2, 2, True),
                               atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("quantization,method", [("bitsandbytes", "BitsAndBytesLinearMethod"),
                                                 ("fp8", "Fp8LinearMethod")])
def test_quantized_at_load(tmp_path, quantization, method):
    """bitsandbytes / FP8 asked for on a float MoE checkpoint quantize each expert at load;
    the layer equals the dense reference over the weights each expert then holds, which stay
    near the float ones."""
    path = make_checkpoint("qwen3_moe", str(tmp_path / "m"))
    llm = LLM(model=path, dtype="float32", skip_tokenizer_init=True, max_model_len=64,
              quantization=quantization)
    model = llm.llm_engine.executor.worker.runner.model
    layer = next(m for m in model.modules() if isinstance(m, FusedMoE))
    assert isinstance(layer.experts, QuantizedExperts)
    assert {type(m.quant_method).__name__ for m in layer.experts.modules()
            if hasattr(m, "quant_method")} == {method}
    from safetensors.torch import load_file

    state = load_file(os.path.join(path, "model.safetensors"))
    w13 = torch.stack([ex.gate_up_proj.quant_method.dense_weight(ex.gate_up_proj).float()
                       for ex in layer.experts])
    w2 = torch.stack([ex.down_proj.quant_method.dense_weight(ex.down_proj).float()
                      for ex in layer.experts])
    p = "model.layers.0.mlp.experts"
    float13 = torch.stack([torch.cat([state[f"{p}.{e}.gate_proj.weight"],
                                      state[f"{p}.{e}.up_proj.weight"]]) for e in range(8)])
    assert (w13 - float13).abs().max() < 0.05 * float13.abs().max()
    assert not torch.equal(w13, float13)  # really quantized
    x = torch.randn(5, layer.gate.input_size)
    want = _reference(x, layer.gate.weight, w13, w2, layer.top_k, layer.renormalize)
    torch.testing.assert_close(layer(x), want, atol=1e-4, rtol=1e-4)


# --- whole models from packed checkpoints --------------------------------------------------

# Shapes the group size (32) divides: expert width 64, Qwen2-MoE's shared expert 128 (halves too, for two ranks).
SHAPES = {"qwen3_moe": dict(moe_intermediate_size=64),
          "qwen2_moe": dict(moe_intermediate_size=64, shared_expert_intermediate_size=128),
          "mixtral": dict(intermediate_size=64)}
_PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
         "w1", "w2", "w3")
_SAME_INPUT = {"k_proj": "q_proj", "v_proj": "q_proj", "up_proj": "gate_proj", "w3": "w1"}
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
PROMPTS = [{"prompt_token_ids": [(7 * i + 3 * n) % 500 for i in range(n)]} for n in (1, 6, 13)]


def write_pair(family: str, root: str, qcfg: dict, drop: str | None = None,
               keep_float=lambda name: False, **overrides) -> tuple[str, str]:
    """A tiny random ``family`` checkpoint packed by the test packers (every projection but
    the routers and those ``keep_float(name)`` names: experts, shared expert, attention),
    and its twin holding the dequantized float weights; ``drop`` leaves one tensor out of
    the packed one."""
    from safetensors.torch import load_file

    src = make_checkpoint(family, os.path.join(root, "src"), **{**SHAPES[family], **overrides})
    state = load_file(os.path.join(src, "model.safetensors"))
    awq = qcfg["quant_method"] == "awq"
    dense, quant = {}, {}
    for name, t in state.items():
        module = name.rsplit(".", 2)[-2]
        if not name.endswith(".weight") or module not in _PROJ or keep_float(name):
            dense[name] = quant[name] = t
            continue
        stem = name[:-len("weight")]
        seed_name = stem.replace(f".{module}.", f".{_SAME_INPUT.get(module, module)}.")
        qz = quantize(t, 4, qcfg["group_size"], sym=not awq and qcfg["sym"],
                      act_order=qcfg.get("desc_act", False), seed=zlib.crc32(seed_name.encode()))
        dense[name] = qz.dequantize()
        tensors = awq_tensors(qz) if awq else gptq_tensors(qz, 4, qcfg["checkpoint_format"])
        quant.update({stem + k: v for k, v in tensors.items()})
    quant.pop(drop, None)
    out = write_twins(src, root, {"dense": dense, "quant": quant})
    patch_config(out[1], quantization_config=qcfg)
    return out[0], out[1]


GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": True, "sym": False,
        "checkpoint_format": "gptq"}
AWQ = {"quant_method": "awq", "version": "gemm", "bits": 4, "group_size": 32,
       "zero_point": True}


def _llm(model: str, **kwargs) -> LLM:
    return LLM(model=model, dtype="float32", skip_tokenizer_init=True, max_model_len=64,
               **kwargs)


def _greedy(llm: LLM) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


@pytest.mark.parametrize("family,qcfg", [("qwen3_moe", GPTQ), ("qwen2_moe", AWQ),
                                         ("mixtral", GPTQ), ("mixtral", AWQ)])
def test_packed_checkpoint_matches_its_dequantized_twin(tmp_path, family, qcfg):
    dense, quant = write_pair(family, str(tmp_path), qcfg)
    expect = _greedy(_llm(dense))
    llm = _llm(quant)
    model = llm.llm_engine.executor.worker.runner.model
    moes = [m for m in model.modules() if isinstance(m, FusedMoE)]
    assert moes and all(isinstance(m.experts, QuantizedExperts) for m in moes)
    if family == "qwen2_moe":  # the shared expert is a quantized dense MLP
        assert hasattr(moes[0].shared_expert.gate_up_proj.quant_method, "group_size")
    assert _greedy(llm) == expect


def test_gptq_dynamic_rules_choose_per_expert(tmp_path):
    """GPTQModel's ``dynamic`` rules apply per expert: experts 0-2 of every layer left float
    ("-:" rule), the others quantized; the float ones load their float weights."""
    import re

    rule = r".*\.experts\.[0-2]\..*"
    dense, quant = write_pair("qwen3_moe", str(tmp_path), dict(GPTQ, dynamic={f"-:{rule}": {}}),
                              keep_float=lambda n: re.match(rule, n) is not None)
    llm = _llm(quant)
    model = llm.llm_engine.executor.worker.runner.model
    experts = next(m for m in model.modules() if isinstance(m, QuantizedExperts))
    kinds = [type(e.gate_up_proj.quant_method).__name__ for e in experts]
    assert kinds == ["UnquantizedLinearMethod"] * 3 + ["GPTQLinearMethod"] * 5
    assert _greedy(llm) == _greedy(_llm(dense))


def test_tensor_parallel_equals_one_rank(tmp_path):
    """Two ranks each hold half of every quantized expert's intermediate features (and of the
    shared expert's); the down projections' partial sums are all-reduced once per layer."""
    from tests.test_tensor_parallel import _tokens

    _, quant = write_pair("qwen2_moe", str(tmp_path), GPTQ)
    assert _tokens(quant, 2) == _tokens(quant, 1)


def test_a_missing_expert_tensor_is_named(tmp_path):
    _, quant = write_pair("qwen3_moe", str(tmp_path), GPTQ,
                          drop="model.layers.2.mlp.experts.5.up_proj.scales")
    with pytest.raises(ValueError, match=r"missing 1 tensors.*"
                                         r"model\.layers\.2\.mlp\.experts\.5\.gate_up_proj\."
                                         r"scales#1"):
        _llm(quant)


def test_an_expert_width_the_groups_do_not_divide_is_named(tmp_path):
    """Expert width 48 with groups of 32: the down projection cannot hold it."""
    _, quant = write_pair("qwen3_moe", str(tmp_path), dict(GPTQ, group_size=16),
                          moe_intermediate_size=48)
    with open(os.path.join(quant, "config.json")) as f:
        cfg = json.load(f)
    cfg["quantization_config"]["group_size"] = 32
    with open(os.path.join(quant, "config.json"), "w") as f:
        json.dump(cfg, f)
    with pytest.raises(ValueError, match=r"layer 'model\.layers\.0\.mlp\.experts\.0\.down_proj'"
                                         r": input features = 48 is not divisible by "
                                         r"group_size \(32\)"):
        _llm(quant)


def test_bitsandbytes_int8_experts_stack_for_the_grouped_kernel(tmp_path, monkeypatch):
    """bitsandbytes 8-bit at load with the CUDA layout forced on the CPU: the int8 experts
    (one group per row, zero point 128) stack, and the grouped launches (Triton's
    interpreter) give the loop's output over the same stacked views."""
    pytest.importorskip("triton")
    from octavo.layers import fused_moe
    from octavo.quantization import bitsandbytes

    monkeypatch.setattr(bitsandbytes, "keeps_quantized", lambda device: True)
    monkeypatch.setattr(bitsandbytes, "use_int8_kernel", lambda device, k: True)
    path = make_checkpoint("qwen3_moe", str(tmp_path / "m"))
    llm = _llm(path, quantization="bitsandbytes")
    layer = next(m for m in llm.llm_engine.executor.worker.runner.model.modules()
                 if isinstance(m, FusedMoE))
    stacked = layer.experts.stacked
    assert stacked is not None and stacked.bits == 8
    assert stacked.group13 == stacked.hidden and stacked.group2 == stacked.inter
    x = torch.randn(5, layer.gate.input_size)
    loop = layer(x)
    monkeypatch.setattr(fused_moe, "on_kernel_device", lambda x: True)
    torch.testing.assert_close(layer(x), loop, atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("family,qcfg", [("qwen3_moe", GPTQ), ("mixtral", AWQ)])
def test_grouped_integer_experts_on_the_gpu_match_the_loop(tmp_path, monkeypatch, family, qcfg):
    """On CUDA the integer experts are stacked at load and run by ``fused_moe_int`` (decode
    steps in CUDA graphs) under OCTAVO_FUSED_MOE=1: the loop's greedy tokens, float32."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    _, quant = write_pair(family, str(tmp_path), qcfg)
    runs = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("OCTAVO_FUSED_MOE", flag)
        llm = _llm(quant)
        runner = llm.llm_engine.executor.worker.runner
        experts = next(m for m in runner.model.modules() if isinstance(m, QuantizedExperts))
        assert experts.stacked is not None
        assert (runner.graph_runner is not None) == (flag == "1")
        runs[flag] = _greedy(llm)
        llm.llm_engine.shutdown()
    assert runs["1"] == runs["0"]


def test_cuda_graphs_only_for_stacked_float_experts(tmp_path, monkeypatch):
    """Under OCTAVO_FUSED_MOE=1 the grouped kernels (and so CUDA graphs) take stacked float
    experts, and integer experts only where they were stacked on the kernel path (CUDA; see
    the GPU test above): here, on the CPU, quantized experts stay on the loop, which syncs
    with the host."""
    monkeypatch.setenv("OCTAVO_FUSED_MOE", "1")
    dense, quant = write_pair("mixtral", str(tmp_path), AWQ)
    for path, safe in ((dense, True), (quant, False)):
        model = _llm(path).llm_engine.executor.worker.runner.model
        assert model.cuda_graph_safe is safe


_STYLES = {  # Mixtral's expert names as the tools write them (the original: w1 / w3 / w2)
    "gptqmodel": (".mlp.", {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}),
    "llmcompressor": (".block_sparse_moe.", {"w1": "gate_proj", "w3": "up_proj",
                                             "w2": "down_proj"}),
}


def _restyle(folder: str, dst: str, style: str) -> str:
    import re

    from safetensors.torch import load_file, save_file

    block, projs = _STYLES[style]
    shutil.copytree(folder, dst)
    state = load_file(os.path.join(folder, "model.safetensors"))
    out = {}
    for name, t in state.items():
        name = name.replace(".block_sparse_moe.", block)
        name = re.sub(r"\.experts\.(\d+)\.(w[123])\.",
                      lambda m: f".experts.{m.group(1)}.{projs[m.group(2)]}.", name)
        out[name] = t
    save_file(out, os.path.join(dst, "model.safetensors"))
    return dst


@pytest.mark.parametrize("style", list(_STYLES))
def test_mixtral_expert_names_as_the_tools_write_them(tmp_path, style):
    """GPTQModel 7.7 (over transformers 5) writes ``mlp.experts.3.gate_proj``, llm-compressor
    0.14 ``block_sparse_moe.experts.3.gate_proj``; both, for quantized and for float experts,
    load as the original ``block_sparse_moe.experts.3.w1`` names do."""
    dense, quant = write_pair("mixtral", str(tmp_path), GPTQ)
    expect = _greedy(_llm(quant))
    assert expect == _greedy(_llm(dense))
    for folder in (quant, dense):
        restyled = _restyle(folder, f"{folder}-{style}", style)
        assert _greedy(_llm(restyled)) == expect


def test_bitsandbytes_checkpoint_with_quantized_experts(tmp_path):
    """A bitsandbytes checkpoint written when experts were linears (transformers 4): int8
    experts with their row scales (``SCB``: W = q * SCB / 127), everything else float, as the
    checkpoint's names say. It matches its twin holding the dequantized experts."""
    from safetensors.torch import load_file

    src = make_checkpoint("qwen3_moe", str(tmp_path / "src"))
    state = load_file(os.path.join(src, "model.safetensors"))
    dense, quant = {}, {}
    for name, t in state.items():
        if ".experts." not in name:
            dense[name] = quant[name] = t
            continue
        scb = t.abs().amax(dim=1).float()  # written from the format, not Octavo's code
        q = torch.round(t / scb[:, None] * 127).clamp(-127, 127).to(torch.int8)
        module = name[:-len(".weight")]
        quant[name], quant[f"{module}.SCB"] = q, scb
        dense[name] = q.float() * scb[:, None] / 127
    folders = write_twins(src, str(tmp_path), {"dense": dense, "quant": quant})
    patch_config(folders[1], quantization_config={"quant_method": "bitsandbytes",
                                                  "load_in_8bit": True})
    llm = _llm(folders[1])
    model = llm.llm_engine.executor.worker.runner.model
    moe = next(m for m in model.modules() if isinstance(m, FusedMoE))
    assert isinstance(moe.experts, QuantizedExperts)
    assert type(moe.experts[0].down_proj.quant_method).__name__ == "BitsAndBytesLinearMethod"
    assert type(model.model.layers[0].self_attn.qkv_proj.quant_method).__name__ == \
        "UnquantizedLinearMethod"  # stored float: float here
    assert _greedy(llm) == _greedy(_llm(folders[0]))
