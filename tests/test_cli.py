"""`octavo generate|chat` flags reach the engine arguments."""

from __future__ import annotations

import octavo.entrypoints.llm as llm_module
from octavo.entrypoints import cli


def test_engine_flags_reach_llm(monkeypatch):
    seen = {}

    class FakeLLM:
        def __init__(self, **kwargs):
            seen.update(kwargs)

    monkeypatch.setattr(llm_module, "LLM", FakeLLM)
    args = cli.build_parser().parse_args(
        ["generate", "hi", "--enforce-eager", "--preemption-mode", "swap", "--swap-space", "2",
         "--max-num-seqs", "8"])
    cli._make_llm(args)
    assert (seen["enforce_eager"], seen["preemption_mode"], seen["swap_space"],
            seen["max_num_seqs"]) == (True, "swap", 2.0, 8)
    defaults = cli.build_parser().parse_args(["chat"])
    cli._make_llm(defaults)
    assert (seen["enforce_eager"], seen["preemption_mode"]) == (False, "recompute")
