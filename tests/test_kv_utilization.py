"""W5's measurement: the per-step trace of KV slots holding real tokens vs slots allocated."""

from __future__ import annotations

import random

import pytest

from octavo import LLM, SamplingParams
from tests.tiny_models import make_checkpoint

BLOCK = 16
MAX_LEN = 256


@pytest.fixture(scope="module")
def llm(tmp_path_factory) -> LLM:
    folder = make_checkpoint("llama", str(tmp_path_factory.mktemp("kv_util")))
    return LLM(model=folder, dtype="float32", skip_tokenizer_init=True, max_model_len=MAX_LEN,
               block_size=BLOCK, enable_prefix_caching=False)


def test_trace_shows_paged_waste_under_one_block_per_request(llm):
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 500) for _ in range(rng.randint(5, 60))] for _ in range(12)]
    params = [SamplingParams(max_tokens=rng.randint(5, 40), ignore_eos=True) for _ in prompts]
    tm = llm.llm_engine.timings
    tm.trace = []
    tm.reset()
    llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    rows = [r for r in tm.trace if r.num_running]
    assert rows and len(rows) == len([r for r in tm.trace if r.num_running])
    for r in rows:
        # Paged: at most one partly filled block per running request.
        assert r.stored_tokens <= r.used_blocks * BLOCK
        assert r.used_blocks * BLOCK - r.stored_tokens < r.num_running * BLOCK
    w5 = tm.kv_utilization(MAX_LEN, BLOCK)
    assert w5["steps_sampled"] == len(rows)
    assert 0 < w5["paged_min"] <= w5["paged_time_avg"] <= 1
    # Requests hold at most 100 of 256 slots, so preallocation wastes more than half.
    assert w5["contiguous_time_avg"] < 0.5 < w5["paged_time_avg"]
    tm.trace = None
    tm.reset()
    assert tm.trace is None
