"""An 8k-token prompt arriving while requests decode: with chunked prefill, the running
requests keep getting one token per step and their outputs do not change."""

from __future__ import annotations

import math
import random

import pytest

pytest.importorskip("torch")

from octavo import LLM, SamplingParams  # noqa: E402
from tests.tiny_models import make_checkpoint  # noqa: E402

LONG = 8192
BUDGET = 512
NUM_RUNNING = 4
DECODE_TOKENS = 40  # outlasts the long prompt's prefill


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    folder = make_checkpoint("llama", str(tmp_path_factory.mktemp("long")),
                             max_position_embeddings=LONG + 64)
    return LLM(model=folder, dtype="float32", skip_tokenizer_init=True,
               enable_chunked_prefill=True, max_num_batched_tokens=BUDGET,
               max_model_len=LONG + 64, enable_prefix_caching=False)


def test_decodes_advance_every_step_while_8k_prompt_prefills(llm):
    rng = random.Random(0)
    short = [[rng.randrange(3, 512) for _ in range(20 + 7 * i)] for i in range(NUM_RUNNING)]
    long_prompt = [rng.randrange(3, 512) for _ in range(LONG)]
    params = SamplingParams(temperature=0.0, max_tokens=DECODE_TOKENS, ignore_eos=True)
    undisturbed = [o.outputs[0].token_ids for o in llm.generate(
        [{"prompt_token_ids": p} for p in short], params, use_tqdm=False)]

    engine = llm.llm_engine
    ids = [f"run-{i}" for i in range(NUM_RUNNING)]
    for rid, p in zip(ids, short):
        engine.add_request(rid, {"prompt_token_ids": p}, params)
    running = [engine.scheduler.requests[rid] for rid in ids]
    finals = {}

    def step():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out.outputs[0].token_ids
        assert engine.last_stats.num_scheduled_tokens <= BUDGET

    step()  # the short prompts' prefill
    assert [r.num_output_tokens for r in running] == [1] * NUM_RUNNING
    engine.add_request("long", {"prompt_token_ids": long_prompt},
                       SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
    long_req = engine.scheduler.requests["long"]
    prefill_steps = 0
    while long_req.num_computed_tokens < LONG:
        before = [r.num_output_tokens for r in running]
        computed = long_req.num_computed_tokens
        step()
        prefill_steps += 1
        assert [r.num_output_tokens for r in running] == [n + 1 for n in before]
        assert long_req.num_computed_tokens - computed == (
            engine.last_stats.num_scheduled_tokens - NUM_RUNNING)
    # Each step: the running decodes first, the rest of the budget to the long prompt.
    assert prefill_steps == math.ceil(LONG / (BUDGET - NUM_RUNNING))
    assert long_req.num_output_tokens == 1
    while engine.has_unfinished_requests():
        step()
    assert [finals[rid] for rid in ids] == undisturbed
    assert len(finals["long"]) == 2
