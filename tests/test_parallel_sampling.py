"""n > 1: samples share the prompt's KV blocks (copy-on-write of the partial block) and give
the outputs independent requests would."""

from __future__ import annotations

import json
import os
import random

import pytest

from octavo import LLM, SamplingParams
from octavo.sampling_params import RequestOutputKind
from tests.tiny_models import COMMON, make_checkpoint


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    folder = make_checkpoint("llama", str(tmp_path_factory.mktemp("llama-n")))
    return LLM(model=folder, dtype="float32", skip_tokenizer_init=True, block_size=16)


@pytest.mark.parametrize("prompt_len", [1, 5, 17, 20, 33])
def test_greedy_samples_equal_single_request(llm, prompt_len):
    """Whether the shared prefix ends on a block boundary (17, 33) or inside a block that is
    copied (5, 20), each greedy sample equals the n=1 output."""
    rng = random.Random(prompt_len)
    prompt = {"prompt_token_ids": [rng.randrange(3, 512) for _ in range(prompt_len)]}
    single = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=20,
                                                 ignore_eos=True), use_tqdm=False)[0]
    out = llm.generate(prompt, SamplingParams(n=3, temperature=0.0, max_tokens=20,
                                              ignore_eos=True), use_tqdm=False)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    for c in out.outputs:
        assert c.token_ids == single.outputs[0].token_ids


def test_seeded_samples_differ_and_repeat(llm):
    prompt = {"prompt_token_ids": [7, 8, 9, 10, 11, 12]}
    params = SamplingParams(n=4, temperature=1.0, seed=42, max_tokens=12, ignore_eos=True)
    a = llm.generate(prompt, params, use_tqdm=False)[0]
    b = llm.generate(prompt, params, use_tqdm=False)[0]
    seqs = [tuple(c.token_ids) for c in a.outputs]
    assert len(set(seqs)) == 4
    assert seqs == [tuple(c.token_ids) for c in b.outputs]


def test_streaming_deltas_carry_sample_index(llm):
    engine = llm.llm_engine
    params = SamplingParams(n=2, temperature=0.0, max_tokens=5, ignore_eos=True,
                            output_kind=RequestOutputKind.DELTA)
    engine.add_request("stream", {"prompt_token_ids": [3, 4, 5]}, params)
    tokens = {0: [], 1: []}
    finished = False
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert out.request_id == "stream" and len(out.outputs) == 1
            tokens[out.outputs[0].index] += out.outputs[0].token_ids
            finished = out.finished
    assert finished and len(tokens[0]) == len(tokens[1]) == 5


def test_abort_parent_frees_every_sample(llm):
    engine = llm.llm_engine
    engine.add_request("gone", {"prompt_token_ids": list(range(3, 60))},
                       SamplingParams(n=4, max_tokens=50, ignore_eos=True))
    for _ in range(3):
        engine.step()
    engine.abort_request("gone")
    pool = engine.scheduler.kv.pool
    assert pool.num_free_blocks == pool.num_blocks
    assert not engine.has_unfinished_requests()


def _peak_blocks(llm, prompt, n, tokens=16) -> int:
    engine = llm.llm_engine
    engine.add_request(f"mem{n}", prompt, SamplingParams(n=n, temperature=0.8, seed=1,
                                                         max_tokens=tokens, ignore_eos=True))
    peak = 0
    while engine.has_unfinished_requests():
        engine.step()
        peak = max(peak, engine.scheduler.kv.pool.num_used_blocks)
    return peak


def test_memory_grows_with_generated_tokens_not_with_n(tmp_path):
    """n=8 on a 1,000-token prompt: blocks in use stay under 1.3x those of n=1 over the first
    16 tokens."""
    cfg = dict(COMMON, max_position_embeddings=2048, architectures=["LlamaForCausalLM"],
               model_type="llama", hidden_act="silu")
    with open(os.path.join(tmp_path, "config.json"), "w") as f:
        json.dump(cfg, f)
    llm = LLM(model=str(tmp_path), load_format="dummy", dtype="float32",
              skip_tokenizer_init=True, block_size=16)
    rng = random.Random(0)
    prompt = {"prompt_token_ids": [rng.randrange(3, 512) for _ in range(1000)]}
    one = _peak_blocks(llm, prompt, 1)
    eight = _peak_blocks(llm, prompt, 8)
    assert one == -(-1016 // 16)
    assert eight < 1.3 * one, (one, eight)
