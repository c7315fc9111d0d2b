"""Format truth for quantized experts against the tools that make such checkpoints: tiny random
Qwen3-MoE / Qwen2-MoE / Mixtral models whose experts (and attention, and Qwen2-MoE's shared
expert) GPTQModel quantized to GPTQ or AWQ, or llm-compressor to compressed-tensors, load in
Octavo with the method detected from the checkpoint and give the greedy tokens, and logprobs,
that transformers gives loading the same checkpoint (float32, CPU). The fixtures and their
references come from scripts/quant_fixtures/make_moe.py; this test needs only Octavo."""

from __future__ import annotations

import os

import pytest

from octavo import LLM, SamplingParams
from octavo.layers.fused_moe import FusedMoE
from octavo.layers.quantized_experts import QuantizedExperts
from tests.quantization.tool_fixtures import (
    FIXTURES_ROOT,
    LOGPROB_ATOL,
    TIE,
    assert_matches_reference,
    fixture_names,
    load_reference,
    untied_steps,
)

FIXTURES = os.path.join(FIXTURES_ROOT, "moe")
NAMES = fixture_names(FIXTURES)
# transformers 5.17 decompresses FP8 experts to bfloat16 whatever the dtype (recorded in the
# reference as "reference_bfloat16"): its logprobs carry that rounding (observed 9e-3).
BF16_REFERENCE_ATOL = 3e-2
METHODS = {"gptq": "GPTQLinearMethod", "awq": "AWQLinearMethod",
           "compressed-tensors": "CompressedTensorsIntMethod",
           "bitsandbytes": "BitsAndBytesLinearMethod"}


def _reference(name: str) -> dict:
    return load_reference(FIXTURES, name)


@pytest.fixture(scope="module", params=NAMES)
def loaded(request):
    llm = LLM(model=os.path.join(FIXTURES, request.param), dtype="float32",
              skip_tokenizer_init=True, max_model_len=64)
    return request.param, _reference(request.param), llm


def test_fixtures_present():
    families = {_reference(n)["family"] for n in NAMES}
    tools = {_reference(n)["tool"] for n in NAMES}
    assert families == {"qwen3_moe", "qwen2_moe", "mixtral"}, NAMES
    assert tools == {"gptqmodel", "llmcompressor", "bitsandbytes"}, NAMES


def test_experts_held_quantized(loaded):
    """Every sparse layer's experts are quantized linears of the checkpoint's method (or,
    where the tool left them float, stacked float experts), as many quantized modules as the
    reference found in the checkpoint; the routers stay float."""
    name, ref, llm = loaded
    model = llm.llm_engine.executor.worker.runner.model
    moes = [m for m in model.modules() if isinstance(m, FusedMoE)]
    assert moes
    want = METHODS[ref["method"]]
    if ref["settings"].get("weights", {}).get("type") == "float":
        want = "Fp8LinearMethod"
    for m in moes:
        if ref.get("experts_float"):  # transformers 5's bitsandbytes: float experts
            assert m.stacked_experts
        else:
            assert isinstance(m.experts, QuantizedExperts)
            assert {type(x.quant_method).__name__ for x in m.experts.modules()
                    if hasattr(x, "quant_method")} == {want}
        assert type(m.gate.quant_method).__name__ == "UnquantizedLinearMethod"
    quantized = [x for x in model.modules() if type(getattr(x, "quant_method", None)).__name__
                 == want]
    # A merged layer holds two checkpoint modules (gate/up) or three (q/k/v).
    parts = sum(len(x.output_partition_sizes) for x in quantized)
    assert parts == ref["quantized_modules"], name


def test_greedy_tokens_and_logprobs_match_transformers(loaded):
    name, ref, llm = loaded
    params = SamplingParams(temperature=0.0, max_tokens=len(ref["tokens"][0]), ignore_eos=True,
                            logprobs=0)
    outs = llm.generate([{"prompt_token_ids": p} for p in ref["prompts"]], params,
                        use_tqdm=False)
    atol = BF16_REFERENCE_ATOL if ref.get("reference_bfloat16") else LOGPROB_ATOL
    assert_matches_reference(name, ref, outs, atol, max(TIE, atol))


_INT_NAMES = [n for n in NAMES if "bnb" not in n and "fp8" not in n]


# The loop over the stacked views: 22 s in CI's interpreter, slow.
@pytest.mark.parametrize("grouped", [pytest.param(False, marks=pytest.mark.slow), True],
                         ids=["loop", "grouped"])
@pytest.mark.parametrize("name", [n for n in _INT_NAMES if n.startswith("qwen2_moe-gptq4")])
def test_gpu_layout_through_the_interpreter(name, grouped, monkeypatch):
    """The CUDA path forced on the CPU (each expert's linears repacked into the kernel's
    along-K layout, act order sorted at load, the experts stacked; the kernels in Triton's
    interpreter), run by the loop over the stacked views or by the grouped launches of
    ``fused_moe_int``: the reference's first tokens."""
    pytest.importorskip("triton")
    ref = _reference(name)
    experts = _forced_kernel_path(name, grouped, monkeypatch)
    assert experts[0].down_proj.kernel_group is not None
    assert getattr(experts[0].gate_up_proj, "act_perm", None) is not None
    assert experts.stacked.perm13 is not None
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    out = experts.llm.generate([{"prompt_token_ids": ref["prompts"][1]}], params,
                               use_tqdm=False)
    assert list(out[0].outputs[0].token_ids) == ref["tokens"][1][:3]
    assert bool(experts.grouped_calls) == grouped


def _forced_kernel_path(name, grouped, monkeypatch):
    """The fixture loaded with the CUDA kernels' layouts forced on the CPU and, where
    ``grouped``, the grouped kernels run in the interpreter: its first QuantizedExperts (with
    ``.llm`` and ``.grouped_calls``, one entry per launch of ``fused_moe_int``)."""
    from octavo.layers import fused_moe
    from octavo.quantization import bitsandbytes, int_weight

    monkeypatch.setattr(int_weight, "use_kernel", lambda device, k, g, bits: True)
    monkeypatch.setattr(bitsandbytes, "use_int8_kernel", lambda device, k: True)
    calls = []
    if grouped:
        from octavo.kernels import fused_moe_int

        real = fused_moe_int.fused_moe_int
        monkeypatch.setattr(fused_moe, "on_kernel_device", lambda x: True)
        monkeypatch.setattr(fused_moe_int, "fused_moe_int",
                            lambda *a, **kw: calls.append(1) or real(*a, **kw))
    llm = LLM(model=os.path.join(FIXTURES, name), dtype="float32", skip_tokenizer_init=True,
              max_model_len=64)
    model = llm.llm_engine.executor.worker.runner.model
    experts = next(m for m in model.modules() if isinstance(m, QuantizedExperts))
    assert experts.stacked is not None
    assert model.cuda_graph_safe
    # Held once: each expert's layers point into the stacked tensors.
    last = experts[len(experts) - 1].down_proj
    assert last.qweight_kernel.untyped_storage().data_ptr() == \
        experts.stacked.w2.untyped_storage().data_ptr()
    experts.llm, experts.grouped_calls = llm, calls
    return experts


def _assert_first_tokens(llm, ref, n=2):
    """The reference's first ``n`` greedy tokens of its first prompt."""
    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    out = llm.generate([{"prompt_token_ids": ref["prompts"][0]}], params, use_tqdm=False)
    assert list(out[0].outputs[0].token_ids) == ref["tokens"][0][:n]


def _slow_if(name: str, slow: set[str]):
    """``name`` as a parameter, marked slow where it is in ``slow`` (the 12-16 s Qwen2-MoE
    8-bit cases in CI's interpreter; other fixtures cover the same paths)."""
    return pytest.param(name, marks=pytest.mark.slow) if name in slow else name


@pytest.mark.parametrize("name", [_slow_if(n, {"qwen2_moe-w8a16-channel"}) for n in _INT_NAMES
                                  if not n.startswith("qwen2_moe-gptq4")])
def test_grouped_integer_experts_through_the_interpreter(name, monkeypatch):
    """Every other integer fixture (GPTQ v1 / v2 zeros, AWQ, compressed-tensors 4-bit
    symmetric and 8-bit per channel; Mixtral, Qwen2-MoE, Qwen3-MoE) on the grouped kernels:
    the reference's first two tokens."""
    pytest.importorskip("triton")
    monkeypatch.setenv("OCTAVO_MOE_INT_GEMV", "0")  # the tensor-core launches (GEMV: below)
    ref = _reference(name)
    experts = _forced_kernel_path(name, True, monkeypatch)
    _assert_first_tokens(experts.llm, ref)
    assert experts.grouped_calls


@pytest.mark.parametrize("name", [n for n in NAMES if n.startswith("qwen3_moe-awq")])
def test_two_ranks_give_the_reference_tokens(name):
    """The AWQ experts split over two ranks (gate/up's packed output words and down's groups
    narrowed per rank, one all-reduce of the experts' partial sums): the reference's
    tokens."""
    ref = _reference(name)
    llm = LLM(model=os.path.join(FIXTURES, name), dtype="float32", skip_tokenizer_init=True,
              max_model_len=64, tensor_parallel_size=2)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=len(ref["tokens"][0]),
                                ignore_eos=True)
        outs = llm.generate([{"prompt_token_ids": p} for p in ref["prompts"]], params,
                            use_tqdm=False)
    finally:
        llm.llm_engine.shutdown()
    for out, tokens, margins in zip(outs, ref["tokens"], ref["margins"], strict=True):
        n = untied_steps(margins, TIE)
        assert list(out.outputs[0].token_ids)[:n] == tokens[:n], name


@pytest.mark.parametrize("name", ["qwen3_moe-gptq4-g32",
                                  _slow_if("qwen2_moe-w8a16-channel", {"qwen2_moe-w8a16-channel"})])
def test_grouped_gemv_through_the_interpreter(name, monkeypatch):
    """OCTAVO_MOE_INT_GEMV (on by default): decode steps' experts on the grouped GEMV (4-bit GPTQ, 8-bit
    per channel): the reference's first two tokens."""
    pytest.importorskip("triton")
    if name not in _INT_NAMES:
        pytest.skip(f"fixture {name} missing")
    from octavo.kernels import fused_moe_int

    monkeypatch.setenv("OCTAVO_MOE_INT_GEMV", "64")
    used = []
    real = fused_moe_int._gemv_path
    monkeypatch.setattr(fused_moe_int, "_gemv_path", lambda *a: used.append(1) or real(*a))
    ref = _reference(name)
    experts = _forced_kernel_path(name, True, monkeypatch)
    _assert_first_tokens(experts.llm, ref)
    assert used


@pytest.mark.parametrize("name", [n for n in NAMES if "fp8" in n])
def test_fp8_experts_stack_for_the_grouped_kernel(name, monkeypatch):
    """llm-compressor's FP8 W8A16 experts stay FP8 (one byte a weight, row scales) and
    stack where the grouped kernel runs (forced onto the CPU interpreter here): the fused
    launches give the loop's layer output, and the experts' layers hold views into the
    stack."""
    pytest.importorskip("triton")
    import torch

    from octavo.kernels.fused_moe import FP8, Fp8Experts
    from octavo.layers import fused_moe

    monkeypatch.setattr(fused_moe, "on_kernel_device", lambda x: True)
    llm = LLM(model=os.path.join(FIXTURES, name), dtype="float32", skip_tokenizer_init=True,
              max_model_len=64)
    model = llm.llm_engine.executor.worker.runner.model
    layer = next(m for m in model.modules() if isinstance(m, FusedMoE))
    stacked = layer.experts.stacked
    assert isinstance(stacked, Fp8Experts) and stacked.block is None and model.cuda_graph_safe
    assert stacked.w13.dtype == FP8 and stacked.w2.dtype == FP8
    assert layer.experts[1].gate_up_proj.weight_fp8.untyped_storage().data_ptr() == \
        stacked.w13.untyped_storage().data_ptr()
    x = torch.randn(5, layer.gate.input_size)
    grouped = layer(x)
    monkeypatch.setattr(fused_moe, "on_kernel_device", lambda x: False)
    torch.testing.assert_close(grouped, layer(x), atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("name", [n for n in NAMES if "fp8" in n or "gptq4-g32" in n])
def test_stacked_quantized_experts_on_the_gpu_match_the_loop(name, monkeypatch):
    """On CUDA: the FP8 W8A16 fixture's experts stack in FP8 and the GPTQ ones as
    integers; under OCTAVO_FUSED_MOE=1 the grouped launches (decode steps in CUDA graphs)
    give the loop's greedy tokens, float32."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    ref = _reference(name)
    params = SamplingParams(temperature=0.0, max_tokens=len(ref["tokens"][0]), ignore_eos=True)
    runs = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("OCTAVO_FUSED_MOE", flag)
        llm = LLM(model=os.path.join(FIXTURES, name), dtype="float32", skip_tokenizer_init=True,
                  max_model_len=64)
        runner = llm.llm_engine.executor.worker.runner
        experts = next(m for m in runner.model.modules() if isinstance(m, QuantizedExperts))
        assert experts.stacked is not None
        assert (runner.graph_runner is not None) == (flag == "1")
        outs = llm.generate([{"prompt_token_ids": p} for p in ref["prompts"]], params,
                            use_tqdm=False)
        runs[flag] = [list(o.outputs[0].token_ids) for o in outs]
        llm.llm_engine.shutdown()
    assert runs["1"] == runs["0"]
