"""FlatLogprobs (octavo/flat_logprobs.py) reads exactly as the list of dicts of Logprob it
replaces, and keeps the garbage collector's tracked objects per sequence constant."""

from __future__ import annotations

import gc
import pickle
import random

import pytest

from octavo.flat_logprobs import FlatLogprobs
from octavo.outputs import Logprob


def _dict_position(token, lp, rank, top_ids, top_lps, decode=None):
    """How the output processor built a position before: tops, then the token's own entry."""
    entry = {t: Logprob(v, r + 1, decode(t) if decode else None)
             for r, (t, v) in enumerate(zip(top_ids, top_lps))}
    entry[token] = Logprob(lp, rank, decode(token) if decode else None)
    return entry


def _random_positions(n, seed=0):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        k = rng.randint(0, 6)
        top_ids = rng.sample(range(50), k)
        top_lps = sorted((-rng.random() * 5 for _ in range(k)), reverse=True)
        # The chosen token: one of the tops (its entry replaced in place) or another.
        token = rng.choice(top_ids) if top_ids and rng.random() < 0.5 else rng.randint(50, 99)
        out.append((token, -rng.random() * 8, rng.randint(1, 100), top_ids, top_lps))
    return out


@pytest.mark.parametrize("decode", [None, lambda t: f"<{t}>"])
def test_positions_read_back_as_the_dicts_they_replace(decode):
    positions = _random_positions(300)
    flat, ref = FlatLogprobs(), []
    for p in positions:
        flat.append_position(*p, decode=decode)
        ref.append(_dict_position(*p, decode=decode))
    assert len(flat) == len(ref) == 300
    assert flat == ref and ref == list(flat)
    for i in (0, 7, 299, -1, -300):
        assert flat[i] == ref[i]
        assert list(flat[i]) == list(ref[i])  # the same key order
    # The chosen token's entry carries its own logprob and rank where it is also a top one.
    token, lp, rank, top_ids, _ = next(p for p in positions if p[0] in p[3])
    i = positions.index(next(p for p in positions if p[0] in p[3]))
    assert flat[i][token] == Logprob(lp, rank, decode(token) if decode else None)
    assert len(flat[i]) == len(top_ids)
    with pytest.raises(IndexError):
        flat[300]
    with pytest.raises(IndexError):
        flat[-301]


def test_slices_extend_add_and_none_positions():
    positions = _random_positions(40, seed=1)
    ref = [None] + [_dict_position(*p) for p in positions]
    flat = FlatLogprobs([None])
    for p in positions:
        flat.append_position(*p)
    assert flat == ref and flat[0] is None
    for sl in (slice(0, 5), slice(3, 17), slice(10, None), slice(None, None, 3),
               slice(-5, None), slice(20, 10), slice(0, 0)):
        part = flat[sl]
        assert isinstance(part, FlatLogprobs) and part == ref[sl], sl
    merged = flat[:10]
    merged.extend(flat[10:])
    assert merged == ref
    assert flat[:10] + flat[10:] == ref
    assert flat[:10] + ref[10:] == ref  # with a plain list on either side
    assert ref[:10] + flat[10:] == ref
    again = FlatLogprobs(ref)
    assert again == ref and again.nones == {0}
    assert flat != ref[:-1] and flat != "x"


def test_pickles_as_its_flat_lists():
    flat = FlatLogprobs([None])
    for p in _random_positions(50, seed=2):
        flat.append_position(*p, decode=str)
    back = pickle.loads(pickle.dumps(flat))
    assert back == flat and isinstance(back, FlatLogprobs) and back.nones == {0}
    assert repr(back) == repr(list(flat))


def test_the_garbage_collector_tracks_a_few_objects_whatever_the_length():
    """Dicts of Logprob objects: ~7 tracked objects per position; flat: a constant few."""
    def tracked(build):
        gc.collect()
        before = len(gc.get_objects())
        kept = build()
        gc.collect()
        return len(gc.get_objects()) - before, kept

    positions = _random_positions(5000, seed=3)

    def flat():
        f = FlatLogprobs()
        for p in positions:
            f.append_position(*p, decode=str)
        return f

    n_flat, _ = tracked(flat)
    n_dicts, _ = tracked(lambda: [_dict_position(*p, decode=str) for p in positions])
    assert n_flat < 20
    assert n_dicts > 5000


def test_token_strings_read_the_vocabulary_table_as_the_tokenizer_would():
    import weakref

    from octavo.engine.output_processor import _TOKEN_TABLES, token_strings

    class Tok:
        calls = 0

        def __len__(self):
            return 50

        def convert_ids_to_tokens(self, ids):
            Tok.calls += 1
            return [f"t{i}" for i in ids] if isinstance(ids, list) else f"t{ids}"

    before = len(_TOKEN_TABLES)
    tok = Tok()
    decode = token_strings(tok)
    assert len(_TOKEN_TABLES) == before + 1
    assert [decode(i) for i in (0, 7, 49)] == ["t0", "t7", "t49"]
    assert decode(50) == "t50" and decode(10**9) == "t1000000000"  # past the table: asked
    assert Tok.calls == 3  # the table once, then one call per id past it
    token_strings(tok)(3)
    assert Tok.calls == 3  # the table is kept per tokenizer
    ref = weakref.ref(tok)
    del tok, decode
    gc.collect()
    assert ref() is None and len(_TOKEN_TABLES) <= before  # no tokenizer kept alive


@pytest.mark.parametrize("first", ["flat", "list", "none"])
def test_aggregated_deltas_keep_every_position(first):
    """RequestOutput.add(aggregate=True), as a DELTA stream that fell behind merges its
    outputs: the logprobs of both deltas, in order, flat whatever the first held."""
    from octavo.outputs import CompletionOutput, RequestOutput

    positions = _random_positions(9, seed=4)
    ref = [_dict_position(*p) for p in positions]
    head = FlatLogprobs(ref[:4])
    tail = FlatLogprobs(ref[4:])
    start = {"flat": head, "list": list(head), "none": None}[first]
    a = RequestOutput("r", "p", [1], None,
                      [CompletionOutput(0, "a", [1, 2, 3, 4], -1.0, start)], False)
    b = RequestOutput("r", "p", [1], None,
                      [CompletionOutput(0, "b", [5, 6, 7, 8, 9], -2.0, tail)], True)
    a.add(b, aggregate=True)
    merged = a.outputs[0].logprobs
    assert isinstance(merged, FlatLogprobs)
    assert merged == (ref if first != "none" else ref[4:])
    assert head == ref[:4]  # the first output's own logprobs are not changed in place
