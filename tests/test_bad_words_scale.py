"""A request with a long bad_words list (found by scripts/fuzz_server.py: 50k words in a 1 MB
body stalled the server for minutes) costs time in proportion to its length, once: the
processor's de-duplication was quadratic and ran again on the engine thread for every
sample, and every step scanned every word for every row."""

from __future__ import annotations

import random
import time
from types import SimpleNamespace

from octavo.engine.processor import Processor
from octavo.sample.logits_processors import BadWordIndex, _bad_word_bans
from octavo.sampling_params import SamplingParams


class CountingTokenizer:
    """'w<i>' -> two ids from i; a leading space adds an id in front."""

    def __init__(self) -> None:
        self.calls = 0

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.calls += 1
        i = int(text.strip()[1:])
        ids = [10 + i % 300, 10 + i // 300]
        return [5, *ids] if text.startswith(" ") else ids


def _processor(tokenizer) -> Processor:
    config = SimpleNamespace(hf_config=SimpleNamespace(vocab_size=1000), eos_token_ids=[2],
                             max_logprobs=20, max_model_len=64)
    return Processor(config, tokenizer)


def test_bad_words_tokenized_once_in_linear_time():
    tok = CountingTokenizer()
    processor = _processor(tok)
    words = [f"w{i}" for i in range(30_000)]
    params = SamplingParams(bad_words=words)
    t0 = time.perf_counter()
    req, _ = processor.process("a", [7, 8], params)
    elapsed = time.perf_counter() - t0
    assert len(req.bad_words_token_ids) == 60_000  # every word twice, no duplicates
    assert elapsed < 3.0, f"{elapsed:.1f} s for 30k bad words"  # (quadratic: over a minute)
    # The engine thread adds what a server validated, each sample again: no tokenizing.
    calls = tok.calls
    for rid in ("b", "c"):
        again, _ = processor.process(rid, [7, 8], params.clone())
        assert again.bad_words_token_ids == req.bad_words_token_ids
    assert tok.calls == calls == 60_000
    # Duplicates (a word given twice, or tokenizing like another) are dropped.
    dup, _ = processor.process("d", [7], SamplingParams(bad_words=["w1", "w1", " w1"]))
    assert dup.bad_words_token_ids == [[11, 10], [5, 11, 10]]


def test_bad_word_index_matches_a_scan():
    rng = random.Random(0)
    words = [[rng.randrange(6) for _ in range(rng.randrange(1, 4))] for _ in range(40)]
    index = BadWordIndex(words)
    for _ in range(500):
        out = [rng.randrange(6) for _ in range(rng.randrange(0, 5))]
        scan = [w[-1] for w in words if len(w) == 1 or out[-(len(w) - 1):] == w[:-1]]
        assert set(index.bans(out)) == set(scan), (out, words)
        assert sorted(_bad_word_bans(out, words)) == sorted(index.bans(out))


def test_bad_word_bans_per_step_do_not_scan_every_word():
    words = [[i % 1000, i // 1000] for i in range(200_000)] + [[7], [7]]
    index = BadWordIndex(words)
    bans = index.bans([3, 4])
    assert bans[0] == 7 and sorted(bans[1:]) == list(range(200))  # words (4, b) for each b
    t0 = time.perf_counter()
    for step in range(300):
        index.bans([1, 2, step % 1000])
    elapsed = time.perf_counter() - t0
    assert elapsed < 1.0, f"{elapsed:.2f} s for 300 steps"  # (a scan: ~10 s)
