"""TokenTally (a growing sequence's distinct tokens and counts, updated with the new tokens
only) and TokenSpan (a view of part of a token list), and the batched logits processing they
feed: many rows processed together equal each row processed alone."""

from __future__ import annotations

import random
from collections import Counter

import torch

from octavo import SamplingParams
from octavo.sample.logits_processors import RowCache, RowContext, apply_logits_processors
from octavo.sample.token_tally import TokenSpan, TokenTally


def _as_counter(t: TokenTally) -> Counter:
    return Counter({int(i): int(c) for i, c in zip(t.ids[:t.n], t.counts[:t.n])})


def test_tally_counts_each_steps_new_tokens_and_restarts_when_shorter():
    rng = random.Random(0)
    seq: list[int] = []
    t = TokenTally()
    for step in range(60):
        seq += [rng.randrange(40) for _ in range(rng.choice([1, 1, 3]))]
        if step == 30:
            seq = seq[:5]  # shorter than what was counted: starts over
        t.update(seq)
        assert t.upto == len(seq) and _as_counter(t) == Counter(seq)
        assert sorted(t.pos) == sorted(set(seq))
        assert all(t.ids[i] == tok for tok, i in t.pos.items())


def test_a_long_first_update_is_counted_in_bulk_and_grows_after():
    rng = random.Random(1)
    prompt = [rng.randrange(3000) for _ in range(5000)]
    t = TokenTally()
    t.update(prompt)  # > 1024 new tokens on an empty tally: np.unique
    assert _as_counter(t) == Counter(prompt)
    seq = prompt + [7, 99999, 99999]
    t.update(seq)
    assert _as_counter(t) == Counter(seq) and t.pos[99999] == t.n - 1


def test_span_is_a_sequence_view():
    seq = list(range(10))
    s = TokenSpan(seq, 3, 8)
    assert len(s) == 5 and list(s) == [3, 4, 5, 6, 7] and s[0] == 3 and s[-1] == 7
    assert s[1:3] == [4, 5] and s[-2:] == [6, 7] and s[3:] == [6, 7] and s == [3, 4, 5, 6, 7]
    seq.append(10)  # the list grows (the worker appends): the view keeps its end
    assert list(s) == [3, 4, 5, 6, 7] and len(TokenSpan(seq, 8)) == 3


def test_a_batch_equals_each_row_alone():
    """Mixed penalties, biases, allowed ids, bans and a user processor over 12 rows (some
    unprocessed), token sequences held as views of one list (the worker's) with caches kept
    over 4 steps: each step's batch equals every row processed by itself without a cache."""
    rng = random.Random(2)
    vocab, batch = 300, 12

    def user(out, row):
        return row * 0.5

    kinds = [
        SamplingParams(repetition_penalty=1.3),
        SamplingParams(frequency_penalty=0.7, presence_penalty=-0.4),
        SamplingParams(repetition_penalty=0.8, frequency_penalty=-0.2, presence_penalty=1.1,
                       logit_bias={3: 5.0, 299: -2.0, 17: 1.0}),
        SamplingParams(allowed_token_ids=list(range(0, vocab, 7)), repetition_penalty=1.1),
        SamplingParams(logits_processors=[user], presence_penalty=0.5),
        SamplingParams(bad_words=["x"]),  # bans come from bad_words_token_ids below
    ]
    seqs = {r: [rng.randrange(vocab) for _ in range(rng.randrange(1, 20))]
            for r in range(batch)}
    prompt_len = {r: len(s) for r, s in seqs.items()}
    params = {r: kinds[r % len(kinds)] for r in range(batch) if r % 4 != 3}
    caches = {r: RowCache() for r in params}
    for _ in range(4):
        for s in seqs.values():
            s.append(rng.randrange(vocab))
        logits = torch.randn(batch, vocab) * 3
        bad = {r: [[5], [seqs[r][-1], 9]] for r in params}
        rows = [RowContext.over(r, p, seqs[r], prompt_len[r], bad[r],
                                banned=[1, 2] if r == 0 else None, cache=caches[r])
                for r, p in params.items()]
        got = apply_logits_processors(logits.clone(), rows)
        for r in range(batch):
            if r not in params:
                assert torch.equal(got[r], logits[r])
                continue
            n = prompt_len[r]
            alone = apply_logits_processors(
                logits[r:r + 1].clone(),
                [RowContext(0, params[r], seqs[r][:n], seqs[r][n:], bad[r],
                            banned=[1, 2] if r == 0 else None)])[0]
            assert torch.allclose(got[r], alone, rtol=0, atol=1e-6), r
            assert got[r][5] == float("-inf") and got[r][9] == float("-inf")


def test_ids_past_the_logits_width_change_nothing_and_never_reach_the_next_row():
    """Flat indices are row * vocab + token: a token at or past the width (a tokenizer's
    added token beyond the model's logits) would land in the next row. It is skipped, as a
    ban on it is."""
    logits = torch.randn(2, 10)
    params = SamplingParams(repetition_penalty=2.0, frequency_penalty=1.0)
    got = apply_logits_processors(logits.clone(), [
        RowContext(0, params, [1, 12, 3], [15, 2], banned=[4, 11])])
    assert torch.equal(got[1], logits[1])
    want = apply_logits_processors(logits[:1].clone(), [
        RowContext(0, params, [1, 3], [2], banned=[4])])[0]
    assert torch.equal(got[0], want)
