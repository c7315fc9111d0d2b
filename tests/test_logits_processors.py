"""Penalties, logit_bias, allowed_token_ids and bad_words against transformers and the OpenAI
formula, and end to end through the engine."""

from __future__ import annotations

import random

import pytest
import torch

from octavo import LLM, SamplingParams
from octavo.sample.logits_processors import (
    RowCache,
    RowContext,
    _bad_word_bans,
    apply_logits_processors,
)
from tests.tiny_models import make_checkpoint

VOCAB = 512


def _rows(logits, params, prompts, outputs):
    rows = [RowContext(i, p, pr, out) for i, (p, pr, out) in
            enumerate(zip(params, prompts, outputs))]
    return apply_logits_processors(logits.clone(), rows)


def test_a_row_cache_gives_every_step_the_same_logits():
    """The tensors kept across steps (allowed mask, logit_bias, the repetition penalty's seen
    set marked incrementally) give what building them each step gives, over growing outputs,
    a prompt-only first step, and a sequence that got shorter (rebuilt)."""
    gen = torch.Generator().manual_seed(3)
    params = SamplingParams(repetition_penalty=1.4, logit_bias={3: 2.0, 500: -5.0, 7: 1.5},
                            allowed_token_ids=list(range(0, VOCAB, 3)))
    prompt = [1, 5, 9, 300]
    cache = RowCache()
    steps = [[], [4], [4, 8], [4, 8, 8, 301], [4], [4, 8, 12, 13, 14]]  # step 4 is shorter
    for output in steps:
        logits = torch.randn(1, VOCAB, generator=gen) * 3
        fresh = apply_logits_processors(logits.clone(), [RowContext(0, params, prompt, output)])
        kept = apply_logits_processors(logits.clone(),
                                       [RowContext(0, params, prompt, output, cache=cache)])
        assert torch.equal(fresh, kept), output
        assert cache.seen.upto == len(prompt) + len(output)
        assert sorted(cache.seen.ids[:cache.seen.n].tolist()) == sorted(set(prompt + output))
    assert cache.allowed is not None and cache.bias is not None


@pytest.mark.parametrize("penalty", [0.7, 1.3, 2.0])
def test_repetition_penalty_matches_transformers(penalty):
    from transformers import RepetitionPenaltyLogitsProcessor

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, VOCAB, generator=gen) * 3
    prompts = [[1, 5, 9], [7, 7, 300], [2]]
    outputs = [[4, 5], [], [2, 2, 511]]
    ours = _rows(logits, [SamplingParams(repetition_penalty=penalty)] * 3, prompts, outputs)
    proc = RepetitionPenaltyLogitsProcessor(penalty)
    for i in range(3):
        ids = torch.tensor([prompts[i] + outputs[i]])
        ref = proc(ids, logits[i: i + 1].clone())[0]
        torch.testing.assert_close(ours[i], ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("freq,pres", [(0.5, 0.3), (-1.0, 2.0), (2.0, -2.0)])
def test_frequency_presence_match_openai_formula(freq, pres):
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(2, VOCAB, generator=gen)
    outputs = [[3, 3, 3, 8, 100], [5]]
    prompts = [[3, 4], [9]]  # the prompt does not count for OpenAI's penalties
    ours = _rows(logits, [SamplingParams(frequency_penalty=freq, presence_penalty=pres)] * 2,
                 prompts, outputs)
    for i in range(2):
        ref = logits[i].clone()
        for tok in set(outputs[i]):
            c = outputs[i].count(tok)
            ref[tok] -= c * freq + pres
        torch.testing.assert_close(ours[i], ref, atol=1e-5, rtol=0)


def test_untouched_rows_and_neutral_params():
    logits = torch.randn(2, VOCAB)
    out = _rows(logits, [SamplingParams(), SamplingParams(logit_bias={3: 2.5})],
                [[1], [1]], [[2], [2]])
    torch.testing.assert_close(out[0], logits[0])
    assert out[1, 3] == pytest.approx(logits[1, 3].item() + 2.5)


def test_allowed_token_ids_and_bans():
    logits = torch.zeros(1, VOCAB)
    out = _rows(logits, [SamplingParams(allowed_token_ids=[4, 9, 11])], [[1]], [[]])
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [4, 9, 11]
    ctx = RowContext(0, SamplingParams(), [1], [5, 6], bad_words_token_ids=[[6, 7], [8], [1, 9]],
                     banned=[2])
    out = apply_logits_processors(torch.zeros(1, VOCAB), [ctx])
    assert sorted(torch.isinf(out[0]).nonzero().flatten().tolist()) == [2, 7, 8]


def test_bad_word_prefix_matching():
    assert sorted(_bad_word_bans([1, 2, 3], [[2, 3, 4], [3, 5], [9, 6], [7]])) == [4, 5, 7]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_checkpoint("llama", str(tmp_path_factory.mktemp("llama-proc")))


@pytest.fixture(scope="module")
def llm(tiny):
    return LLM(model=tiny, dtype="float32", skip_tokenizer_init=True, max_num_seqs=8)


def test_repetition_penalty_end_to_end_matches_transformers(tiny, llm):
    from transformers import AutoModelForCausalLM

    rng = random.Random(3)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(n)] for n in (5, 12, 30)]
    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    expected = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=24, repetition_penalty=1.3, pad_token_id=0)
            expected.append(out[0, len(p):].tolist())
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True,
                            repetition_penalty=1.3)
    got = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == expected


def test_logit_bias_and_allowed_ids_end_to_end(llm):
    prompt = {"prompt_token_ids": [5, 6, 7, 8]}
    out = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True,
                                              logit_bias={77: 100.0}), use_tqdm=False)
    assert out[0].outputs[0].token_ids == [77] * 6
    allowed = [10, 20, 30]
    out = llm.generate(prompt, SamplingParams(temperature=1.0, seed=0, max_tokens=12,
                                              ignore_eos=True, allowed_token_ids=allowed),
                       use_tqdm=False)
    assert set(out[0].outputs[0].token_ids) <= set(allowed)


def test_frequency_penalty_end_to_end_reduces_repeats(llm):
    prompt = {"prompt_token_ids": [5, 6, 7, 8]}
    base = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    plain = llm.generate(prompt, base, use_tqdm=False)[0].outputs[0].token_ids
    strong = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True,
                            frequency_penalty=2.0, presence_penalty=2.0)
    penalized = llm.generate(prompt, strong, use_tqdm=False)[0].outputs[0].token_ids
    assert len(set(penalized)) > len(set(plain))


def test_out_of_vocab_bias_is_rejected(llm):
    with pytest.raises(ValueError, match="logit_bias.*99999"):
        llm.generate({"prompt_token_ids": [5]}, SamplingParams(logit_bias={99999: 1.0}),
                     use_tqdm=False)
