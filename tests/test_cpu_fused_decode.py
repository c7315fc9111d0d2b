"""The fused CPU decode path (models/cpu_fused_decode.py, kernels/cpu/decoder.cpp): the default
GGUF model's decoder stack in one C++ call on decode steps, the same tokens as the per-layer
Python path bit for bit (the same kernels in the same order)."""

from __future__ import annotations

import pytest

from octavo import LLM, SamplingParams
from octavo.default_model import default_model_path
from octavo.kernels import cpu as cpu_kernels
from octavo.models.cpu_fused_decode import FusedGGUFDecode

PROMPTS = ["The capital of France is", "def fib(n):", "1, 2, 3, 5, 8,"]


@pytest.fixture(scope="module")
def gguf_path() -> str:
    ops = cpu_kernels.load()
    if ops is None or not hasattr(ops, "gguf_decoder_layers"):
        pytest.skip("CPU kernels not built")
    try:
        return default_model_path()
    except ValueError as e:
        pytest.skip(f"default model not installed: {e}")


def _run(fused: bool, monkeypatch, **kw):
    monkeypatch.setenv("OCTAVO_CPU_FUSED_DECODE", "1" if fused else "0")
    llm = LLM(max_model_len=256, kv_cache_memory=32 << 20, **kw)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    model = llm.llm_engine.executor.worker.runner.model.model
    return [list(o.outputs[0].token_ids) for o in outs], model._fused


def test_fused_decode_tokens_identical(gguf_path, monkeypatch):
    fused_tokens, fused = _run(True, monkeypatch)
    assert isinstance(fused, FusedGGUFDecode)
    plain_tokens, plain = _run(False, monkeypatch)
    assert plain is None
    assert fused_tokens == plain_tokens


@pytest.mark.slow  # loads the default model dequantized to float32
def test_dequantized_model_is_not_fused(gguf_path, monkeypatch):
    _, fused = _run(True, monkeypatch, dtype="float32")
    assert fused is None


def _synthetic(tmp_path, arch: str, experts) -> str:
    from tests.test_gguf_moe import _write

    path = str(tmp_path / f"{arch}.gguf")
    _write(path, arch, experts=experts)
    return path


def _run_file(path: str, fused: bool, monkeypatch, prompts) -> tuple[list, object]:
    monkeypatch.setenv("OCTAVO_CPU_FUSED_DECODE", "1" if fused else "0")
    llm = LLM(model=path, device="cpu", skip_tokenizer_init=True, max_model_len=256)
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    model = llm.llm_engine.executor.worker.runner.model.model
    return [list(o.outputs[0].token_ids) for o in outs], model._fused


@pytest.mark.parametrize("arch, kinds", [("qwen3", 1), ("qwen3moe", 3), ("qwen2", 4)])
def test_layer_kinds_fused_bit_for_bit(tmp_path, monkeypatch, arch, kinds):
    """Qwen3's q/k norms (kind bit 0), Qwen3-MoE's GGUF experts (bit 1) and Qwen2's q/k/v
    biases (bit 2) in the one C++ call: one request at a time, the per-layer Python path's
    tokens exactly."""
    pytest.importorskip("gguf")
    if not hasattr(cpu_kernels.load(), "gguf_moe_token"):
        pytest.skip("CPU kernels not built")
    from gguf import GGMLQuantizationType as Q

    path = _synthetic(tmp_path, arch, Q.Q4_0)
    for prompt in ([5, 9, 77, 200, 12], [100, 3, 3, 18, 250, 61, 7]):
        fused_tokens, fused = _run_file(path, True, monkeypatch, [prompt])
        assert isinstance(fused, FusedGGUFDecode) and set(fused.layer_kinds) == {kinds}
        plain_tokens, plain = _run_file(path, False, monkeypatch, [prompt])
        assert plain is None
        assert fused_tokens == plain_tokens


def test_gguf_experts_fused_in_a_batch(tmp_path, monkeypatch):
    """Several requests in one decode step: each token's experts run on their own in the C++
    call (the Python path groups tokens by expert), the same tokens here."""
    pytest.importorskip("gguf")
    if not hasattr(cpu_kernels.load(), "gguf_moe_token"):
        pytest.skip("CPU kernels not built")
    from gguf import GGMLQuantizationType as Q

    path = _synthetic(tmp_path, "qwen3moe", Q.Q8_0)
    prompts = [[5, 9, 77, 200, 12], [100, 3, 3, 18, 250, 61, 7], [42] * 9]
    fused_tokens, fused = _run_file(path, True, monkeypatch, prompts)
    assert isinstance(fused, FusedGGUFDecode)
    plain_tokens, _ = _run_file(path, False, monkeypatch, prompts)
    assert fused_tokens == plain_tokens
