"""Greedy float32 outputs token-identical to transformers with RoPE scaling in config.json,
prompts running past the pretraining window (original_max_position_embeddings 64, factor 4)."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from octavo import LLM, SamplingParams  # noqa: E402
from octavo.layers.rope_params import rope_params_from_config  # noqa: E402
from octavo.layers.rope_scaling import dynamic_ntk_seq_len, rope_inv_freq  # noqa: E402
from tests.tiny_models import hf_greedy, make_checkpoint  # noqa: E402

NEW_TOKENS = 24
LENGTHS = (5, 70, 130, 200)  # + 24 new tokens: up to 224 of the 256 positions

SCALINGS = {
    # HF's yarn convention: max_position_embeddings is the extended length.
    "yarn": dict(max_position_embeddings=256, rope_scaling={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}),
    # linear (and dynamic): max_position_embeddings is the original window, x factor in vLLM.
    "linear": dict(max_position_embeddings=64, rope_scaling={"type": "linear", "factor": 4.0}),
}


def _prompts() -> list[list[int]]:
    rng = random.Random(1)
    return [[rng.randrange(3, 512) for _ in range(n)] for n in LENGTHS]


def _hf_greedy(folder: str, prompts, pin_dynamic: bool = False) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    if pin_dynamic:
        # Freeze transformers' dynamic NTK at the one table the engine uses (see _dynamic).
        cfg = model.config
        theta, scaling = rope_params_from_config(cfg)
        inv_freq, _ = rope_inv_freq(scaling, cfg.head_dim, theta, cfg.max_position_embeddings)
        rotary = model.model.rotary_emb
        rotary.inv_freq.copy_(inv_freq)
        rotary.original_inv_freq.copy_(inv_freq)
        rotary.max_seq_len_cached = 10 ** 9  # never "grow" (recompute for the current length)
        rotary.original_max_seq_len = 0  # never "reset" to plain RoPE either
    return hf_greedy(model, prompts, NEW_TOKENS)


def _octavo(folder: str, prompts, **kwargs) -> tuple[LLM, list[list[int]]]:
    llm = LLM(model=folder, dtype="float32", skip_tokenizer_init=True, **kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return llm, [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("scaling", sorted(SCALINGS))
def test_greedy_matches_transformers_with_rope_scaling(family, scaling, tmp_path):
    folder = make_checkpoint(family, str(tmp_path), **SCALINGS[scaling])
    prompts = _prompts()
    expected = _hf_greedy(folder, prompts)
    llm, got = _octavo(folder, prompts, max_num_batched_tokens=96)  # chunked prefill too
    assert llm.llm_engine.config.model_config.max_model_len == 256
    assert got == expected


def test_dynamic_matches_transformers_frozen_at_the_table(tmp_path):
    """transformers' dynamic NTK depends on the running length; frozen at the length the
    engine's static table assumes (max_position_embeddings * factor), outputs agree."""
    folder = make_checkpoint("llama", str(tmp_path), max_position_embeddings=64,
                             rope_scaling={"rope_type": "dynamic", "factor": 4.0})
    prompts = _prompts()
    llm, got = _octavo(folder, prompts)
    assert llm.llm_engine.config.model_config.max_model_len == dynamic_ntk_seq_len(64, 4.0)
    assert got == _hf_greedy(folder, prompts, pin_dynamic=True)
    assert got != _hf_greedy(folder, prompts)  # ... and the choice is visible in the tokens
