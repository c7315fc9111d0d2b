"""quantization="gguf" (the default for .gguf files on the CPU): the default model keeps its GGUF
block formats (Q4_1 linear layers, Q8_0 token embeddings and tied LM head), and generates like
the dequantized float32 path (int16 activations per 32-block: greedy runs are identical)."""

from __future__ import annotations

import pytest
import torch

from octavo import LLM, SamplingParams
from octavo.default_model import default_model_path
from octavo.engine.arg_utils import EngineArgs
from octavo.quantization import gguf_blocks

QUESTIONS = [
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Explain in one paragraph what a KV cache is.",
    "List three prime numbers and say why they are prime.",
    "How do I reverse a list in Python?",
    "Give me three tips for learning to cook.",
    "What causes the seasons on Earth?",
    "Describe a cat to someone who has never seen one.",
]
NEW_TOKENS = 32


@pytest.fixture(scope="module")
def gguf_path() -> str:
    try:
        return default_model_path()
    except ValueError as e:
        pytest.skip(f"default model not installed: {e}")


def _scheme(**kw) -> str | None:
    return EngineArgs(device="cpu", **kw).create_engine_config().quantization


def test_default_scheme_on_cpu(gguf_path, monkeypatch):
    from octavo.quantization import gguf

    assert _scheme() == ("gguf" if gguf.DEFAULT_ON_CPU else None)
    monkeypatch.setattr(gguf, "DEFAULT_ON_CPU", True)
    assert _scheme() == "gguf"
    assert _scheme(dtype="float32") is None  # an explicit dtype: dequantized, as before
    assert _scheme(gguf_dequantize=True) is None
    assert _scheme(load_format="dummy") is None
    assert _scheme(dtype="float32", quantization="gguf") == "gguf"
    with pytest.raises(ValueError, match="contradicts"):
        _scheme(quantization="gguf", gguf_dequantize=True)


def _weight_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _load(quantization):
    from octavo.attention.registry import select_backend
    from octavo.model_loader.loader import load_model

    cfg = EngineArgs(device="cpu", dtype="float32", quantization=quantization,
                     ).create_engine_config()
    return load_model(cfg.model_config, torch.device("cpu"),
                      select_backend(torch.device("cpu")), cfg.quantization)


@pytest.fixture(scope="module")
def models(gguf_path):
    return _load("gguf"), _load(None)


def test_weights_stay_quantized(models):
    quant, dense = models
    layer = quant.model.layers[0]
    qkv = layer.self_attn.qkv_proj
    assert qkv.weight is None and qkv.qweight.dtype == torch.uint8
    rows = gguf_blocks.deinterleave(qkv.qweight, qkv.gguf_scales, qkv.gguf_mins, 576)
    assert rows[0].shape == (576 + 2 * 192, 576 // 2)  # Q4_1: two weights per byte
    assert rows[1].dtype == torch.float16  # Q4_1's d and m are the file's fp16
    gate_up = layer.mlp.gate_up_proj
    assert gguf_blocks.out_features(gate_up.qweight) == 2 * 1536
    assert gate_up.qweight.numel() == 2 * 1536 * 576 // 2
    emb = quant.model.embed_tokens
    assert emb.gguf_format == "Q8_0" and gguf_blocks.out_features(emb.qweight) == 49152
    assert emb.qweight.numel() == 49152 * 576
    assert quant.lm_head.weight is None  # tied: the LM head multiplies by the Q8_0 rows
    # about 0.625 bytes a weight (Q4_1) and 1.125 (Q8_0) against 4
    assert _weight_bytes(quant) < 0.25 * _weight_bytes(dense)


def _assert_near(y: torch.Tensor, ref: torch.Tensor, tol: float = 1e-4) -> None:
    """Relative error of the whole output: int16 activations cost ~1e-5 per product."""
    assert ((y - ref).norm() / ref.norm()).item() < tol


def test_quantized_layers_match_dequantized(models):
    quant, dense = models
    x = torch.randn(3, 576, generator=torch.Generator().manual_seed(0))
    for name in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj"):
        q = quant.model.layers[1].get_submodule(name)
        d = dense.model.layers[1].get_submodule(name)
        if name == "self_attn.o_proj":
            x = torch.randn(3, 576, generator=torch.Generator().manual_seed(1))
        _assert_near(q(x), d(x))
    ids = torch.tensor([[1, 5, 49151]])
    torch.testing.assert_close(quant.model.embed_tokens(ids), dense.model.embed_tokens(ids))
    # On random inputs the LM head's relative error is 7e-5 on average and up to 1.6e-4 over
    # 30 draws (int16 activations; bit for bit the same before the kernels' 16-row layout):
    # with unseeded inputs and a 1e-4 bound this test failed now and then.
    h = torch.randn(2, 576, generator=torch.Generator().manual_seed(2))
    _assert_near(quant.lm_head(h), dense.lm_head(h), tol=3e-4)


def test_greedy_close_to_dequantized(gguf_path):
    greedy = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    runs = []
    for kw in ({"quantization": "gguf"}, {"dtype": "float32"}):
        llm = LLM(max_model_len=512, kv_cache_memory=64 << 20, **kw)
        tok = llm.get_tokenizer()
        prompts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                           add_generation_prompt=True) for q in QUESTIONS]
        outs = llm.generate(prompts, greedy, use_tqdm=False)
        runs.append([list(o.outputs[0].token_ids) for o in outs])
        del llm
    same = sum(a == b for a, b in zip(*runs))
    # int16 activations per 32-block: 30 of the 32 W6 prompts identical over 128 tokens
    # (2026-11-30); with int8 ones (llama.cpp's Q8_0 activations) 2 of these 8 were, since
    # SmolLM2's activations have outlier channels and near-tied logits flip.
    assert same >= len(QUESTIONS) - 1, f"{same}/{len(QUESTIONS)} identical"
    for a, b in zip(*runs):
        assert len(a) == len(b) == NEW_TOKENS
