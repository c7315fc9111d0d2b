"""best_of > n for sampled requests: best_of samples run, only the n best reach the user,
ranked by ``cumulative_logprob / num_generated_tokens ** length_penalty``.

Seeded samples do not depend on the batch, so a plain ``n=best_of`` run with the same seed
shows every candidate; the ranked request must return exactly the best n of them.
"""

from __future__ import annotations

import logging

import pytest

from octavo import LLM, SamplingParams
from octavo.engine.processor import Processor
from tests.tiny_models import make_checkpoint

PROMPT = [17, 250, 31, 402, 9, 88, 5]
BEST_OF = 6


@pytest.fixture(scope="module")
def llm(tmp_path_factory) -> LLM:
    folder = make_checkpoint("llama", str(tmp_path_factory.mktemp("llama_best_of")))
    return LLM(model=folder, dtype="float32", skip_tokenizer_init=True, max_model_len=64)


def _score(c, length_penalty: float) -> float:
    return c.cumulative_logprob / len(c.token_ids) ** length_penalty


def _every_sample(llm, **kwargs):
    """All best_of candidates (same seeds as the ranked request's samples), with logprobs."""
    params = SamplingParams(n=BEST_OF, logprobs=0, **kwargs)
    return llm.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False)[0].outputs


def _expected(candidates, n: int, length_penalty: float):
    ranked = sorted(candidates, key=lambda c: _score(c, length_penalty), reverse=True)
    return [list(c.token_ids) for c in ranked[:n]]


def test_returns_the_n_best_samples(llm):
    common = dict(temperature=1.0, seed=7, max_tokens=8, ignore_eos=True)
    candidates = _every_sample(llm, **common)
    assert len({tuple(c.token_ids) for c in candidates}) == BEST_OF  # distinct samples
    params = SamplingParams(n=2, best_of=BEST_OF, **common)
    out = llm.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False)[0]
    assert out.finished and [c.index for c in out.outputs] == [0, 1]
    assert [list(c.token_ids) for c in out.outputs] == _expected(candidates, 2, 1.0)
    for c in out.outputs:
        assert c.logprobs is None  # not asked for: used for ranking only
        assert c.finish_reason == "length"
    assert _score(out.outputs[0], 1.0) >= _score(out.outputs[1], 1.0)


def test_logprobs_kept_when_asked(llm):
    params = SamplingParams(n=1, best_of=3, temperature=1.0, seed=1, max_tokens=5,
                            ignore_eos=True, logprobs=2)
    c = llm.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False)[0].outputs[0]
    assert len(c.logprobs) == len(c.token_ids)
    assert c.cumulative_logprob == pytest.approx(
        sum(e[t].logprob for e, t in zip(c.logprobs, c.token_ids)))


@pytest.mark.parametrize("length_penalty", [0.0, 1.0, 2.0])
def test_length_penalty_ranks_samples_of_different_lengths(llm, length_penalty):
    """A stop token among few allowed tokens gives samples of many lengths; length_penalty=0
    (vLLM's ranking: cumulative logprob) favours short ones, 2.0 long ones."""
    common = dict(temperature=1.0, seed=11, max_tokens=12, allowed_token_ids=[5, 6, 7, 8, 9],
                  stop_token_ids=[5])
    candidates = _every_sample(llm, **common)
    lengths = sorted(len(c.token_ids) for c in candidates)
    assert lengths[0] < lengths[-1], lengths
    orders = {lp: _expected(candidates, 3, lp) for lp in (0.0, 2.0)}
    assert orders[0.0] != orders[2.0]  # the penalty matters for these samples
    params = SamplingParams(n=3, best_of=BEST_OF, length_penalty=length_penalty, **common)
    out = llm.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False)[0]
    assert [list(c.token_ids) for c in out.outputs] == _expected(candidates, 3, length_penalty)


def test_greedy_best_of(llm):
    greedy = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    one = llm.generate([{"prompt_token_ids": PROMPT}], greedy, use_tqdm=False)[0]
    params = SamplingParams(n=2, best_of=3, temperature=0.0, max_tokens=6, ignore_eos=True)
    out = llm.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False)[0]
    assert [c.token_ids for c in out.outputs] == [one.outputs[0].token_ids] * 2


def test_only_the_final_output_is_streamed(llm):
    """The best n are known only at the end: a CUMULATIVE request gets one output."""
    engine = llm.llm_engine
    engine.add_request("ranked", {"prompt_token_ids": PROMPT},
                       SamplingParams(n=2, best_of=4, temperature=1.0, seed=3, max_tokens=6,
                                      ignore_eos=True))
    seen = []
    while engine.has_unfinished_requests():
        seen += [o for o in engine.step() if o.request_id == "ranked"]
    assert len(seen) == 1 and seen[0].finished and len(seen[0].outputs) == 2
    assert not engine.parents


def test_abort_frees_every_sample(llm):
    engine = llm.llm_engine
    engine.add_request("aborted", {"prompt_token_ids": PROMPT},
                       SamplingParams(n=1, best_of=4, temperature=1.0, max_tokens=20,
                                      ignore_eos=True))
    engine.step()
    engine.step()
    assert len(engine.states) == 4
    engine.abort_request("aborted")
    assert not engine.has_unfinished_requests()  # the autouse fixture checks the blocks


def test_prompt_logprobs_with_best_of_rejected(llm):
    params = SamplingParams(best_of=2, prompt_logprobs=1, max_tokens=2)
    with pytest.raises(ValueError, match=r"prompt_logprobs.*best_of"):
        llm.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False)
    with pytest.raises(ValueError, match=r"prompt_logprobs.*best_of"):
        llm.llm_engine.add_request("direct", {"prompt_token_ids": PROMPT}, params)
    assert not llm.llm_engine.has_unfinished_requests()


def test_length_penalty_warns_only_when_unused(llm, caplog):
    processor = Processor(llm.llm_engine.config.model_config, None)
    with caplog.at_level(logging.WARNING):
        processor.check_params(SamplingParams(n=1, best_of=2, length_penalty=0.5))
        assert not [r for r in caplog.records if "length_penalty" in r.getMessage()]
        processor.check_params(SamplingParams(n=2, length_penalty=0.5))
        processor.check_params(SamplingParams(length_penalty=0.7))
    warnings = [r for r in caplog.records if "length_penalty" in r.getMessage()]
    assert len(warnings) == 1  # once, for the first request where it has no effect
