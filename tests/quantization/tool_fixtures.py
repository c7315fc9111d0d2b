"""Committed checkpoints written by the real quantizers, each beside the reference.json that
transformers gave loading it (scripts/quant_fixtures/): finding them, reading the references,
and comparing Octavo's greedy outputs with them up to the first near-tie."""

from __future__ import annotations

import json
import os

import pytest

FIXTURES_ROOT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures")
# A reference step whose best two logprobs are closer than this is a tie that float rounding
# may break either way: the exact comparison stops there. (The references differ from Octavo
# by about 2e-6 in logprob; the smallest margin in the committed fixtures is far above this.)
TIE = 1e-4
LOGPROB_ATOL = 1e-4


def fixture_names(folder: str) -> list[str]:
    """The fixtures (subfolders with a reference.json) under ``folder``, sorted; none when the
    folder is absent."""
    if not os.path.isdir(folder):
        return []
    return sorted(n for n in os.listdir(folder)
                  if os.path.isfile(os.path.join(folder, n, "reference.json")))


def load_reference(folder: str, name: str) -> dict:
    with open(os.path.join(folder, name, "reference.json")) as f:
        return json.load(f)


def untied_steps(margins: list[float], tie: float) -> int:
    """Steps before the first one whose best two reference logprobs are closer than ``tie``
    (float rounding may break such a tie either way: the exact comparison stops there)."""
    return next((i for i, m in enumerate(margins) if m < tie), len(margins))


def assert_matches_reference(name: str, ref: dict, outs, atol: float, tie: float) -> None:
    """Greedy tokens equal and logprobs within ``atol`` of the reference's up to each prompt's
    first tie, and at least half of all steps compared."""
    steps = len(ref["tokens"][0])
    compared = 0
    for out, tokens, logprobs, margins in zip(outs, ref["tokens"], ref["logprobs"],
                                              ref["margins"], strict=True):
        got = list(out.outputs[0].token_ids)
        got_lp = [step[t].logprob for step, t in zip(out.outputs[0].logprobs, got)]
        n = min(untied_steps(margins, tie), steps)
        assert got[:n] == tokens[:n], f"{name}: prompt {out.prompt_token_ids}"
        assert got_lp[:n] == pytest.approx(logprobs[:n], abs=atol), name
        compared += n
    assert compared >= steps * len(ref["prompts"]) // 2, f"{name}: too many ties to compare"
