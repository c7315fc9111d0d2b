"""Greedy outputs token-identical to transformers in float32, per claimed family."""

from __future__ import annotations

import random

import pytest
import torch

from octavo import LLM, SamplingParams
from tests.tiny_models import FAMILIES, hf_greedy, make_checkpoint

NEW_TOKENS = 32


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def checkpoint(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    # Distinct norm weights: with transformers' all-ones default a misplaced norm would pass.
    return request.param, make_checkpoint(request.param, str(folder), distinct_norms=True)


def _prompts(n: int = 9, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    lengths = [1, 3, 7, 15, 16, 17, 33, 64, 100][:n]
    return [[rng.randrange(3, 512) for _ in range(L)] for L in lengths]


def _hf_greedy(folder: str, prompts: list[list[int]]) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # like ignore_eos=True: EOS is a plain token
    return hf_greedy(model, prompts, NEW_TOKENS)


@pytest.fixture(scope="module")
def reference(checkpoint):
    family, folder = checkpoint
    prompts = _prompts()
    return prompts, _hf_greedy(folder, prompts)


def _octavo(folder: str, prompts, **kwargs) -> list[list[int]]:
    llm = LLM(model=folder, dtype="float32", skip_tokenizer_init=True, **kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return llm, [o.outputs[0].token_ids for o in outs]


def test_greedy_matches_transformers(checkpoint, reference):
    _, folder = checkpoint
    prompts, expected = reference
    _, got = _octavo(folder, prompts)
    assert got == expected


def test_greedy_matches_under_preemption(checkpoint, reference):
    """A pool far smaller than the batch needs forces preemption by recompute."""
    _, folder = checkpoint
    prompts, expected = reference
    llm, got = _octavo(folder, prompts, num_gpu_blocks_override=40, block_size=4,
                       max_model_len=160)
    assert llm.llm_engine.scheduler.num_preemptions > 0
    assert got == expected


def test_greedy_matches_with_small_chunks(checkpoint, reference):
    """Prompts prefilled in chunks of at most 8 tokens, mixed with decodes."""
    _, folder = checkpoint
    prompts, expected = reference
    _, got = _octavo(folder, prompts, max_num_batched_tokens=8, max_num_seqs=4)
    assert got == expected


def test_greedy_matches_with_prefix_cache_hits_and_off(checkpoint, reference):
    """Second pass over the same prompts reads their full blocks from the prefix cache; the
    tokens stay those of transformers, and so they do with caching off."""
    _, folder = checkpoint
    prompts, expected = reference
    llm = LLM(model=folder, dtype="float32", skip_tokenizer_init=True, block_size=4)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    batch = [{"prompt_token_ids": p} for p in prompts]
    first = llm.generate(batch, params, use_tqdm=False)
    second = llm.generate(batch, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in first] == expected
    assert [o.outputs[0].token_ids for o in second] == expected
    assert [o.num_cached_tokens for o in second] == [(len(p) - 1) // 4 * 4 for p in prompts]
    assert llm.llm_engine.scheduler.kv.prefix_hits > 0
    # LLM.reset_prefix_cache (vLLM's name): a third pass computes every prompt again.
    assert llm.reset_prefix_cache() is True
    third = llm.generate(batch, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in third] == expected
    assert [o.num_cached_tokens for o in third] == [0] * len(prompts)
    _, off = _octavo(folder, prompts, enable_prefix_caching=False)
    assert off == expected


def test_priority_policy_outputs_unchanged(checkpoint, reference):
    """scheduling_policy="priority" with a tiny pool and max_num_seqs=3: high-priority
    prompts preempt low ones, and every output is still transformers' greedy output."""
    _, folder = checkpoint
    prompts, expected = reference
    llm = LLM(model=folder, dtype="float32", skip_tokenizer_init=True, block_size=4,
              num_gpu_blocks_override=40, max_model_len=160, max_num_seqs=3,
              scheduling_policy="priority", enable_prefix_caching=False)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False,
                        priority=[len(prompts) - i for i in range(len(prompts))])
    assert [o.outputs[0].token_ids for o in outs] == expected
