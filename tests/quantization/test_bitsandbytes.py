"""bitsandbytes against the tools that made the fixtures (tests/fixtures/bitsandbytes, written
by scripts/quant_fixtures/make_bitsandbytes.py with bitsandbytes 0.50.2 and transformers 5.24
on the CPU): tiny random Llama / Qwen2 / Qwen3 checkpoints, pre-quantized (8-bit, NF4 with and
without double quantization, FP4) and bfloat16 ones quantized at load.

The token references are transformers' weight-only runs: its model with each bitsandbytes
layer replaced by a float32 Linear holding the weight bitsandbytes dequantizes it to, from the
saved tensors ("saved_weight_only", for pre-quantized checkpoints) or from the model quantized
at load ("weight_only"; transformers 5 saves 4-bit weights requantized from the source dtype,
so the two differ slightly). That is Octavo's numerics; transformers' own forward differs
in ways Octavo does not copy: 8-bit multiplies int8 activations (outlier columns above 6.0 in
fp16), and 4-bit runs a single-token GEMV kernel whose sums differ from a float32 matmul (one
prompt here, a near tie of 0.0014 in logprob, picks another first token). The logprobs of
transformers' own forward are still checked, loosely.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from octavo import LLM, SamplingParams
from octavo.quantization import bitsandbytes as bnb_method
from octavo.quantization import bnb_format as fmt

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "bitsandbytes")
with open(os.path.join(FIXTURES, "reference.json")) as _f:
    REF = json.load(_f)
PROMPTS = [{"prompt_token_ids": p} for p in REF["prompts"]]
QUANTIZED = sorted(c for c in REF["cases"] if not c.endswith("-bf16"))
# Quantize-at-load names for the fixture variants they reproduce.
ONLINE_NAMES = {"int8": "bitsandbytes", "nf4-dq": "bitsandbytes-nf4", "fp4": "bitsandbytes-fp4"}


def _llm(case: str, **kwargs) -> LLM:
    """On the CPU unless ``device`` says otherwise (the GPU cases ask for CUDA)."""
    kwargs.setdefault("device", "cpu")
    return LLM(model=os.path.join(FIXTURES, case), dtype="float32", skip_tokenizer_init=True,
               max_model_len=64, **kwargs)


def _run(llm: LLM) -> tuple[list[list[int]], list[list[float]]]:
    params = SamplingParams(temperature=0.0, max_tokens=REF["max_new_tokens"], logprobs=0)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    logprobs = [[lp[t].logprob for lp, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)]
                for o in outs]
    return tokens, logprobs


def _kinds(llm: LLM) -> set[str]:
    model = llm.llm_engine.executor.worker.runner.model
    return {m.bnb_kind for m in model.modules() if hasattr(m, "bnb_kind")}


def _check_against_reference(case: str, tokens, logprobs, key: str,
                             atol: float = 2e-4) -> None:
    ref = REF["cases"][case]
    assert tokens == ref[key]["tokens"]
    for ours, theirs in zip(logprobs, ref[key]["logprobs"]):
        torch.testing.assert_close(torch.tensor(ours), torch.tensor(theirs), atol=atol, rtol=0)
    # transformers' own bitsandbytes forward: the first step of each prompt, where both ran
    # from the same context.
    native = ref["online"]
    first = [(lp[0], nat_lp[0]) for lp, nat_lp, tok, nat_tok in
             zip(logprobs, native["logprobs"], tokens, native["tokens"]) if tok[0] == nat_tok[0]]
    assert len(first) >= len(tokens) - 1
    for ours, theirs in first:
        assert abs(ours - theirs) < 0.02


@pytest.mark.parametrize("case", QUANTIZED)
def test_prequantized_checkpoint_detected_and_matches_transformers(case):
    """The method is read from config.json's quantization_config (no quantization=)."""
    llm = _llm(case)
    model = llm.llm_engine.executor.worker.runner.model
    assert {type(m.quant_method).__name__ for m in model.modules()
            if hasattr(m, "quant_method") and "lm_head" not in m.prefix} == \
        {"BitsAndBytesLinearMethod"}
    assert not isinstance(getattr(model.lm_head, "quant_method", None),
                          bnb_method.BitsAndBytesLinearMethod)
    assert _kinds(llm) == {"dense"}  # CPU: dequantized once at load
    _check_against_reference(case, *_run(llm), "saved_weight_only")


@pytest.mark.parametrize("case", [c for c in QUANTIZED if c.split("-", 1)[1] in ONLINE_NAMES])
def test_quantize_at_load_matches_transformers(case):
    """The bfloat16 checkpoint with quantization='bitsandbytes[-nf4|-fp4]' gives the tokens of
    transformers' BitsAndBytesConfig on the same checkpoint. Double quantization: a few nested
    absmax codes differ by one step (see test_online_tensors_equal_bitsandbytes), so the
    logprobs agree a little less closely."""
    family, variant = case.split("-", 1)
    llm = _llm(f"{family}-bf16", quantization=ONLINE_NAMES[variant])
    _check_against_reference(case, *_run(llm), "weight_only",
                             atol=1e-3 if variant.endswith("-dq") else 2e-4)


@pytest.mark.parametrize("variant", ["int8", "nf4", "nf4-dq", "fp4"])
def test_online_tensors_equal_bitsandbytes(variant):
    """Octavo's quantizers on two Llama weights give what bitsandbytes' own quantizers gave
    (bnb_direct.safetensors): int8 and SCB, 4-bit indices and float absmax exactly; nested
    (double-quantized) absmax codes up to bitsandbytes' CPU search, which rounds a few values
    lying within 1e-4 of the midpoint between two codes to the farther one."""
    from safetensors.torch import load_file

    src = load_file(os.path.join(FIXTURES, "llama-bf16", "model.safetensors"))
    direct = load_file(os.path.join(FIXTURES, "bnb_direct.safetensors"))
    names = sorted({k.split("/", 1)[1] for k in direct if k.startswith(variant + "/")
                    and k.endswith(".weight")})
    assert len(names) == 2
    for name in names:
        w = src[name].float()
        theirs = {k.split("/", 1)[1][len(name):]: v for k, v in direct.items()
                  if k.startswith(f"{variant}/{name}")}
        if variant == "int8":
            q, scb = fmt.quantize_int8_rows(w)
            assert torch.equal(q, theirs[""]) and torch.equal(scb, theirs[".SCB"]), name
            continue
        packed, absmax = fmt.quantize_4bit(w, "fp4" if variant == "fp4" else "nf4", 64)
        assert torch.equal(packed, theirs[""]), name
        if variant != "nf4-dq":
            assert torch.equal(absmax, theirs[".absmax"]), name
            continue
        q, nested, offset = fmt.double_quantize(absmax)
        assert offset == theirs[".nested_offset"].item()
        assert torch.equal(nested, theirs[".nested_absmax"]), name
        diff = (q.int() - theirs[".absmax"].int()).abs()
        assert diff.max() <= 1 and (diff > 0).float().mean() < 0.05, name


def _module_float32():
    from safetensors.torch import load_file

    return load_file(os.path.join(FIXTURES, "bnb_module_float32.safetensors"))


def test_bitsandbytes_8bit_module_quantizes_float16():
    """What bitsandbytes' Linear8bitLt does to a float32 weight at load (bnb_module_float32:
    transformers' load_in_8bit on a float32 checkpoint): the weight cast to float16, then
    per-row absmax int8. The bfloat16 fixtures above pass that cast unchanged."""
    ref = _module_float32()
    w = ref["weight"]
    assert not torch.equal(w.half().float(), w)  # the fixture exercises the cast
    q, scb = fmt.quantize_int8_rows(w.half().float())
    assert torch.equal(q, ref["int8"]) and torch.equal(scb, ref["SCB"])


def test_online_int8_of_float32_weight_equals_bitsandbytes_module():
    """quantization='bitsandbytes' on a float32 checkpoint holds the int8 and SCB that
    transformers' BitsAndBytesConfig(load_in_8bit=True) holds for the same weight."""
    ref = _module_float32()
    method = bnb_method.BitsAndBytesLinearMethod(8, "nf4", False, 64, prequantized=False)
    ours = method._quantize(ref["weight"])
    assert torch.equal(ours.q, ref["int8"])
    assert torch.equal(ours.scb.float(), ref["SCB"].float())


def test_nf4_block_by_hand():
    """One 64-value block: absmax 2.0; 2.0 / 2 = 1 is code 15, -1 code 0, 0 code 7, 0.5 lies
    below the midpoint (0.50166) of codes 12 (0.44071) and 13 (0.56262): code 12; 0.6 / 2 =
    0.3 is nearest 0.33792 (code 11). Two codes a byte, the first in the high nibble."""
    block = torch.zeros(64)
    block[:6] = torch.tensor([2.0, -2.0, 0.0, 1.0, 0.6, -0.19])  # -0.095: code 6 (-0.09105)
    packed, absmax = fmt.quantize_4bit(block, "nf4", 64)
    assert absmax.tolist() == [2.0]
    assert packed[:3, 0].tolist() == [0xF0, 0x7C, 0xB6]
    assert packed[3:, 0].tolist() == [0x77] * 29  # zeros: code 7
    w = fmt.dequantize_4bit(packed, absmax, fmt.code_table("nf4"), 64, (1, 64))
    expect = [2.0, -2.0, 0.0, 2 * 0.44070982933044434, 2 * 0.33791524171829224,
              2 * -0.09105003625154495]
    torch.testing.assert_close(w[0, :6], torch.tensor(expect), atol=0, rtol=0)


def test_dynamic_map_from_its_definition():
    code = fmt.dynamic_map()
    assert code.shape == (256,) and torch.equal(code, code.sort().values)
    assert code[-1].item() == 1.0 and (code == 0).sum() == 1
    # The smallest magnitudes: 10**-6 times the midpoint of [0.1, 1] (one step).
    assert code[code > 0].min().item() == pytest.approx(0.55e-6, rel=1e-6)
    assert code.min().item() == pytest.approx(-(1 - 0.9 / 64 / 2), rel=1e-6)
    try:
        import bitsandbytes.functional as bf
    except ImportError:
        return
    assert torch.equal(code, bf.create_dynamic_map(signed=True))


def test_wrong_quantization_is_an_error():
    with pytest.raises(ValueError, match="asks for 4-bit nf4, but the checkpoint holds 8-bit"):
        _llm("llama-int8", quantization="bitsandbytes-nf4")
    with pytest.raises(ValueError, match="quantization='gptq' does not match the checkpoint, "
                                         "which declares quant_method='bitsandbytes'"):
        _llm("llama-nf4", quantization="gptq")


@pytest.mark.parametrize("case", ["llama-int8", "qwen2-nf4-dq", "llama-fp4"])
def test_cuda_layout_torch_path_on_cpu(case, monkeypatch):
    """The CUDA representation (int8 kept with a per-row scale after the matmul; 4-bit kept
    packed, dequantized per call by lookup) forced on the CPU: same tokens."""
    monkeypatch.setattr(bnb_method, "keeps_quantized", lambda device: True)
    monkeypatch.setattr(bnb_method, "use_int8_kernel", lambda device, k: False)
    monkeypatch.setattr(bnb_method, "kernels_run", lambda x: False)
    llm = _llm(case)
    assert _kinds(llm) == {"int8" if case.endswith("int8") else "4bit"}
    _check_against_reference(case, *_run(llm), "saved_weight_only")


def _count_calls(monkeypatch, targets: dict) -> dict[str, int]:
    """Each ``name -> (module, function)`` wrapped to count its calls; the counts."""
    calls = dict.fromkeys(targets, 0)
    for key, (module, name) in targets.items():
        real = getattr(module, name)

        def counted(*a, _real=real, _key=key, **kw):
            calls[_key] += 1
            return _real(*a, **kw)

        monkeypatch.setattr(module, name, counted)
    return calls


@pytest.mark.parametrize("case", ["qwen2-nf4-dq"])  # FP4: tests/kernels/test_bnb4_gemv.py
def test_4bit_kernels_through_the_interpreter(case, monkeypatch):
    """4-bit kept packed as on CUDA, run by ``octavo.kernels.bnb4_gemv`` in Triton's
    interpreter: decode rows through the fused GEMV, prefills dequantized in one launch;
    the tokens and logprobs of the weight-only reference."""
    pytest.importorskip("triton")
    if torch.cuda.is_available():
        pytest.skip("the interpreter case is for machines without CUDA")
    from octavo.kernels import bnb4_gemv

    monkeypatch.setattr(bnb_method, "keeps_quantized", lambda device: True)
    calls = _count_calls(monkeypatch, {"gemv": (bnb4_gemv, "bnb4_gemv"),
                                       "dequantize": (bnb4_gemv, "dequantize_4bit")})
    llm = _llm(case)
    assert _kinds(llm) == {"4bit"}
    _check_against_reference(case, *_run(llm), "saved_weight_only")
    assert calls["dequantize"]  # the prefills
    # one prompt alone: its decode steps are one row each, through the GEMV
    params = SamplingParams(temperature=0.0, max_tokens=REF["max_new_tokens"])
    out = llm.generate(PROMPTS[:1], params, use_tqdm=False)[0]
    assert list(out.outputs[0].token_ids) == REF["cases"][case]["saved_weight_only"]["tokens"][0]
    assert calls["gemv"]


@pytest.mark.parametrize("env, value, module, function", [
    # prefills dequantize by the select tree (the layer's codes compiled into the kernel)
    ("OCTAVO_BNB4_DEQUANT", "select", "bnb4_gemv", "dequantize_4bit_select"),
    # prefills run the fused GEMM (the packed bytes decoded by selects in its main loop)
    ("OCTAVO_BNB4_GEMM_MAX_M", "4096", "bnb4_gemm", "bnb4_gemm"),
])
def test_4bit_select_decoding_through_the_interpreter(monkeypatch, env, value, module,
                                                      function):
    """The select-decoded 4-bit kernels, each switched on by its variable, take the prefills
    instead of the table-gather dequantizer; the weight-only reference's tokens and
    logprobs."""
    pytest.importorskip("triton")
    if torch.cuda.is_available():
        pytest.skip("the interpreter case is for machines without CUDA")
    import importlib

    from octavo.kernels import bnb4_gemv

    case = "qwen2-nf4-dq"
    monkeypatch.setattr(bnb_method, "keeps_quantized", lambda device: True)
    monkeypatch.setenv(env, value)
    target = importlib.import_module(f"octavo.kernels.{module}")
    calls = _count_calls(monkeypatch, {"select": (target, function),
                                       "table": (bnb4_gemv, "dequantize_4bit")})
    llm = _llm(case)
    _check_against_reference(case, *_run(llm), "saved_weight_only")
    assert calls["select"] and not calls["table"]


def test_cuda_int8_kernel_through_the_interpreter(monkeypatch):
    """8-bit in the W8A16 Triton kernel's layout (q + 128, zero point 128, one group over K),
    run by Triton's interpreter on the CPU: same tokens."""
    pytest.importorskip("triton")
    if torch.cuda.is_available():
        pytest.skip("the interpreter case is for machines without CUDA")
    monkeypatch.setattr(bnb_method, "keeps_quantized", lambda device: True)
    monkeypatch.setattr(bnb_method, "use_int8_kernel", lambda device, k: True)
    llm = _llm("qwen2-int8")
    assert _kinds(llm) == {"int8_kernel"}
    _check_against_reference("qwen2-int8", *_run(llm), "saved_weight_only")


def test_weight_memory():
    """What each layer keeps on CUDA: int8 = 1 byte + a float32 scale per row; 4-bit = half a
    byte + a float32 absmax per 64 (4.5 bits a weight)."""
    w = torch.randn(256, 512)
    q, scb = fmt.quantize_int8_rows(w)
    packed, absmax = fmt.quantize_4bit(w, "nf4", 64)
    bits = {"int8": 8 * (q.numel() + 4 * scb.numel()) / w.numel(),
            "nf4": 8 * (packed.numel() + 4 * absmax.numel()) / w.numel()}
    assert bits == {"int8": 8 + 32 / 512, "nf4": 4.5}


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["llama-int8", "qwen2-nf4-dq", "qwen3-nf4"])
def test_prequantized_on_cuda(case):
    """On the GPU: 8-bit in the Triton W8A16 kernel, 4-bit kept packed; tokens of the
    weight-only reference (float32; a near tie may flip under TF32 / other sums, so the first
    step's logprobs are what must agree)."""
    llm = _llm(case, device="cuda")
    assert _kinds(llm) == {"int8_kernel" if case.endswith("int8") else "4bit"}
    tokens, logprobs = _run(llm)
    ref = REF["cases"][case]["saved_weight_only"]
    agree = sum(t == r for t, r in zip(tokens, ref["tokens"]))
    assert agree >= len(tokens) - 1, (tokens, ref["tokens"])
    for ours, theirs, t, r in zip(logprobs, ref["logprobs"], tokens, ref["tokens"]):
        if t[0] == r[0]:
            assert abs(ours[0] - theirs[0]) < 5e-3
