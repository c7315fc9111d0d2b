"""benchmarks/logits_processing.py runs (small shapes) and its kept path does less work a
step than rebuilding: the cached tensors are reused, not rebuilt."""

from __future__ import annotations

import torch

from benchmarks.logits_processing import cases, per_step_ms
from octavo.sample import logits_processors


def test_the_benchmark_runs_and_the_kept_path_builds_once(monkeypatch):
    built = []
    full = torch.full
    monkeypatch.setattr(logits_processors.torch, "full",
                        lambda *a, **k: built.append(1) or full(*a, **k))
    params = cases(64)["allowed_token_ids (whole vocabulary)"]
    prompt = list(range(40))
    assert per_step_ms(params, prompt, 64, 5, True, torch.device("cpu")) > 0
    assert len(built) == 1  # the mask, once for 5 steps
    assert per_step_ms(params, prompt, 64, 5, False, torch.device("cpu")) > 0
    assert len(built) == 6  # and once a step without the cache
