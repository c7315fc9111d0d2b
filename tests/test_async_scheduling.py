"""Asynchronous scheduling (step N+1 scheduled before step N's tokens reach the host) gives
exactly the outputs of synchronous scheduling. Forced on here on the CPU: the logic is the
same as on CUDA, only the device copies are synchronous."""

from __future__ import annotations

import random

import pytest

from octavo import LLM, SamplingParams
from tests.tiny_models import make_checkpoint


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    return make_checkpoint("llama", str(tmp_path_factory.mktemp("async_sched")))


def _prompts(n: int = 10, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 500) for _ in range(rng.randint(1, 70))] for _ in range(n)]


def _run(folder, prompts, params, **kwargs):
    kwargs.setdefault("max_model_len", 256)
    llm = LLM(model=folder, dtype="float32", skip_tokenizer_init=True, **kwargs)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return llm, [[(c.token_ids, c.finish_reason) for c in o.outputs] for o in outs]


def _both(folder, prompts, params, **kwargs):
    _, sync = _run(folder, prompts, params, async_scheduling=False, **kwargs)
    llm, asyn = _run(folder, prompts, params, async_scheduling=True, **kwargs)
    assert llm.llm_engine.config.scheduler_config.async_scheduling
    assert llm.llm_engine.executor.worker.runner.num_tokens_fed_on_device > 0
    assert asyn == sync
    return llm, sync


def test_greedy_with_varied_lengths(folder):
    rng = random.Random(1)
    params = [SamplingParams(temperature=0.0, max_tokens=rng.randint(1, 30), ignore_eos=True)
              for _ in range(10)]
    _both(folder, _prompts(), params)


def test_stop_tokens_found_one_step_late_are_dropped(folder):
    """Requests ending on a stop token are only known to end after the next step has been
    launched; that step's token for them is discarded."""
    prompts = _prompts()
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    _, ref = _run(folder, prompts, greedy, async_scheduling=False)
    # Stop each request at the token it produces 5th (a stop the engine only sees late).
    params = [SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True,
                             stop_token_ids=[r[0][0][4]])
              for r in ref]
    _, got = _both(folder, prompts, params)
    assert all(len(r[0][0]) <= 5 and r[0][1] == "stop" for r in got)


def test_preemption_and_small_chunks(folder):
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    llm, _ = _both(folder, _prompts(), params, num_gpu_blocks_override=30, block_size=4,
                   max_model_len=110, max_num_batched_tokens=16, max_num_seqs=6)
    assert llm.llm_engine.scheduler.num_preemptions > 0


def test_seeded_sampling_and_parallel_samples(folder):
    params = [SamplingParams(temperature=0.8, seed=i, max_tokens=12, n=2 if i % 3 == 0 else 1,
                             ignore_eos=True) for i in range(10)]
    _both(folder, _prompts(), params)


def test_requests_needing_host_history_mixed_in(folder):
    """Penalties, sampled logprobs and prompt logprobs mixed in: every step overlaps."""
    # Those requests end early; the rest then run overlapped.
    params = [SamplingParams(temperature=0.0, ignore_eos=True,
                             max_tokens=4 if i % 2 or i % 3 == 0 else 16,
                             repetition_penalty=1.5 if i % 2 else 1.0,
                             logprobs=2 if i % 3 == 0 else None,
                             prompt_logprobs=1 if i == 3 else None) for i in range(10)]
    llm, _ = _both(folder, _prompts(), params)
    # The engine computed each prompt and every output token but the last, once.
    want = sum(len(p) for p in _prompts()) + sum(p.max_tokens - 1 for p in params)
    assert llm.llm_engine.timings.tokens == want


def _no_repeat(output_ids, logits):
    """Bans the previous output token: wrong at once if a step sampled without it."""
    if output_ids:
        logits[output_ids[-1]] = float("-inf")
    return logits


def test_penalties_and_processors_overlap_and_see_the_latest_token(folder):
    """Requests whose sampling reads their latest tokens (penalties, a logits processor over
    the output, min_tokens) no longer stop the overlap: each step's forward pass is launched
    while the step before is in flight, and the sampling waits for that step's tokens. Every
    request here is one of them, so any overlap (tokens fed on the device) is theirs; the
    outputs equal synchronous scheduling's token for token."""
    kinds = [dict(repetition_penalty=1.8), dict(frequency_penalty=1.5, presence_penalty=0.5),
             dict(logits_processors=[_no_repeat]),
             dict(min_tokens=6, stop_token_ids=[7, 8, 9, 10, 11, 12])]
    params = [SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=14,
                             **kinds[i % len(kinds)]) for i in range(10)]
    llm, outs = _both(folder, _prompts(), params)
    for o in outs[2::4]:  # the no-repeat processor's requests
        toks = o[0][0]
        assert all(a != b for a, b in zip(toks, toks[1:])), toks


def test_abort_while_a_step_is_in_flight(folder):
    llm = LLM(model=folder, dtype="float32", skip_tokenizer_init=True, max_model_len=256,
              async_scheduling=True)
    engine = llm.llm_engine
    for i, p in enumerate(_prompts(4)):
        engine.add_request(str(i), {"prompt_token_ids": p},
                           SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True))
    for _ in range(5):
        engine.step()
    assert engine._inflight is not None
    engine.abort_request(["1", "2"])
    finished = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            finished[out.request_id] = out
    assert set(finished) == {"0", "3"}
    assert all(len(o.outputs[0].token_ids) == 50 for o in finished.values())
    assert engine.scheduler.kv.num_free_blocks == engine.scheduler.kv.pool.num_blocks


def test_penalized_requests_preempted_rebuild_their_counts(folder):
    """Penalty counts live in the worker's device rows under asynchronous scheduling, counted
    as tokens are sampled; a preempted request gives its row back and rebuilds it from its
    token lists when it resumes. Outputs equal synchronous scheduling's (host tallies)."""
    kinds = [dict(repetition_penalty=1.8), dict(frequency_penalty=1.5, presence_penalty=0.5),
             dict(repetition_penalty=0.7, frequency_penalty=-0.5)]
    params = [SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True,
                             **kinds[i % len(kinds)]) for i in range(10)]
    llm, _ = _both(folder, _prompts(), params, num_gpu_blocks_override=30, block_size=4,
                   max_model_len=110, max_num_batched_tokens=16, max_num_seqs=6)
    assert llm.llm_engine.scheduler.num_preemptions > 0
    runner = llm.llm_engine.executor.worker.runner
    rows = runner.penalty_rows
    # Every row given back but those of requests the worker still holds (the last to
    # finish is dropped by the next step's schedule).
    held = sum(st.row_cache.penalty is not None for st in runner.states.values())
    assert rows is not None and rows.capacity - len(rows.free) == held <= 1


def test_sampled_logprobs_overlap_and_equal_synchronous_ones(folder):
    """Requests asking for logprobs or prompt logprobs (and best_of, ranked by logprobs) no
    longer stop the overlap: their values come back with the tokens. Tokens, logprobs,
    prompt logprobs, ranks and top-k equal synchronous scheduling's, chunked prefills
    included."""
    params = [SamplingParams(temperature=0.0 if i % 2 else 0.9, seed=i, ignore_eos=True,
                             max_tokens=10, logprobs=3 if i % 3 else 0,
                             prompt_logprobs=(2 if i % 2 else 0) if i % 4 != 3 else None)
              for i in range(8)]
    got = {}
    for mode in (False, True):
        llm = LLM(model=folder, dtype="float32", skip_tokenizer_init=True, max_model_len=256,
                  async_scheduling=mode, max_num_batched_tokens=48)  # chunked prefills
        outs = llm.generate([{"prompt_token_ids": p} for p in _prompts(8)], params,
                            use_tqdm=False)
        got[mode] = [(o.outputs[0].token_ids,
                      [{t: (lp.logprob, lp.rank) for t, lp in d.items()}
                       for d in o.outputs[0].logprobs + [
                           d for d in (o.prompt_logprobs or []) if d is not None]])
                     for o in outs]
        assert sum(1 for o in outs if o.prompt_logprobs) == 6
        if mode:
            assert llm.llm_engine.executor.worker.runner.num_tokens_fed_on_device > 0
    for (toks_s, lps_s), (toks_a, lps_a) in zip(got[False], got[True]):
        assert toks_a == toks_s
        assert len(lps_a) == len(lps_s) >= len(toks_s)
        for a, b in zip(lps_a, lps_s):
            assert a.keys() == b.keys()
            for t in a:
                assert a[t][1] == b[t][1] and abs(a[t][0] - b[t][0]) < 1e-5
