"""Tiny random Llama / Qwen2 checkpoints quantized to GPTQ and AWQ by the test packer load in
Octavo with the method detected from the checkpoint, and generate the same greedy tokens as the
same model with the dequantized float weights loaded unquantized (float32, token-exact)."""

from __future__ import annotations

import json
import os
import zlib

import pytest
import torch

from octavo import LLM, SamplingParams
from tests.quantization.packers import awq_tensors, gptq_tensors, quantize
from tests.quantization.twins import patch_config, write_twins
from tests.tiny_models import COMMON, make_checkpoint

_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Projections reading the same input share GPTQ's act order (it comes from their inputs).
_SAME_INPUT = {"k_proj": "q_proj", "v_proj": "q_proj", "up_proj": "gate_proj"}
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
PROMPTS = [{"prompt_token_ids": [(7 * i + 3 * n) % COMMON["vocab_size"] for i in range(n)]}
           for n in (1, 6, 13)]

CASES = {
    # name: family, quantization_config, where it is declared
    "gptq4-v1-actorder-qwen2": ("qwen2", {
        "quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": True, "sym": False,
        "checkpoint_format": "gptq", "lm_head": False}, "config.json"),
    "gptq8-v2-llama": ("llama", {
        "bits": 8, "group_size": 64, "desc_act": False, "sym": True,
        "checkpoint_format": "gptq_v2"}, "quantize_config.json"),
    # GPTQModel's lm_head=True on a model with tied embeddings (tiny Qwen3): the checkpoint
    # keeps the float embedding and a quantized head of its own; the twin is untied.
    "gptq4-v2-lmhead-qwen3-tied": ("qwen3", {
        "quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False, "sym": True,
        "checkpoint_format": "gptq_v2", "lm_head": True}, "config.json"),
    "awq-g32-qwen2": ("qwen2", {
        "quant_method": "awq", "version": "gemm", "bits": 4, "group_size": 32,
        "zero_point": True, "modules_to_not_convert": None}, "config.json"),
}


def _quantize_state(state: dict, qcfg: dict) -> tuple[dict, dict]:
    """(dense state with the dequantized weights, quantized state)."""
    dense, quant = {}, {}
    awq = qcfg.get("quant_method") == "awq"
    linears = _LINEARS
    if qcfg.get("lm_head"):
        linears += ("lm_head",)
        # A tied model's head is its embedding: quantized as the head, kept as the embedding.
        state.setdefault("lm_head.weight", state["model.embed_tokens.weight"].clone())
    for name, t in state.items():
        module = name.rsplit(".", 2)[-2] if name.endswith(".weight") else ""
        if name == "lm_head.weight":
            module = "lm_head"
        if module not in linears:
            dense[name] = quant[name] = t
            continue
        stem = name[: -len("weight")]
        seed_name = stem.replace(module, _SAME_INPUT.get(module, module))
        qz = quantize(t, qcfg["bits"], qcfg["group_size"], qcfg["sym"] if not awq else False,
                      act_order=qcfg.get("desc_act", False), seed=zlib.crc32(seed_name.encode()))
        if qcfg.get("checkpoint_format", "gptq") == "gptq" and not awq:
            assert (qz.zeros > 0).all(), "GPTQ v1 cannot store a zero of 0"
        dense[name] = qz.dequantize()
        tensors = awq_tensors(qz) if awq else gptq_tensors(qz, qcfg["bits"],
                                                             qcfg["checkpoint_format"])
        for suffix, value in tensors.items():
            quant[stem + suffix] = value
    return dense, quant


def _write_pair(src: str, root: str, qcfg: dict, declared_in: str) -> tuple[str, str]:
    from safetensors.torch import load_file

    state = {}
    for name in os.listdir(src):
        if name.endswith(".safetensors"):
            state.update(load_file(os.path.join(src, name)))
    torch.manual_seed(0)
    dense, quant = _quantize_state(state, qcfg)
    out = write_twins(src, root, {"dense": dense, "quant": quant})
    if qcfg.get("lm_head"):  # the twin multiplies by its own (dequantized) head
        patch_config(out[0], tie_word_embeddings=False)
    if declared_in == "config.json":
        patch_config(out[1], quantization_config=qcfg)
    else:
        with open(os.path.join(out[1], "quantize_config.json"), "w") as f:
            json.dump(qcfg, f)
    return out[0], out[1]


@pytest.fixture(scope="module", params=list(CASES))
def pair(request, tmp_path_factory):
    family, qcfg, declared_in = CASES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    src = make_checkpoint(family, str(root / "src"))
    return request.param, *_write_pair(src, str(root), qcfg, declared_in)


def _llm(model: str, **kwargs) -> LLM:
    return LLM(model=model, dtype="float32", skip_tokenizer_init=True, max_model_len=64,
               **kwargs)


# In Triton's interpreter (CI's slowest tests): the longest and the shortest prompt, 4 tokens
# each (one prefill of both, then decode steps of two rows).
INTERPRETER_GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
INTERPRETER_PROMPTS = [PROMPTS[0], PROMPTS[-1]]


def _greedy(llm: LLM, prompts=PROMPTS, params=GREEDY) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]


def _methods(llm: LLM) -> set[str]:
    model = llm.llm_engine.executor.worker.runner.model
    return {type(m.quant_method).__name__ for m in model.modules() if hasattr(m, "quant_method")}


def test_checkpoint_loads_detected_and_matches_dequantized_twin(pair):
    name, dense, quant = pair
    expect = _greedy(_llm(dense))
    llm = _llm(quant)
    assert _methods(llm) == {"AWQLinearMethod" if name.startswith("awq")
                             else "GPTQLinearMethod"}
    model = llm.llm_engine.executor.worker.runner.model
    if "lmhead" in name:  # its own quantized head; the (tied) embedding stays float
        assert model.lm_head.quantized and not model.lm_head.is_tied
        assert model.model.embed_tokens.weight.dtype == torch.float32
    else:
        assert not model.lm_head.quantized
    assert _greedy(llm) == expect


def test_wrong_quantization_for_the_checkpoint_is_an_error(pair):
    name, dense, quant = pair
    declared, wrong = ("awq", "gptq") if name.startswith("awq") else ("gptq", "awq")
    with pytest.raises(ValueError, match=rf"quantization='{wrong}' does not match the "
                                         rf"checkpoint, which declares quant_method='{declared}'"):
        _llm(quant, quantization=wrong)
    with pytest.raises(ValueError, match=rf"quantization='{wrong}' needs an? "):
        _llm(dense, quantization=wrong)


# swapab: 24 s in CI's interpreter (its kernels have their own tests): slow.
@pytest.mark.parametrize("layout", ["along_k", pytest.param("swapab", marks=pytest.mark.slow)])
def test_gpu_layout_through_the_interpreter_matches(pair, layout, monkeypatch):
    """The CUDA path (repack into a kernel layout, act order sorted at load, Triton kernel)
    forced on the CPU, where the kernel runs in Triton's interpreter: same greedy tokens.
    ``swapab``: every layer the swap-AB kernel can hold takes its layout (here gate_up)."""
    pytest.importorskip("triton")
    from octavo.kernels import int_weight_layout, w4a16_swapab
    from octavo.quantization import int_weight

    name, dense, quant = pair
    if not name.startswith("gptq4-v1"):
        pytest.skip("one case is enough in the interpreter (slow)")
    expect = _greedy(_llm(dense), INTERPRETER_PROMPTS, INTERPRETER_GREEDY)
    monkeypatch.setattr(int_weight, "use_kernel", lambda device, k, g, bits: True)
    if layout == "swapab":
        monkeypatch.setattr(int_weight_layout, "choose", lambda k, n, g, bits, device: (
            "swapab" if w4a16_swapab.supports(k, n, g, bits) else "along_k"))
    llm = _llm(quant)
    model = llm.llm_engine.executor.worker.runner.model
    assert any(getattr(m, "act_perm", None) is not None for m in model.modules())
    layouts = {getattr(m, "kernel_layout", None) for m in model.modules()} - {None}
    assert layouts == ({"along_k", "swapab"} if layout == "swapab" else {"along_k"})
    assert _greedy(llm, INTERPRETER_PROMPTS, INTERPRETER_GREEDY) == expect
