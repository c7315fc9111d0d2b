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
