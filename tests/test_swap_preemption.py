"""Preemption by swap end to end: greedy float32 outputs are the same with preemption by swap,
by recompute, and with no preemption at all (a tiny KV pool forces preemption)."""

from __future__ import annotations

import random

import pytest

from octavo import LLM, SamplingParams
from tests.tiny_models import make_checkpoint

NEW_TOKENS = 24
BLOCK_BYTES = 2048  # tiny llama: 2 layers x K,V x 4 tokens x 2 heads x 16 dims x 4 bytes
TINY_POOL = dict(num_gpu_blocks_override=40, block_size=4, max_model_len=160)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_checkpoint("llama", str(tmp_path_factory.mktemp("llama")))


def _prompts(shared_prefix: int = 0) -> list[list[int]]:
    rng = random.Random(0)
    prefix = [rng.randrange(3, 512) for _ in range(shared_prefix)]
    return [prefix + [rng.randrange(3, 512) for _ in range(n)]
            for n in (1, 3, 7, 15, 16, 17, 33, 64, 100)]


def _generate(folder: str, prompts, params=None, **kwargs):
    llm = LLM(model=folder, dtype="float32", skip_tokenizer_init=True, **kwargs)
    params = params or SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return llm, [[c.token_ids for c in o.outputs] for o in outs]


@pytest.fixture(scope="module")
def expected(folder):
    llm, tokens = _generate(folder, _prompts())
    assert llm.llm_engine.scheduler.num_preemptions == 0
    return tokens


def _by_mode(llm) -> dict[str, int]:
    sched = llm.llm_engine.scheduler
    assert sum(sched.preemptions_by_mode.values()) == sched.num_preemptions
    return sched.preemptions_by_mode


@pytest.mark.parametrize("chunked", [True, False])
def test_swap_and_recompute_give_the_outputs_of_no_preemption(folder, expected, chunked):
    chunks = dict(enable_chunked_prefill=chunked,
                  max_num_batched_tokens=16 if chunked else 160)
    swap_llm, swapped = _generate(folder, _prompts(), preemption_mode="swap",
                                  swap_space=0.01, **chunks, **TINY_POOL)
    assert swap_llm.llm_engine.scheduler.swap.num_blocks == int(0.01 * 2**30) // BLOCK_BYTES
    assert _by_mode(swap_llm)["swap"] > 0
    assert _by_mode(swap_llm)["recompute"] == 0
    assert swapped == expected
    recompute_llm, recomputed = _generate(folder, _prompts(), **chunks, **TINY_POOL)
    assert _by_mode(recompute_llm)["recompute"] > 0
    assert _by_mode(recompute_llm)["swap"] == 0
    assert recompute_llm.llm_engine.scheduler.swap.num_blocks == 0  # nothing reserved
    assert recomputed == expected


def test_swap_with_asynchronous_scheduling(folder, expected):
    """Victims may have a token in flight when they are swapped out."""
    llm, got = _generate(folder, _prompts(), preemption_mode="swap", swap_space=0.01,
                         async_scheduling=True, max_num_batched_tokens=16, **TINY_POOL)
    assert llm.llm_engine.config.scheduler_config.async_scheduling
    assert _by_mode(llm)["swap"] > 0
    assert got == expected


def test_too_little_swap_space_falls_back_to_recompute(folder, expected):
    llm, got = _generate(folder, _prompts(), preemption_mode="swap",
                         swap_space=2 * BLOCK_BYTES / 2**30, **TINY_POOL)
    assert llm.llm_engine.scheduler.swap.num_blocks == 2
    assert _by_mode(llm)["recompute"] > 0
    assert got == expected
    llm, got = _generate(folder, _prompts(), preemption_mode="swap", swap_space=0,
                         **TINY_POOL)
    assert llm.llm_engine.scheduler.swap.num_blocks == 0
    assert _by_mode(llm) == {"recompute": llm.llm_engine.scheduler.num_preemptions,
                             "swap": 0} and llm.llm_engine.scheduler.num_preemptions > 0
    assert got == expected


def test_swap_with_shared_prefix_blocks(folder):
    """Prompts share 24 tokens (6 full blocks, ref-counted between requests through the
    prefix cache): victims swap their copies out, the other owners keep theirs."""
    prompts = _prompts(shared_prefix=24)
    _, reference = _generate(folder, prompts, max_model_len=160, block_size=4)
    llm, got = _generate(folder, prompts, preemption_mode="swap", swap_space=0.01,
                         num_gpu_blocks_override=48, block_size=4, max_model_len=160)
    assert _by_mode(llm)["swap"] > 0
    assert llm.llm_engine.scheduler.kv.prefix_hits > 0
    assert got == reference


def test_seeded_parallel_samples_survive_swapping(folder):
    """n=3 seeded samples fork the prompt's blocks; swapped or not, the same tokens."""
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=NEW_TOKENS,
                            ignore_eos=True)
    prompts = _prompts()[3:]
    _, reference = _generate(folder, prompts, params, max_model_len=160, block_size=4)
    llm, got = _generate(folder, prompts, params, preemption_mode="swap", swap_space=0.01,
                         **TINY_POOL)
    assert _by_mode(llm)["swap"] > 0
    assert got == reference


def test_preemptions_by_mode_are_exported_to_prometheus(folder):
    pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families

    from octavo.metrics.prometheus import PrometheusStatLogger

    llm, _ = _generate(folder, _prompts(), preemption_mode="swap", swap_space=0.01,
                       **TINY_POOL)
    text = PrometheusStatLogger(llm.llm_engine, "tiny").render().decode()
    samples = {s.labels["mode"]: s.value
               for fam in text_string_to_metric_families(text)
               if fam.name == "octavo:num_preemptions_by_mode" for s in fam.samples
               if s.name.endswith("_total")}
    assert samples == {mode: float(n) for mode, n in _by_mode(llm).items()}
    assert samples["swap"] > 0


def test_swapped_requests_gauge(folder):
    """octavo:num_requests_swapped counts the requests whose KV waits in CPU blocks."""
    pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families

    from octavo.metrics.prometheus import PrometheusStatLogger

    llm = LLM(model=folder, dtype="float32", skip_tokenizer_init=True,
              preemption_mode="swap", swap_space=0.01, **TINY_POOL)
    engine = llm.llm_engine
    metrics = PrometheusStatLogger(engine, "tiny")

    def gauge() -> float:
        return next(s.value for fam in text_string_to_metric_families(metrics.render().decode())
                    if fam.name == "octavo:num_requests_swapped" for s in fam.samples)

    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    for i, p in enumerate(_prompts()):
        engine.add_request(str(i), {"prompt_token_ids": p}, params)
    seen = []
    while engine.has_unfinished_requests():
        engine.step()
        swapped = len(engine.scheduler.swap.req_to_cpu_blocks)
        assert gauge() == swapped
        seen.append(swapped)
    assert max(seen) > 0 and gauge() == 0


def test_unknown_preemption_mode_is_refused(folder):
    with pytest.raises(ValueError, match="preemption_mode must be 'recompute' or 'swap', "
                                         "got 'drop'"):
        LLM(model=folder, skip_tokenizer_init=True, preemption_mode="drop")
