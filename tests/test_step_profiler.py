"""OCTAVO_PROFILE_STEPS: a window of a live engine's steps under torch.profiler, written as a
per-kernel summary by every rank (here the one CPU worker), without changing the outputs."""

from __future__ import annotations

import json

import pytest

from octavo import LLM, SamplingParams
from octavo.worker.step_profiler import summarize
from tests.tiny_models import make_checkpoint

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
PROMPTS = [{"prompt_token_ids": [3, 5, 7, 11]}, {"prompt_token_ids": [2, 4]}]


def _tokens(path):
    llm = LLM(model=path, dtype="float32", skip_tokenizer_init=True, max_model_len=64)
    try:
        return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    finally:
        llm.llm_engine.shutdown()


def test_window_writes_a_summary_and_leaves_tokens_alone(tmp_path, monkeypatch):
    path = make_checkpoint("llama", str(tmp_path / "m"))
    plain = _tokens(path)
    monkeypatch.setenv("OCTAVO_PROFILE_STEPS", "2:5")
    monkeypatch.setenv("OCTAVO_PROFILE_DIR", str(tmp_path))
    assert _tokens(path) == plain
    files = list(tmp_path.glob("profile_rank0_pid*.json"))
    assert len(files) == 1
    out = json.loads(files[0].read_text())
    assert out["steps"] == 3 and out["wall_ms"] > 0
    assert out["device_busy_ms"] == 0 and out["kernels"] == []  # no CUDA kernels on a CPU


@pytest.mark.parametrize("value", ["5", "3:2", "a:b", "-1:4"])
def test_bad_window_is_a_clear_error(monkeypatch, value):
    from octavo import envs

    monkeypatch.setenv("OCTAVO_PROFILE_STEPS", value)
    with pytest.raises(ValueError, match="OCTAVO_PROFILE_STEPS"):
        envs.profile_steps()


def test_busy_time_is_the_union_of_overlapping_kernels():
    class Range:
        def __init__(self, s, e):
            self.start, self.end = s, e

    class Ev:
        def __init__(self, name, s, e):
            import torch

            self.name, self.time_range = name, Range(s, e)
            self.device_type = torch.autograd.DeviceType.CUDA

    class Prof:
        def events(self):
            return [Ev("a", 0, 10), Ev("b", 5, 20), Ev("a", 30, 40)]

    out = summarize(Prof(), 0.05, 1)
    assert out["device_busy_ms"] == pytest.approx(0.030)
    assert out["kernels"][0] == {"name": "a", "us": 20.0, "launches": 2}
