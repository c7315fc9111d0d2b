"""PenaltyRows: the penalties from counts kept where the logits are give what the host
tallies give, step after step, while the device counts the sampled tokens ahead of the host's
lists; rows are zeroed when reused and kept when the pool grows."""

from __future__ import annotations

import random

import torch

from octavo import SamplingParams
from octavo.sample.logits_processors import RowCache, RowContext, apply_logits_processors
from octavo.sample.penalty_rows import PenaltyRows

VOCAB = 300
KINDS = [dict(repetition_penalty=1.3), dict(frequency_penalty=0.7, presence_penalty=-0.4),
         dict(repetition_penalty=0.8, frequency_penalty=-0.2, presence_penalty=1.1,
              logit_bias={3: 5.0}),
         dict(temperature=0.0)]  # a row with nothing to process


def test_device_counts_match_host_tallies_with_the_host_a_step_behind():
    rng = random.Random(0)
    batch = 11  # more than the pool's first 8 rows: it grows mid-run
    params = [SamplingParams(**KINDS[r % len(KINDS)]) for r in range(batch)]
    seqs = [[rng.randrange(VOCAB + 20) for _ in range(rng.randrange(1, 30))]  # some >= vocab
            for _ in range(batch)]
    nprompt = [len(s) for s in seqs]
    pool = PenaltyRows()
    caches = [RowCache() for _ in range(batch)]
    in_flight = None  # the tokens sampled last step, not yet on the host lists
    for _ in range(6):
        logits = torch.randn(batch, VOCAB) * 3
        # The host's view lags: the last step's tokens are appended only now, after the
        # device already counted them (asynchronous scheduling).
        rows = [RowContext.over(r, params[r], seqs[r], nprompt[r], cache=caches[r])
                for r in range(batch)]
        got = apply_logits_processors(logits.clone(), rows, penalties=pool)
        if in_flight is not None:
            for s, t in zip(seqs, in_flight):
                s.append(t)
            in_flight = None
        want = apply_logits_processors(logits.clone(), [
            RowContext(r, params[r], seqs[r][:nprompt[r]], seqs[r][nprompt[r]:])
            for r in range(batch)])
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
        sampled = torch.tensor([rng.randrange(VOCAB) for _ in range(batch)])
        pool.count_sampled(sampled)
        in_flight = sampled.tolist()
    assert pool.capacity == 16 and len(pool.free) == 16 - sum(
        1 for p in params if p.repetition_penalty != 1.0 or p.frequency_penalty != 0.0)


def test_a_released_row_is_zeroed_for_its_next_request():
    pool = PenaltyRows()
    a = pool.acquire([1, 2, 3], [4, 4, 5], VOCAB, torch.device("cpu"))
    assert pool.counts[a.index, 4] == 2 and pool.prompt[a.index, 1]
    pool.release(a)
    b = pool.acquire([7], [], VOCAB, torch.device("cpu"))
    assert b.index == a.index
    assert pool.counts[b.index].sum() == 0 and pool.prompt[b.index].sum() == 1


def test_a_step_whose_sampling_never_came_is_not_counted_later():
    pool = PenaltyRows()
    params = SamplingParams(frequency_penalty=1.0)
    cache = RowCache()
    apply_logits_processors(torch.zeros(1, VOCAB), [RowContext.over(0, params, [1], 1,
                                                                    cache=cache)], None, pool)
    # The next step has no penalized row; its sampling must not count into the old row.
    apply_logits_processors(torch.zeros(1, VOCAB), [], None, pool)
    pool.count_sampled(torch.tensor([9]))
    assert pool.counts[cache.penalty.index].sum() == 0


def test_a_bounded_pool_takes_all_its_rows_at_once():
    """With max_rows (max_num_seqs) the first request takes every row: no growth, no copy
    of the rows in flight, inside a later step."""
    pool = PenaltyRows(max_rows=10)
    first = pool.acquire([1], [], VOCAB, torch.device("cpu"))
    assert pool.capacity == 10 and len(pool.free) == 9
    counts = pool.counts
    rows = [first] + [pool.acquire([1], [], VOCAB, torch.device("cpu")) for _ in range(9)]
    assert pool.counts is counts and not pool.free
    assert sorted(r.index for r in rows) == list(range(10))


def test_the_parameters_upload_keeps_each_row_16_byte_aligned(monkeypatch):
    """rep / freq / pres go up as one [3, R] tensor: R is padded to a multiple of 4 so the
    freq and pres rows start 16-byte aligned whatever the batch (Triton compiles a kernel
    again for an unaligned pointer), and the kernel sees exactly R values each."""
    import octavo.sample.penalty_rows as pr

    pool = PenaltyRows(max_rows=8)
    seen = {}

    def fake_penalize(logits, at, rows, counts, prompt, rep, freq, pres):
        seen.update(rep=rep, freq=freq, pres=pres)

    monkeypatch.setattr(pr, "penalize", fake_penalize)
    for r in (1, 3, 5, 8):
        rows = [pool.acquire([1], [], VOCAB, torch.device("cpu")) for _ in range(r)]
        pool.apply(torch.zeros(r, VOCAB), [(i, row, [], 1.1, 0.2, 0.3)
                                           for i, row in enumerate(rows)])
        for name, want in (("rep", 1.1), ("freq", 0.2), ("pres", 0.3)):
            t = seen[name]
            assert t.shape == (r,) and torch.allclose(t, torch.full((r,), want)), name
            assert t.data_ptr() % 16 == 0, (name, r)
        for row in rows:
            pool.release(row)
