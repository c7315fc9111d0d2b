"""The request limits as flags: --max-logprobs (vLLM's) and --max-n (at most
--max-num-seqs), from the command line to the engine's processor."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")

from octavo.engine.arg_utils import EngineArgs  # noqa: E402
from octavo.entrypoints.openai.api_server import engine_args_from, make_arg_parser  # noqa: E402


def test_flags_reach_engine_args():
    args = engine_args_from(make_arg_parser().parse_args(
        ["--max-n", "8", "--max-logprobs", "5", "--max-num-seqs", "16"]))
    assert (args.max_n, args.max_logprobs, args.max_num_seqs) == (8, 5, 16)
    cfg = args.create_engine_config()
    assert cfg.scheduler_config.sample_cap == 8 and cfg.model_config.max_logprobs == 5
    default = engine_args_from(make_arg_parser().parse_args([])).create_engine_config()
    assert default.scheduler_config.sample_cap == 256
    assert default.model_config.max_logprobs == 20


@pytest.mark.parametrize("kwargs,match", [
    ({"max_n": 300, "max_num_seqs": 256}, "max_n must be in"),
    ({"max_n": 0}, "max_n must be in"),
    ({"max_logprobs": -2}, "max_logprobs"),
])
def test_bad_limits_are_refused_at_startup(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EngineArgs(**kwargs).create_engine_config()
