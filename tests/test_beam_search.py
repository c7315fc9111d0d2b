"""Beam search, through ``LLM.beam_search`` and ``SamplingParams(use_beam_search=True)``.

Compared with Hugging Face transformers' ``generate(num_beams=W, do_sample=False)`` in float32
on a tiny random llama: the same beams (token for token, best first) and the same
``sequences_scores`` for length_penalty 0.5 / 1.0 / 1.5, without EOS and with an EOS id that
really ends beams (under early_stopping False / True / "never"). Also: KV blocks shared through
the prefix cache, a mixed batch, logprobs, validation, aborts and text prompts.
"""

from __future__ import annotations

import os
import random
import shutil
from collections import Counter

import pytest
import torch

from octavo import LLM, BeamSearchParams, SamplingParams
from octavo.engine.beam_search import BeamSearch, BeamSearchConfig, beam_score
from octavo.outputs import Logprob
from tests.tiny_models import COMMON, add_word_tokenizer, copy_with_eos, make_checkpoint

W = 3  # beam width
T = 10  # max new tokens
MAX_LEN = 64
LENGTH_PENALTIES = (0.5, 1.0, 1.5)
EARLY_STOPPING = (False, True, "never")
SCORE_TOL = 1e-4
_rng = random.Random(0)
# 16 and 20 tokens: the beams' prefixes cross a 16-token KV block.
PROMPTS = [[_rng.randrange(3, COMMON["vocab_size"]) for _ in range(n)] for n in (1, 7, 16, 20)]


def _token_prompts(prompts=PROMPTS):
    return [{"prompt_token_ids": p} for p in prompts]


# --------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    return make_checkpoint("llama", str(tmp_path_factory.mktemp("llama_beams")))


@pytest.fixture(scope="module")
def hf_model(tiny_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def llm(tiny_dir) -> LLM:
    return LLM(model=tiny_dir, dtype="float32", skip_tokenizer_init=True, max_model_len=MAX_LEN)


def _hf_beams(model, prompt, length_penalty, early_stopping=False, eos=None, width=W):
    """transformers' beams for one prompt: [(generated tokens, sequences_score)], best first."""
    model.generation_config.eos_token_id = eos  # None: no EOS, like ignore_eos=True
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             num_beams=width, num_return_sequences=width, max_new_tokens=T,
                             length_penalty=length_penalty, early_stopping=early_stopping,
                             output_scores=True, return_dict_in_generate=True, pad_token_id=0)
    # beam_indices is -1 past each beam's end: it gives the generated lengths.
    lengths = (out.beam_indices != -1).sum(dim=1).tolist()
    return [(out.sequences[i, len(prompt):len(prompt) + n].tolist(),
             out.sequences_scores[i].item()) for i, n in enumerate(lengths)]


def _assert_same(ours, expected, length_penalty, what):
    """ours: [(tokens, score)]; equal tokens in the same order, scores within SCORE_TOL."""
    assert [t for t, _ in ours] == [t for t, _ in expected], what
    diff = max(abs(a - b) for (_, a), (_, b) in zip(ours, expected))
    assert diff < SCORE_TOL, f"{what}: score difference {diff:.2e}"
    return diff


def _from_completions(out, length_penalty):
    return [(list(c.token_ids), c.cumulative_logprob / len(c.token_ids) ** length_penalty)
            for c in out.outputs]


# ------------------------------------------------------------ against transformers, no EOS

@pytest.fixture(scope="module")
def no_eos_runs(llm):
    """LLM.beam_search with ignore_eos, per length penalty."""
    return {lp: llm.beam_search(_token_prompts(), BeamSearchParams(
        beam_width=W, max_tokens=T, ignore_eos=True, length_penalty=lp))
        for lp in LENGTH_PENALTIES}


@pytest.mark.parametrize("length_penalty", LENGTH_PENALTIES)
def test_beam_search_matches_transformers(no_eos_runs, hf_model, length_penalty):
    for prompt, out in zip(PROMPTS, no_eos_runs[length_penalty]):
        assert len(out.sequences) == W
        ours = [(s.output_token_ids, s.score) for s in out.sequences]
        _assert_same(ours, _hf_beams(hf_model, prompt, length_penalty), length_penalty,
                     f"prompt of {len(prompt)} tokens")
        for s in out.sequences:
            assert s.tokens[:len(prompt)] == prompt  # vLLM shape: tokens include the prompt
            assert s.finish_reason == "length" and len(s.output_token_ids) == T
            assert s.score == pytest.approx(s.cum_logprob / T ** length_penalty)
            assert len(s.logprobs) == T
            assert s.cum_logprob == pytest.approx(
                sum(step[t].logprob for step, t in zip(s.logprobs, s.output_token_ids)))


def test_generate_route_returns_top_n_of_best_of(llm, no_eos_runs):
    """use_beam_search with best_of=W, n=2: the two best of the width-W search."""
    params = SamplingParams(n=2, best_of=W, use_beam_search=True, temperature=0.0,
                            max_tokens=T, ignore_eos=True)
    outs = llm.generate(_token_prompts(), params, use_tqdm=False)
    for out, ref in zip(outs, no_eos_runs[1.0]):
        assert [c.index for c in out.outputs] == [0, 1]
        assert [list(c.token_ids) for c in out.outputs] == [
            s.output_token_ids for s in ref.sequences[:2]]
        assert [c.cumulative_logprob for c in out.outputs] == pytest.approx(
            [s.cum_logprob for s in ref.sequences[:2]], abs=1e-5)
        assert all(c.finish_reason == "length" and c.logprobs is None for c in out.outputs)


def test_width_one_is_greedy(llm):
    greedy = llm.generate(_token_prompts(), SamplingParams(temperature=0.0, max_tokens=T,
                                                           ignore_eos=True), use_tqdm=False)
    beams = llm.beam_search(_token_prompts(), BeamSearchParams(beam_width=1, max_tokens=T,
                                                               ignore_eos=True))
    assert [b.sequences[0].output_token_ids for b in beams] == [
        list(g.outputs[0].token_ids) for g in greedy]


# ------------------------------------------------------------ against transformers, with EOS

@pytest.fixture(scope="module")
def eos_token(no_eos_runs) -> int:
    """The token the beams pick most often: as EOS it ends some beams early."""
    counts = Counter(t for s in no_eos_runs[1.0] for seq in s.sequences
                     for t in set(seq.output_token_ids))
    return counts.most_common(1)[0][0]


@pytest.fixture(scope="module")
def eos_llm(tiny_dir, eos_token, tmp_path_factory) -> LLM:
    """The tiny checkpoint with ``eos_token`` as its EOS id."""
    folder = copy_with_eos(tiny_dir, str(tmp_path_factory.mktemp("llama_beams_eos")),
                           eos_token)
    llm = LLM(model=folder, dtype="float32", skip_tokenizer_init=True, max_model_len=MAX_LEN)
    assert llm.llm_engine.config.model_config.eos_token_ids == (eos_token,)
    return llm


@pytest.fixture(scope="module")
def eos_runs(eos_llm, hf_model, eos_token):
    """(ours, transformers') per (length_penalty, early_stopping), EOS honoured."""
    runs = {}
    for lp in LENGTH_PENALTIES:
        for es in EARLY_STOPPING:
            params = SamplingParams(n=W, use_beam_search=True, temperature=0.0, max_tokens=T,
                                    length_penalty=lp, early_stopping=es)
            outs = eos_llm.generate(_token_prompts(), params, use_tqdm=False)
            hf = [_hf_beams(hf_model, p, lp, es, eos=eos_token) for p in PROMPTS]
            runs[lp, es] = outs, hf
    return runs


@pytest.mark.parametrize("early_stopping", EARLY_STOPPING, ids=str)
@pytest.mark.parametrize("length_penalty", LENGTH_PENALTIES)
def test_eos_beams_match_transformers(eos_runs, eos_token, length_penalty, early_stopping):
    outs, hf = eos_runs[length_penalty, early_stopping]
    for prompt, out, expected in zip(PROMPTS, outs, hf):
        _assert_same(_from_completions(out, length_penalty), expected, length_penalty,
                     f"prompt of {len(prompt)} tokens")
        for c in out.outputs:
            ended = c.token_ids[-1] == eos_token
            assert c.finish_reason == ("stop" if ended else "length")
            assert c.stop_reason is None  # EOS, not a stop token
            assert eos_token not in c.token_ids[:-1]
            assert ended or len(c.token_ids) == T


def test_eos_grid_exercises_eos_and_early_stopping(eos_runs):
    """The comparisons above are only meaningful if EOS ends returned beams and
    early_stopping changes some result."""
    ends = [c.finish_reason for outs, _ in eos_runs.values() for o in outs for c in o.outputs]
    assert ends.count("stop") >= 5, Counter(ends)
    assert any(eos_runs[lp, True][1] != eos_runs[lp, False][1] for lp in LENGTH_PENALTIES)


def test_beam_search_api_honours_eos(eos_llm, eos_runs, eos_token):
    """LLM.beam_search (early_stopping=False, as transformers' default) ends beams at EOS."""
    outs = eos_llm.beam_search(_token_prompts(), BeamSearchParams(
        beam_width=W, max_tokens=T, length_penalty=0.5))
    for out, expected in zip(outs, eos_runs[0.5, False][1]):
        _assert_same([(s.output_token_ids, s.score) for s in out.sequences], expected, 0.5,
                     "length_penalty=0.5")
    ended = [s for out in outs for s in out.sequences if s.finish_reason == "stop"]
    assert ended and all(s.tokens[-1] == eos_token and s.stop_reason is None for s in ended)


def test_stop_token_ids_end_beams_like_eos(llm, eos_runs, eos_token):
    """On the checkpoint without that EOS, stop_token_ids=[it] gives the same beams and
    reports the token as stop_reason."""
    params = SamplingParams(n=W, use_beam_search=True, temperature=0.0, max_tokens=T,
                            ignore_eos=True, stop_token_ids=[eos_token], length_penalty=0.5)
    outs = llm.generate(_token_prompts(), params, use_tqdm=False)
    expected_outs, _ = eos_runs[0.5, False]
    stopped = 0
    for out, expected in zip(outs, expected_outs):
        assert [list(c.token_ids) for c in out.outputs] == [
            list(c.token_ids) for c in expected.outputs]
        for c in out.outputs:
            if c.finish_reason == "stop":
                stopped += 1
                assert c.stop_reason == eos_token
    assert stopped


# --------------------------------------------------------------------- the search itself

def _step(**lps: float) -> dict[int, Logprob]:
    return {int(k[1:]): Logprob(v) for k, v in lps.items()}


def test_eos_outside_the_first_width_candidates_is_dropped():
    search = BeamSearch(BeamSearchConfig(width=1, max_tokens=5, finish_token_ids=frozenset({0})))
    search.advance([_step(t1=-1.0, t0=-1.2, t2=-5.0)])
    assert search.finished == []  # EOS ranked second of K=2: neither kept nor continued
    assert [b.tokens for b in search.running] == [[1]]


@pytest.mark.parametrize("early_stopping,steps,tokens", [
    (False, 1, [0]),  # -1.5 / 1 cannot beat -1.0 at the current length: stop
    (True, 1, [0]),  # one hypothesis per beam slot: stop
    # -1.5 / 5 might beat -1.0 by max_tokens: go on; [1, 0] scores -1.6 / 2 = -0.8, then
    # the live beam's -5.5 / 5 cannot beat that any more.
    ("never", 3, [1, 0]),
])
def test_early_stopping_modes(early_stopping, steps, tokens):
    search = BeamSearch(BeamSearchConfig(width=1, max_tokens=5, early_stopping=early_stopping,
                                         finish_token_ids=frozenset({0})))
    search.advance([_step(t0=-1.0, t1=-1.5, t2=-3.0)])
    while not search.done:
        search.advance([_step(t0=-0.1, t1=-2.0)])
    assert search.num_generated == steps
    assert search.finished[0].tokens == tokens
    assert search.finished[0].score == pytest.approx(-1.0 if steps == 1 else -1.6 / 2)


@pytest.mark.parametrize("length_penalty", [1e38, -1e30, 1e300, -1e300])
def test_extreme_length_penalties_saturate(llm, length_penalty):
    """Found by scripts/fuzz_server.py: a 500 ("float division by zero", "Numerical result
    out of range") for beam search or best_of with a finite but huge length_penalty."""
    for n in (1, 2, 1000):
        score = beam_score(-1.5, n, length_penalty)
        assert score == beam_score(-1.5, n, length_penalty) and score <= 0.0  # not NaN
    assert beam_score(-1.5, 1, length_penalty) == -1.5
    assert beam_score(-1.5, 2, 1e38) == 0.0 and beam_score(-1.5, 2, -1e30) == float("-inf")
    prompt = [{"prompt_token_ids": [1, 5, 9]}]
    for params in (SamplingParams(use_beam_search=True, temperature=0.0, n=2, max_tokens=3,
                                  length_penalty=length_penalty, early_stopping="never"),
                   SamplingParams(n=1, best_of=3, max_tokens=3, seed=0,
                                  length_penalty=length_penalty)):
        out = llm.generate(prompt, params, use_tqdm=False)[0]
        assert all(len(c.token_ids) >= 1 for c in out.outputs)
    assert not llm.llm_engine.has_unfinished_requests()


# ------------------------------------------------------------------ engine behaviour

def test_beams_share_prompt_blocks_through_the_prefix_cache(tiny_dir, llm):
    """Each round's requests find their beams' full blocks in the prefix cache, so only
    partial blocks are recomputed; without the cache the same beams cost far more tokens."""
    prompt = PROMPTS[3] + PROMPTS[2] + PROMPTS[1]  # 43 tokens: two full blocks
    params = BeamSearchParams(beam_width=W, max_tokens=T, ignore_eos=True)
    plain = LLM(model=tiny_dir, dtype="float32", skip_tokenizer_init=True,
                max_model_len=MAX_LEN, enable_prefix_caching=False)
    counts = []
    results = []
    for engine_llm in (llm, plain):
        engine = engine_llm.llm_engine
        before, hits = engine.timings.tokens, engine.scheduler.kv.prefix_hits
        results.append(engine_llm.beam_search([{"prompt_token_ids": prompt}], params))
        counts.append((engine.timings.tokens - before, engine.scheduler.kv.prefix_hits - hits))
    (cached_tokens, hits), (plain_tokens, _) = counts
    assert [s.tokens for s in results[0][0].sequences] == [
        s.tokens for s in results[1][0].sequences]
    block = llm.llm_engine.config.cache_config.block_size
    # Round 1 computes the prompt; each later round at most one block per beam.
    assert cached_tokens <= len(prompt) + (T - 1) * W * block
    assert hits >= (T - 1) * W * 2 * block  # the prompt's two full blocks, every beam
    # Without the cache every round recomputes every beam's whole prefix.
    assert plain_tokens == len(prompt) + sum(W * (len(prompt) + i) for i in range(1, T))
    assert cached_tokens < plain_tokens / 2


def test_mixed_batch_of_beam_and_sampled_requests(llm, no_eos_runs):
    greedy = SamplingParams(temperature=0.0, max_tokens=T, ignore_eos=True)
    beams = SamplingParams(n=W, use_beam_search=True, temperature=0.0, max_tokens=T,
                           ignore_eos=True)
    alone = llm.generate(_token_prompts(), greedy, use_tqdm=False)
    outs = llm.generate(_token_prompts() * 2, [greedy, beams] * len(PROMPTS), use_tqdm=False)
    for i, out in enumerate(outs):
        prompt = (PROMPTS * 2)[i]
        assert out.prompt_token_ids == prompt
        if i % 2 == 0:
            assert out.outputs[0].token_ids == alone[PROMPTS.index(prompt)].outputs[0].token_ids
        else:
            ref = no_eos_runs[1.0][PROMPTS.index(prompt)]
            assert [list(c.token_ids) for c in out.outputs] == [
                s.output_token_ids for s in ref.sequences]


def test_logprobs_option(llm):
    params = SamplingParams(n=2, use_beam_search=True, temperature=0.0, max_tokens=4,
                            ignore_eos=True, logprobs=2)
    out = llm.generate(_token_prompts(PROMPTS[:1]), params, use_tqdm=False)[0]
    for c in out.outputs:
        assert len(c.logprobs) == len(c.token_ids)
        for entry, tok in zip(c.logprobs, c.token_ids):
            assert tok in entry and len(entry) <= 3
        assert c.cumulative_logprob == pytest.approx(
            sum(e[t].logprob for e, t in zip(c.logprobs, c.token_ids)))


def test_generation_capped_at_max_model_len(llm):
    prompt = [5] * (MAX_LEN - 3)
    out = llm.beam_search([{"prompt_token_ids": prompt}],
                          BeamSearchParams(beam_width=2, max_tokens=T, ignore_eos=True))[0]
    assert [len(s.output_token_ids) for s in out.sequences] == [3, 3]
    assert all(s.finish_reason == "length" for s in out.sequences)


UNSUPPORTED = [
    (dict(presence_penalty=0.5), r"presence_penalty=0.5.*use_beam_search"),
    (dict(min_tokens=2), r"min_tokens=2.*use_beam_search"),
    (dict(logit_bias={5: 1.0}), r"logit_bias.*use_beam_search"),
    (dict(prompt_logprobs=1), r"prompt_logprobs=1.*use_beam_search"),
]


@pytest.mark.parametrize("kwargs,pattern", UNSUPPORTED, ids=[str(k) for k, _ in UNSUPPORTED])
def test_unsupported_options_are_rejected(llm, kwargs, pattern):
    params = SamplingParams(use_beam_search=True, temperature=0.0, max_tokens=2, **kwargs)
    with pytest.raises(ValueError, match=r"prompt 1: " + pattern):
        llm.generate(_token_prompts(PROMPTS[:2]), [SamplingParams(), params], use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()


def test_engine_level_beam_search_is_rejected(llm):
    params = SamplingParams(n=2, use_beam_search=True, temperature=0.0)
    with pytest.raises(ValueError, match=r"LLM\.generate / LLM\.beam_search"):
        llm.llm_engine.add_request("direct-beams", {"prompt_token_ids": [5, 6]}, params)
    assert not llm.llm_engine.has_unfinished_requests()


def test_bad_prompt_is_rejected(llm):
    with pytest.raises(ValueError, match=r"prompt 1: .*prompt_token_ids is empty"):
        llm.beam_search([{"prompt_token_ids": [5]}, {"prompt_token_ids": []}],
                        BeamSearchParams(beam_width=2, max_tokens=2))


def test_interrupted_search_frees_everything(llm, no_eos_runs, monkeypatch):
    engine = llm.llm_engine
    real_step, calls = engine.step, []

    def failing_step():
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real_step()

    monkeypatch.setattr(engine, "step", failing_step)
    params = BeamSearchParams(beam_width=W, max_tokens=T, ignore_eos=True)
    with pytest.raises(KeyboardInterrupt):
        llm.beam_search(_token_prompts(), params)
    monkeypatch.undo()
    assert not engine.has_unfinished_requests()
    # The autouse fixture checks every block is back; and the engine still searches right.
    again = llm.beam_search(_token_prompts(), params)
    assert [[s.tokens for s in o.sequences] for o in again] == [
        [s.tokens for s in o.sequences] for o in no_eos_runs[1.0]]


# ------------------------------------------------------------------------- text prompts

@pytest.fixture(scope="module")
def text_llm(tiny_dir, tmp_path_factory) -> LLM:
    folder = str(tmp_path_factory.mktemp("llama_beams_text"))
    for name in os.listdir(tiny_dir):
        shutil.copy(os.path.join(tiny_dir, name), folder)
    add_word_tokenizer(folder)
    return LLM(model=folder, dtype="float32", max_model_len=MAX_LEN)


def test_text_prompts(text_llm):
    text = "w5 w17 w300 w42"
    ids = [5, 17, 300, 42]
    assert text_llm.get_tokenizer().encode(text) == ids
    params = BeamSearchParams(beam_width=2, max_tokens=4, ignore_eos=True)
    by_text, by_ids = text_llm.beam_search([text, {"prompt_token_ids": ids}], params)
    assert [s.tokens for s in by_text.sequences] == [s.tokens for s in by_ids.sequences]
    for s in by_text.sequences:
        assert s.text == "".join(f" w{t}" for t in s.output_token_ids)
    # Width 1 is greedy: same text as a sampled greedy request.
    greedy = text_llm.generate(text, SamplingParams(temperature=0.0, max_tokens=4,
                                                    ignore_eos=True), use_tqdm=False)[0]
    out = text_llm.generate(text, SamplingParams(use_beam_search=True, temperature=0.0,
                                                 max_tokens=4, ignore_eos=True),
                            use_tqdm=False)[0]
    assert out.prompt == text and out.prompt_token_ids == ids
    assert out.outputs[0].text == greedy.outputs[0].text
    assert list(out.outputs[0].token_ids) == list(greedy.outputs[0].token_ids)
