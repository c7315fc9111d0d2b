"""End to end on the GPU: the triton attention backend generates what the torch one does."""

from __future__ import annotations

import gc
import random

import pytest
import torch

from octavo import LLM, SamplingParams
from tests.tiny_models import make_checkpoint

pytestmark = pytest.mark.gpu

NEW_TOKENS = 32
LENGTHS = [1, 5, 16, 17, 31, 64, 100, 200]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return make_checkpoint("llama", str(tmp_path_factory.mktemp("llama")))


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    # Qwen3: q/k norm + rotary in one launch that also writes K/V into the paged cache.
    return make_checkpoint("qwen3", str(tmp_path_factory.mktemp("qwen3")))


def _prompts() -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(3, 512) for _ in range(n)] for n in LENGTHS]


def _generate(folder: str, backend: str, dtype: str, logprobs: int | None = None, **kwargs):
    llm = LLM(model=folder, dtype=dtype, skip_tokenizer_init=True, attention_backend=backend,
              **kwargs)
    assert llm.llm_engine.executor.worker.runner.backend.name == backend
    assert llm.llm_engine.executor.worker.runner.device.type == "cuda"
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True,
                            logprobs=logprobs)
    outs = llm.generate([{"prompt_token_ids": p} for p in _prompts()], params, use_tqdm=False)
    result = [(list(o.outputs[0].token_ids), o.outputs[0].logprobs) for o in outs]
    del llm, outs
    gc.collect()
    torch.cuda.empty_cache()
    return result


@pytest.mark.parametrize("triton_kwargs", [
    {},
    # Prompts prefilled in chunks of at most 16 tokens, mixed with decodes, small blocks.
    dict(max_num_batched_tokens=16, max_num_seqs=4, block_size=8),
], ids=["default", "chunked"])
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_greedy_fp32_identical(family, triton_kwargs, request):
    folder = request.getfixturevalue(family)
    ref = _generate(folder, "torch", "float32")
    got = _generate(folder, "triton", "float32", **triton_kwargs)
    assert [t for t, _ in got] == [t for t, _ in ref]
    assert all(len(t) == NEW_TOKENS for t, _ in got)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_greedy_fp32_identical_with_l2_prefetch(family, request, monkeypatch):
    """The weights after attention prefetched into L2 (octavo/layers/weight_prefetch.py): a
    prefetch writes nothing, so the tokens are the torch backend's."""
    folder = request.getfixturevalue(family)
    ref = _generate(folder, "torch", "float32")
    monkeypatch.setenv("OCTAVO_L2_PREFETCH", "o,mlp,qkv")
    monkeypatch.setenv("OCTAVO_L2_PREFETCH_EVICT_LAST", "1")
    got = _generate(folder, "triton", "float32")
    assert [t for t, _ in got] == [t for t, _ in ref]


def test_bf16_logprobs_close(llama):
    ref = _generate(llama, "torch", "bfloat16", logprobs=1)
    got = _generate(llama, "triton", "bfloat16", logprobs=1)
    compared = 0
    for (ref_toks, ref_lps), (got_toks, got_lps) in zip(ref, got):
        assert len(ref_lps) == len(got_lps) == NEW_TOKENS
        for i in range(8):
            # Same context so far: the greedy token's logprob (the top-1 logprob) must agree,
            # even where a near-tie made the two backends pick different tokens.
            if ref_toks[:i] != got_toks[:i]:
                break
            a = ref_lps[i][ref_toks[i]].logprob
            b = got_lps[i][got_toks[i]].logprob
            assert abs(a - b) < 0.05, (i, ref_toks[: i + 1], got_toks[: i + 1], a, b)
            compared += 1
    assert compared >= len(LENGTHS)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_fp8_kv_cache_close_to_bf16(family, request):
    """kv_cache_dtype="fp8": float8 KV blocks, and the first token's distribution close to the
    bf16 cache's (a random tiny model's logits are near-ties everywhere, so later greedy
    tokens may go their own way: the first position is compared, token by token)."""
    folder = request.getfixturevalue(family)
    ref = _generate(folder, "triton", "bfloat16", logprobs=20, gpu_memory_utilization=0.3)
    llm = LLM(model=folder, dtype="bfloat16", skip_tokenizer_init=True,
              kv_cache_dtype="fp8", gpu_memory_utilization=0.3)
    assert llm.llm_engine.executor.worker.runner.kv_caches[0].dtype == torch.float8_e4m3fn
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True,
                            logprobs=20)
    outs = llm.generate([{"prompt_token_ids": p} for p in _prompts()], params, use_tqdm=False)
    same_first = 0
    for (ref_toks, ref_lps), out in zip(ref, outs):
        first, lps = ref_toks[0], out.outputs[0].logprobs[0]
        assert first in lps, (first, sorted(lps))
        assert abs(lps[first].logprob - ref_lps[0][first].logprob) < 0.1
        same_first += out.outputs[0].token_ids[0] == first
        assert len(out.outputs[0].token_ids) == NEW_TOKENS
    assert same_first >= len(LENGTHS) - 2
