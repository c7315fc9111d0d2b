"""benchmarks/perplexity.py: every token scored once with its context, and Octavo's windows of
prompt_logprobs give the same scores as transformers' full forward passes (tiny random Llama
with a word-level tokenizer, float32)."""

from __future__ import annotations

import argparse

import pytest

from benchmarks import perplexity as ppl
from tests.tiny_models import add_word_tokenizer, make_checkpoint


@pytest.mark.parametrize("n,window,stride", [(2500, 1024, 512), (10, 4, 2), (9, 4, 3),
                                             (5, 8, 3), (100, 16, 1)])
def test_windows_score_each_position_once_with_context(n, window, stride):
    wins = ppl.windows(n, window, stride)
    scored = [p for b, e, first in wins for p in range(first, e)]
    assert scored == list(range(1, n))
    for i, (b, e, first) in enumerate(wins):
        assert 0 <= b < first <= e <= n and e - b <= window
        if i:
            assert first - b >= window - stride  # context before the first scored token


def test_bad_stride_is_an_error():
    for stride in (0, 4, 5):
        with pytest.raises(ValueError, match=f"--stride {stride} must be in 1..3"):
            ppl.windows(100, 4, stride)


def test_octavo_matches_transformers_on_a_tiny_model(tmp_path):
    folder = make_checkpoint("llama", str(tmp_path / "llama"))
    add_word_tokenizer(folder)
    text = " ".join(f"w{(13 * i * i + 7 * i) % 500 + 3}" for i in range(150))
    ids = ppl.tokenize(folder, None, text)
    assert len(ids) == 150
    args = argparse.Namespace(model=folder, quantization=None, dtype="float32", window=48,
                              stride=20, peer_kernels=False)
    ours, peer = ppl.octavo_run(args, ids), ppl.transformers_run(args, ids)
    assert len(ours["logprobs"]) == len(ids) - 1
    agree = ppl.agreement(ours, peer)
    assert agree["max_logprob_diff"] < 1e-4
    assert agree["top1_agreement"] == 1.0
    assert agree["greedy_identical"] == f"{ppl.GREEDY_PROMPTS}/{ppl.GREEDY_PROMPTS}"
    assert ppl.perplexity(ours["logprobs"]) == pytest.approx(ppl.perplexity(peer["logprobs"]),
                                                             rel=1e-5)
