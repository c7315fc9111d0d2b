"""Format truth against the real quantizer: checkpoints that GPTQModel wrote (GPTQ 4/8-bit,
act-order, asymmetric, group -1, both zero-point conventions, a quantized LM head
(``lm_head=True``); AWQ GEMM) on tiny random Llama /
Qwen2 / Qwen3 models load in Octavo with the method detected from the checkpoint and give the
greedy tokens, and logprobs, that transformers gives through GPTQModel's own dequantization
(float32, CPU). The fixtures and their references come from
scripts/quant_fixtures/make_gptq_awq.py; this test needs only Octavo."""

from __future__ import annotations

import os

import pytest

from octavo import LLM, SamplingParams
from tests.quantization.tool_fixtures import (
    FIXTURES_ROOT,
    LOGPROB_ATOL,
    TIE,
    assert_matches_reference,
    fixture_names,
    load_reference,
)

FIXTURES = os.path.join(FIXTURES_ROOT, "gptq_awq")
NAMES = fixture_names(FIXTURES)


def _reference(name: str) -> dict:
    return load_reference(FIXTURES, name)


def _llm(name: str, **kwargs) -> LLM:
    return LLM(model=os.path.join(FIXTURES, name), dtype="float32", skip_tokenizer_init=True,
               max_model_len=64, **kwargs)


@pytest.fixture(scope="module", params=NAMES)
def loaded(request):
    return request.param, _reference(request.param), _llm(request.param)


def test_fixtures_present():
    assert len(NAMES) >= 10, f"expected the GPTQModel fixtures under {FIXTURES}, found {NAMES}"


def test_method_detected_from_checkpoint(loaded):
    name, ref, llm = loaded
    model = llm.llm_engine.executor.worker.runner.model
    methods = {type(m.quant_method).__name__ for m in model.modules()
               if hasattr(m, "quant_method")}
    want = "AWQLinearMethod" if ref["method"] == "awq" else "GPTQLinearMethod"
    assert want in methods, methods
    head = model.lm_head
    if "lm_head" in ref:  # GPTQModel's lm_head=True: the checkpoint's head, at its bits
        assert type(head.quant_method).__name__ == want and head.weight is None
        assert (head.quant_method.bits, head.quant_method.group_size) == \
            (ref["lm_head"]["bits"], ref["lm_head"]["group_size"])
        assert not head.is_tied and not model.tie_word_embeddings
    else:
        assert not head.quantized and not hasattr(head, "quant_method")


def test_greedy_tokens_and_logprobs_match_transformers(loaded):
    name, ref, llm = loaded
    params = SamplingParams(temperature=0.0, max_tokens=len(ref["tokens"][0]), ignore_eos=True,
                            logprobs=0)
    outs = llm.generate([{"prompt_token_ids": p} for p in ref["prompts"]], params,
                        use_tqdm=False)
    assert_matches_reference(name, ref, outs, LOGPROB_ATOL, TIE)


@pytest.mark.parametrize("name", NAMES)
def test_wrong_quantization_is_a_clear_error(name):
    ref = _reference(name)
    declared, wrong = ("awq", "gptq") if ref["method"] == "awq" else ("gptq", "awq")
    with pytest.raises(ValueError, match=rf"quantization='{wrong}' does not match the "
                                         rf"checkpoint, which declares quant_method='{declared}'"):
        _llm(name, quantization=wrong)


# The quantized LM head's case: 15 s in CI's interpreter, slow.
@pytest.mark.parametrize("name", [n for n in NAMES if n.startswith("qwen2-gptq4")]
                         + [pytest.param(n, marks=pytest.mark.slow) for n in NAMES
                            if n.startswith("llama-gptq4-g32-lmhead")])
def test_gpu_layout_through_the_interpreter(name, monkeypatch):
    """The CUDA path (repack into the fused kernel's layout, act order sorted at load) forced on
    the CPU, the kernel in Triton's interpreter: same tokens on GPTQModel's act-order g_idx,
    and with the LM head on the integer kernel too."""
    pytest.importorskip("triton")
    from octavo.quantization import int_weight

    ref = _reference(name)
    monkeypatch.setattr(int_weight, "use_kernel", lambda device, k, g, bits: True)
    llm = _llm(name)
    model = llm.llm_engine.executor.worker.runner.model
    if ref["quantize_config"].get("desc_act"):
        assert any(getattr(m, "act_perm", None) is not None for m in model.modules())
    if "lm_head" in ref:
        assert model.lm_head.kernel_group is not None
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    out = llm.generate([{"prompt_token_ids": ref["prompts"][1]}], params, use_tqdm=False)
    assert list(out[0].outputs[0].token_ids) == ref["tokens"][1][:4]
